"""AlpacaEval-style judging: preference combination, alpaca_eval annotation format, raw and
length-controlled win rates against independent computations."""

import json
import os

import numpy as np
import pytest

from jaxsocial.eval import alpaca

DATA = os.path.join(os.path.dirname(__file__), "fixtures", "eval", "data", "alpaca_eval")


def test_win_rate_counts_draws_half():
    ann = [{"preference": p, "output_2": "x" * n} for p, n in [(2, 1), (1, 2), (1.5, 3), (2, 4)]]
    m = alpaca.win_rate(ann)
    assert m["win_rate"] == pytest.approx(100 * (1 + 0 + 0.5 + 1) / 4)
    assert (m["n_wins"], m["n_draws"], m["n_losses"], m["n_total"]) == (2, 1, 1, 4)
    assert m["standard_error"] == pytest.approx(100 * np.std([1, 0, .5, 1], ddof=1) / 2)
    assert m["avg_length"] == 2.5
    with pytest.raises(ValueError, match="preference must be in"):
        alpaca.win_rate([{"preference": 3.0, "output_2": ""}])


def test_preferences_need_both_orders_to_agree():
    # margin_12: judge shown (reference, model), >0 prefers model; margin_21: (model, reference).
    m12 = np.array([1.0, 1.0, -1.0, -1.0, 0.0])
    m21 = np.array([-1.0, 1.0, 1.0, -1.0, -1.0])
    np.testing.assert_array_equal(alpaca.preferences(m12, m21), [2, 1.5, 1, 1.5, 1.5])


class ScriptedJudge:
    """Prefers the response containing 'GOOD' by 3 nats; records what it was asked."""

    def __init__(self):
        self.prompts = []

    def apply_chat_template(self, history, add_generation_prompt=True):
        return "<chat>" + history[0]["content"]

    def loglikelihood(self, requests, disable_tqdm=False):
        out = []
        for r in requests:
            ctx, cont = r.args
            self.prompts.append(ctx)
            r1 = ctx.split("# Response 1\n")[1].split("# Response 2")[0]
            r2 = ctx.split("# Response 2\n")[1]
            good = "1" if "GOOD" in r1 else "2" if "GOOD" in r2 else None
            out.append((-1.0 if good == cont else -4.0 if good else -2.0, False))
        return out


def test_annotate_writes_alpaca_eval_format():
    pytest.importorskip("lm_eval")
    rows = alpaca.load_instructions(os.path.join(DATA, "alpaca_eval.json"))
    outputs = ["GOOD answer", "meh", "meh too"]
    rows[1]["output"] = "GOOD reference"
    judge = ScriptedJudge()
    ann = alpaca.annotate(judge, rows, outputs, generator="trained", annotator="j")
    assert [a["preference"] for a in ann] == [2.0, 1.0, 1.5]
    assert set(ann[0]) >= {"instruction", "output_1", "output_2", "generator_1", "generator_2",
                           "annotator", "preference"}
    assert ann[0]["generator_1"] == "reference_model" and ann[0]["generator_2"] == "trained"
    assert ann[0]["output_1"] == rows[0]["output"] and ann[0]["output_2"] == "GOOD answer"
    assert len(judge.prompts) == 12  # 3 pairs x 2 orders x 2 answers
    json.dumps(ann)
    assert alpaca.win_rate(ann)["win_rate"] == pytest.approx(100 * 1.5 / 3)


def test_length_controlled_recovers_the_model():
    # Data drawn from the LC model itself: the fit must recover its length-free win rate.
    rng = np.random.default_rng(0)
    n = 6000
    gamma = rng.normal(size=n)
    dlen = rng.normal(loc=300, scale=300, size=n)  # the model writes longer answers
    theta, phi, psi = 0.3, 1.5, -0.8
    p = 1 / (1 + np.exp(-(theta + phi * np.tanh(dlen / dlen.std()) + psi * gamma)))
    y = rng.random(n) < p
    ann = [{"instruction": f"i{k}", "output_1": "a" * 1000,
            "output_2": "a" * int(1000 + dlen[k]), "preference": 2.0 if y[k] else 1.0}
           for k in range(n)]
    diff = {f"i{k}": float(gamma[k]) for k in range(n)}
    lc = alpaca.length_controlled_win_rate(ann, diff)
    truth = 100 * np.mean(1 / (1 + np.exp(-(theta + psi * gamma))))
    assert lc == pytest.approx(truth, abs=2.0)
    # Longer answers win more here, so the raw win rate overstates the length-free one.
    assert alpaca.win_rate(ann)["win_rate"] > truth + 10


def test_length_controlled_matches_scipy_fit():
    scipy_opt = pytest.importorskip("scipy.optimize")
    rng = np.random.default_rng(1)
    n = 200
    prefs = rng.choice([1.0, 1.5, 2.0], size=n)
    ann = [{"instruction": f"i{k}", "output_1": "r" * int(rng.integers(5, 300)),
            "output_2": "m" * int(rng.integers(5, 300)), "preference": float(prefs[k])}
           for k in range(n)]
    diff = {f"i{k}": float(rng.normal()) for k in range(n)}
    lc = alpaca.length_controlled_win_rate(ann, diff, l2=1e-4)
    y = prefs - 1
    d = np.array([len(a["output_2"]) - len(a["output_1"]) for a in ann], float)
    g = np.array([diff[a["instruction"]] for a in ann])
    x = np.stack([np.ones(n), np.tanh(d / d.std()), g], 1)

    def nll(w):
        z = x @ w
        return np.sum(np.logaddexp(0, z) - y * z) + 0.5e-4 * w @ w

    w = scipy_opt.minimize(nll, np.zeros(3), method="BFGS", options={"gtol": 1e-10}).x
    assert lc == pytest.approx(100 * np.mean(1 / (1 + np.exp(-(w[0] + w[2] * g)))), abs=1e-4)


def test_input_files(tmp_path):
    rows = alpaca.load_instructions(os.path.join(DATA, "alpaca_eval.json"))
    assert len(rows) == 3 and rows[0]["instruction"] == "Name a primary colour."
    d = alpaca.load_difficulty(os.path.join(DATA, "instruction_difficulty.csv"))
    assert d["What is two plus two?"] == 0.7
    with pytest.raises(FileNotFoundError, match="nope.json"):
        alpaca.load_instructions(str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('[{"instruction": "a"}, {"output": "no instruction"}]')
    with pytest.raises(ValueError, match=f"{bad}: row 2 has no string field 'instruction'"):
        alpaca.load_instructions(str(bad))
    bad.write_text('[{"instruction": "a"')
    with pytest.raises(ValueError, match="bad.json: malformed JSON"):
        alpaca.load_instructions(str(bad))
    with pytest.raises(ValueError, match="no entry for instruction 'zzz'"):
        alpaca.length_controlled_win_rate(
            [{"instruction": "zzz", "output_1": "", "output_2": "", "preference": 1.0}], d)
