"""`lm_eval` with the jaxsocial model registered, plus offline task materialization.

    python -m jaxsocial.eval --model jaxsocial --model_args checkpoint=DIR \
        --tasks jaxsocial_humaneval --include_path TASK_DIR --confirm_run_unsafe_code
    python -m jaxsocial.eval materialize --tasks humaneval,mbpp --data_dir DATA --out TASK_DIR

(The stock `lm_eval` command has no plugin hook, so it cannot see `--model jaxsocial`.)
"""

import argparse
import sys


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["materialize"]:
        from jaxsocial.eval import offline_tasks

        p = argparse.ArgumentParser(prog="python -m jaxsocial.eval materialize")
        p.add_argument("--tasks", required=True,
                       help="comma list: " + ",".join(offline_tasks.TASKS))
        p.add_argument("--data_dir", default=None)
        p.add_argument("--out", required=True)
        a = p.parse_args(argv[1:])
        names, path = offline_tasks.materialize(a.tasks.split(","), a.data_dir, a.out)
        print(f"--include_path {path} --tasks {','.join(names)}")
        return
    from lm_eval.__main__ import cli_evaluate

    register_models()
    sys.argv = ["lm_eval"] + argv
    cli_evaluate()


def register_models() -> None:
    """lm-eval's own models (hf, vllm, ...) and "jaxsocial", all usable by name."""
    import lm_eval.models  # noqa: F401  (lm-eval registers its models on this import)

    import jaxsocial.eval.lm_eval_model  # noqa: F401  (registers "jaxsocial")


if __name__ == "__main__":
    main()
