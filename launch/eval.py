"""Evaluate a trained checkpoint against its base, side by side, offline.

    python launch/eval.py --checkpoint=runs/social/ckpt --baseline=meta-llama-3.2-1b \
        --tasks=humaneval,mbpp,bbh,math,alpaca --data_dir=~/eval_data --judge=JUDGE_DIR \
        --output=runs/social/eval/results.json   # default: beside the checkpoint

Code, reasoning and math benchmarks run through lm-evaluation-harness with our engine
(`jaxsocial.eval.lm_eval_model`) and the offline task configs (`jaxsocial.eval.offline_tasks`);
code is executed in `jaxsocial.eval.sandbox`. AlpacaEval-style instruction following uses
`jaxsocial.eval.alpaca` with a judge checkpoint. Writes one JSON with every score, lm-eval's
per-sample records and the alpaca annotations, and prints the table:

    benchmark     base   trained   change
    HumanEval     62.20    65.24    +3.04
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import time

from absl import app, flags, logging

from jaxsocial import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Command-line flags (defined only when run as a script, so importing is side-effect free)."""
    flags.DEFINE_string("checkpoint", None, "Trained checkpoint (Hugging Face-format directory).")
    flags.DEFINE_string("baseline", None, "Base checkpoint to compare against (default: for a "
                        "run's export/, the run's initial policy, <workdir>/initial).")
    flags.DEFINE_list("tasks", ["humaneval", "mbpp", "bbh", "math", "alpaca"],
                      "Benchmarks: humaneval, humaneval_pass10, mbpp, bbh, math (gsm8k-cot), "
                      "alpaca.")
    flags.DEFINE_string("data_dir", None, "Local datasets (see docs/eval.md for the layout).")
    flags.DEFINE_string("output", None, "Results JSON path (default: eval_<name>/results.json "
                        "next to the --checkpoint directory, e.g. runs/demo/eval_export/).")
    flags.DEFINE_integer("limit", None, "Evaluate only the first N examples of each task (smoke).")
    flags.DEFINE_integer("batch_size", 8, "Rows per compiled call.")
    flags.DEFINE_integer("max_gen_toks", None, "Override every task's generation length.")
    flags.DEFINE_string("dtype", "float32", "Compute dtype for the checkpoints.")
    flags.DEFINE_integer("seed", 0, "Seed for sampled generation.")
    flags.DEFINE_bool("apply_chat_template", False,
                      "Format lm-eval prompts with the chat template.")
    flags.DEFINE_float("sandbox_timeout", 10.0, "Seconds per program for code tasks.")
    flags.DEFINE_integer("sandbox_memory_mb", 1024, "Memory per program for code tasks.")
    flags.DEFINE_string("judge", None, "Judge checkpoint for alpaca (any Llama the loader reads).")
    flags.DEFINE_string("alpaca_file", None,
                        "alpaca_eval.json (default: <data_dir>/alpaca_eval/alpaca_eval.json).")
    flags.DEFINE_string("alpaca_difficulty", None,
                        "Instruction difficulty file; enables the length-controlled win rate.")
    flags.DEFINE_enum("alpaca_reference", "file", ["file", "baseline"],
                      "Compare against the file's reference outputs, or against the baseline's.")
    flags.DEFINE_integer("alpaca_max_gen_toks", 512, "Answer length for alpaca instructions.")


# benchmark -> (lm-eval result key, metric key, display name)
HEADLINE = {
    "humaneval": ("jaxsocial_humaneval", "pass_at_1,sandbox", "HumanEval (pass@1)"),
    "humaneval_pass10": ("jaxsocial_humaneval_pass10", "pass_at_10,sandbox",
                         "HumanEval (pass@10)"),
    "mbpp": ("jaxsocial_mbpp", "pass_at_1,sandbox", "MBPP (pass@1)"),
    "bbh": ("jaxsocial_bbh_cot_fewshot", "exact_match,get-answer", "BBH (3-shot CoT)"),
    "math": ("jaxsocial_gsm8k_cot", "exact_match,strict-match", "Math (GSM8K 8-shot CoT)"),
    "gsm8k": ("jaxsocial_gsm8k_cot", "exact_match,strict-match", "GSM8K (8-shot CoT)"),
}


