"""`lm_eval` with the jaxsocial model registered, plus offline task materialization.

    python -m jaxsocial.eval --model jaxsocial --model_args checkpoint=DIR \
        --tasks jaxsocial_humaneval --include_path TASK_DIR --confirm_run_unsafe_code
    python -m jaxsocial.eval materialize --tasks humaneval,mbpp --data_dir DATA --out TASK_DIR

(The stock `lm_eval` command has no plugin hook, so it cannot see `--model jaxsocial`.)

A bad input (an unknown task, missing data, a `--limit` of 0 or less, a checkpoint directory
that is not one) is one line, `error: ...`, on stderr and exit status 1.
"""

import argparse
import os
import shutil
import sys


def _fail(e: BaseException) -> None:
    sys.stderr.write(f"error: {' '.join(str(e).split())}\n")
    raise SystemExit(1)


def check_limit(argv) -> None:
    """ValueError for a `--limit` of 0 or less (lm-eval reads 0 as "no limit" and a negative
    value fails deep inside a task); a value below 1 is lm-eval's fraction of each task."""
    for i, arg in enumerate(argv):
        if arg == "--limit" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--limit="):
            value = arg.split("=", 1)[1]
        else:
            continue
        try:
            ok = float(value) > 0
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"--limit={value} must be a number > 0 (examples per task, or a "
                             f"fraction of each task below 1)")


def main(argv=None) -> None:
    """`materialize` writes the offline task configs; anything else is lm-eval's command line
    with the jaxsocial model registered."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["materialize"]:
        from jaxsocial.eval import offline_tasks

        p = argparse.ArgumentParser(prog="python -m jaxsocial.eval materialize")
        p.add_argument("--tasks", required=True,
                       help="comma list: " + ",".join(offline_tasks.TASKS))
        p.add_argument("--data_dir", default=None)
        p.add_argument("--out", required=True)
        a = p.parse_args(argv[1:])
        existed = os.path.exists(a.out)
        try:
            names, path = offline_tasks.materialize(a.tasks.split(","), a.data_dir, a.out)
        except (ValueError, OSError) as e:
            if not existed:  # this call made it: leave no half-written task directory
                shutil.rmtree(a.out, ignore_errors=True)
            _fail(e)
        print(f"--include_path {path} --tasks {','.join(names)}")
        return
    try:
        check_limit(argv)
    except ValueError as e:
        _fail(e)
    from lm_eval.__main__ import cli_evaluate

    register_models()
    sys.argv = ["lm_eval"] + argv
    try:
        cli_evaluate()
    except (ValueError, OSError) as e:  # a bad task name, checkpoint or data file: one line
        _fail(e)


def register_models() -> None:
    """lm-eval's own models (hf, vllm, ...) and "jaxsocial", all usable by name."""
    import lm_eval.models  # noqa: F401  (lm-eval registers its models on this import)

    import jaxsocial.eval.lm_eval_model  # noqa: F401  (registers "jaxsocial")


if __name__ == "__main__":
    main()