def format_table(rows) -> str:
    """rows: [(benchmark, base or None, trained)] in percent -> the blog-style text table."""
    width = max([len("benchmark")] + [len(r[0]) for r in rows])
    lines = [f"{'benchmark':<{width}}  {'base':>7}  {'trained':>7}  {'change':>7}"]
    for name, base, trained in rows:
        b = "-" if base is None else f"{base:.2f}"
        t = "-" if trained is None else f"{trained:.2f}"
        d = "-" if base is None or trained is None else f"{trained - base:+.2f}"
        lines.append(f"{name:<{width}}  {b:>7}  {t:>7}  {d:>7}")
    return "\n".join(lines)


def headline_scores(results: dict, tasks) -> dict:
    """lm-eval results -> {benchmark: percent}."""
    out = {}
    for task in tasks:
        if task in HEADLINE:
            name, metric, _ = HEADLINE[task]
            value = results.get(name, {}).get(metric)
            out[task] = None if value is None else 100.0 * float(value)
    return out


def run_lm_eval(lm, names, task_manager, flags_):
    import lm_eval

    gen_kwargs = {"max_gen_toks": flags_.max_gen_toks} if flags_.max_gen_toks else None
    return lm_eval.simple_evaluate(
        model=lm, tasks=names, task_manager=task_manager,
        limit=flags_.limit, log_samples=True, gen_kwargs=gen_kwargs, bootstrap_iters=0,
        apply_chat_template=flags_.apply_chat_template, confirm_run_unsafe_code=True,
        random_seed=flags_.seed)


def default_output(checkpoint: str) -> str:
    """eval_<name>/results.json next to the checkpoint directory (runs/demo/export ->
    runs/demo/eval_export/results.json): outputs stay beside what they evaluate."""
    ckpt = os.path.abspath(checkpoint.rstrip(os.sep))
    return os.path.join(os.path.dirname(ckpt), f"eval_{os.path.basename(ckpt)}", "results.json")


def initial_policy(checkpoint: str):
    """A run's export (`<workdir>/export`) is compared with the run's initial policy
    (`<workdir>/initial`, written beside it by launch/train.py) unless --baseline says
    otherwise; None for a checkpoint that is not a run's export."""
    ckpt = os.path.abspath(checkpoint.rstrip(os.sep))
    initial = os.path.join(os.path.dirname(ckpt), "initial")
    if os.path.basename(ckpt) == "export" and os.path.isfile(os.path.join(initial,
                                                                          "config.json")):
        return initial
    return None


def check_checkpoint(path: str, flag: str) -> None:
    """Raise ValueError naming `--flag=path` unless `path` is a checkpoint directory the engine
    can load: a Hugging Face directory (config.json) or a directory holding one `.gguf` file.
    Cheap: nothing is read but the directory listing."""
    from jaxsocial.models import gguf

    if not os.path.exists(path):
        raise ValueError(f"--{flag}={path}: no such directory")
    if not os.path.isdir(path):
        raise ValueError(f"--{flag}={path} is not a directory (give a Hugging Face checkpoint "
                         f"directory: config.json, *.safetensors, tokenizer files)")
    if os.path.isfile(os.path.join(path, "config.json")) or gguf.find_gguf(path):
        return
    hint = (" (a run writes export/ when it finishes: did the run end early?)"
            if os.path.basename(os.path.abspath(path)) == "export" else "")
    raise ValueError(f"--{flag}={path}: no config.json in this directory, so it is not a "
                     f"Hugging Face checkpoint (nor a directory holding one .gguf file){hint}")


def check_counts(flags_) -> None:
    """Raise ValueError naming the first count flag that is not positive (--limit,
    --batch_size, --max_gen_toks, --alpaca_max_gen_toks, the sandbox limits)."""
    positive = [("limit", "leave it unset to evaluate every example"),
                ("batch_size", None), ("max_gen_toks", "leave it unset for each task's own"),
                ("alpaca_max_gen_toks", None)]
    for name, unset in positive:
        value = getattr(flags_, name, None)
        if value is None and unset:
            continue
        if value is None or isinstance(value, bool) or int(value) != value or value < 1:
            extra = f"; {unset}" if unset else ""
            raise ValueError(f"--{name}={value} must be an integer >= 1{extra}")
    for name in ("sandbox_timeout", "sandbox_memory_mb"):
        value = getattr(flags_, name, None)
        if value is not None and not value > 0:
            raise ValueError(f"--{name}={value} must be > 0")


def check_inputs(flags_) -> None:
    """Raise ValueError naming the first bad flag value, before anything is loaded or written:
    the counts (`check_counts`) and the checkpoint directories (--checkpoint, and --baseline /
    --judge when given)."""
    check_counts(flags_)
    if not flags_.checkpoint:
        raise ValueError("--checkpoint is required (a Hugging Face checkpoint directory, e.g. "
                         "a run's export/)")
    check_checkpoint(flags_.checkpoint, "checkpoint")
    for name in ("baseline", "judge"):
        if getattr(flags_, name, None):
            check_checkpoint(getattr(flags_, name), name)


def quiet_console_logs() -> None:
    """Only warnings and errors of the libraries (lm-eval, datasets, ...) on the console: their
    INFO lines (task building, dataset caching) drown the table this script prints."""
    import logging as py_logging

    logging.set_verbosity(logging.WARNING)
    for name in ("lm-eval", "lm_eval", "datasets", "filelock", "httpx", "urllib3"):
        py_logging.getLogger(name).setLevel(py_logging.WARNING)


def evaluate(flags_) -> dict:
    """Evaluate `flags_.checkpoint` (and its baseline) on `flags_.tasks`; writes and returns
    the report. Raises ValueError for a bad count (`check_counts`) or checkpoint directory
    (`check_checkpoint`) before loading any model."""
    check_counts(flags_)
    if not flags_.output:
        flags_.output = default_output(flags_.checkpoint)
    out_dir = os.path.splitext(os.path.abspath(flags_.output))[0] + "_tasks"
    # A failed evaluation leaves behind none of the directories it made (the task configs'
    # and the results' own), only those that were there before.
    made, d = [], out_dir
    while d and not os.path.exists(d):
        made.append(d)
        d = os.path.dirname(d)
    try:
        return _evaluate(flags_, out_dir)
    except BaseException:
        if made:
            shutil.rmtree(made[-1], ignore_errors=True)
        raise


def _evaluate(flags_, out_dir: str) -> dict:
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import handle_non_serializable

    from jaxsocial.eval import alpaca, code_metrics, offline_tasks
    from jaxsocial.eval.lm_eval_model import JaxSocialLM

    tasks = [t.strip() for t in flags_.tasks if t.strip()]
    harness_tasks = [t for t in tasks if t != "alpaca"]
    code_metrics.configure(timeout_s=flags_.sandbox_timeout, memory_mb=flags_.sandbox_memory_mb)
    # Evaluate what can be had: a task whose data is missing is skipped with the reason (the
    # file it needs and where to get it); malformed data is still an error.
    skipped, names = {}, []
    for task in list(harness_tasks):
        try:
            names += offline_tasks.materialize([task], flags_.data_dir, out_dir)[0]
        except FileNotFoundError as e:
            skipped[task] = str(e)
            harness_tasks.remove(task)
    rows = difficulty = None
    if "alpaca" in tasks:  # check every input before spending compute
        path = flags_.alpaca_file or os.path.join(flags_.data_dir or ".", "alpaca_eval",
                                                  "alpaca_eval.json")
        if not flags_.judge:
            skipped["alpaca"] = "needs --judge=DIR (a judge checkpoint)"
        elif not os.path.isfile(path):
            skipped["alpaca"] = (f"alpaca data file not found: {path} (give --alpaca_file or "
                                 f"--data_dir; expected: {alpaca.INSTRUCTIONS_FORMAT})")
    tasks = [t for t in tasks if t not in skipped]
    if not tasks:
        raise ValueError("nothing to evaluate: " + "; ".join(f"{t}: {why}"
                                                              for t, why in skipped.items()))
    for task, why in skipped.items():
        logging.warning("skipping %s: %s", task, why)
    # Our YAMLs include lm-eval's by path, so its 10k-file task index is not needed.
    task_manager = TaskManager(include_path=out_dir, include_defaults=False)
    if "alpaca" in tasks:
        rows = alpaca.load_instructions(path)
        if flags_.limit:
            rows = rows[:flags_.limit]
        if flags_.alpaca_difficulty:
            difficulty = alpaca.load_difficulty(flags_.alpaca_difficulty)
        if flags_.alpaca_reference == "baseline" and not flags_.baseline:
            raise ValueError("--alpaca_reference=baseline needs --baseline")

    if flags_.baseline is None:
        flags_.baseline = initial_policy(flags_.checkpoint)
    checkpoints = [("base", flags_.baseline), ("trained", flags_.checkpoint)]
    checkpoints = [(k, p) for k, p in checkpoints if p]
    for role, path in checkpoints + ([("judge", flags_.judge)] if rows is not None else []):
        check_checkpoint(path, {"base": "baseline", "trained": "checkpoint"}.get(role, role))
    report = {"tasks": tasks, "skipped": skipped, "flags": {k: getattr(flags_, k) for k in (
        "checkpoint", "baseline", "data_dir", "limit", "max_gen_toks", "judge",
        "alpaca_reference", "apply_chat_template", "seed")}, "scores": {}, "lm_eval": {},
        "alpaca_outputs": {}}
    for role, path in checkpoints:
        t0 = time.time()
        lm = JaxSocialLM(checkpoint=path, batch_size=flags_.batch_size, dtype=flags_.dtype,
                         seed=flags_.seed)
        scores = {}
        if names:
            res = run_lm_eval(lm, names, task_manager, flags_)
            report["lm_eval"][role] = res
            scores.update(headline_scores(res["results"], harness_tasks))
        if rows is not None:
            report["alpaca_outputs"][role] = alpaca.generate_outputs(
                lm, [r["instruction"] for r in rows], flags_.alpaca_max_gen_toks)
        report["scores"][role] = scores
        logging.info("evaluated %s (%s) in %.1fs", role, path, time.time() - t0)
        del lm
        gc.collect()

    if rows is not None:
        judge = JaxSocialLM(checkpoint=flags_.judge, batch_size=flags_.batch_size,
                            dtype=flags_.dtype)
        report["alpaca"] = {}
        for role, _ in checkpoints:
            if flags_.alpaca_reference == "baseline":
                if role == "base":
                    report["scores"][role]["alpaca"] = 50.0  # itself, by definition
                    continue
                refs, ref_gen = report["alpaca_outputs"]["base"], flags_.baseline
            else:
                refs, ref_gen = None, None
            ann = alpaca.annotate(judge, rows, report["alpaca_outputs"][role],
                                  generator=f"{role}:{dict(checkpoints)[role]}", references=refs,
                                  reference_generator=ref_gen,
                                  annotator=f"jaxsocial_judge:{flags_.judge}")
            metrics = alpaca.win_rate(ann)
            if difficulty is not None:
                metrics["length_controlled_winrate"] = alpaca.length_controlled_win_rate(
                    ann, difficulty)
            report["alpaca"][role] = {"metrics": metrics, "annotations": ann}
            report["scores"][role]["alpaca"] = metrics.get("length_controlled_winrate",
                                                           metrics["win_rate"])
        del judge

    table = []
    for task in tasks:
        name = ("AlpacaEval (LC win rate)" if difficulty is not None else "AlpacaEval (win rate)"
                ) if task == "alpaca" else HEADLINE[task][2]
        base = report["scores"].get("base", {}).get(task)
        trained = report["scores"].get("trained", {}).get(task)
        table.append((name, base, trained))
    report["table"] = [{"benchmark": n, "base": b, "trained": t,
                        "change": None if b is None or t is None else t - b}
                       for n, b, t in table]
    report["table_text"] = format_table(table)
    os.makedirs(os.path.dirname(os.path.abspath(flags_.output)), exist_ok=True)
    with open(flags_.output, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, default=handle_non_serializable, ensure_ascii=False)
    return report


def _one_line(text, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def main(argv):
    """Check the flags, evaluate, print the table. A bad input or a failed run is one line,
    `error: ...`, on stderr and exit status 1."""
    del argv
    quiet_console_logs()
    try:
        check_inputs(FLAGS)
        report = evaluate(FLAGS)
    except (ValueError, OSError) as e:
        sys.stderr.write(f"error: {_one_line(e)}\n")
        sys.exit(1)
    for task, why in report["skipped"].items():
        print(f"skipped {task}: {why}")
    if FLAGS.baseline:
        print(f"baseline: {FLAGS.baseline}")
    print(report["table_text"])
    print(f"results: {os.path.abspath(FLAGS.output)}")


if __name__ == "__main__":
    define_flags()
    app.run(main, flags_parser=cli.parse_flags)
