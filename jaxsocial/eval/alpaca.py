"""AlpacaEval-style instruction following: pairwise judgments by a judge checkpoint.

For each instruction the model's answer (``output_2``) is compared with a reference answer
(``output_1``: the reference outputs shipped with the instruction file, e.g. AlpacaEval 2's
GPT-4 Turbo answers, or the baseline checkpoint's answers). The judge is any checkpoint the Llama
loader reads, run through our engine: it is shown both answers and we compare its teacher-forced
log-probabilities of answering "1" or "2". Each pair is judged in both orders (position bias):
agreeing orders give preference 1 or 2, disagreeing ones (or exactly equal log-probs) 1.5.

Annotations are written in alpaca_eval's format (instruction, output_1, output_2, generator_1,
generator_2, annotator, preference in {1, 1.5, 2}), so alpaca_eval's tooling can recompute its
metrics from them. We compute

    win_rate = 100 * mean(preference - 1)             (a draw counts half)

and, when given AlpacaEval's per-instruction difficulty, the length-controlled win rate of
Dubois et al. (2024): fit the logistic model

    P(output_2 preferred) = sigmoid(theta + phi * tanh(dlen / std(dlen)) + psi * difficulty)

(dlen = len(output_2) - len(output_1) in characters) to y = preference - 1, then report
100 * mean sigmoid(theta + psi * difficulty), the win rate with the length term removed.
"""

from __future__ import annotations

import csv
import json
import math
import os
from typing import Sequence

import numpy as np

JUDGE_PROMPT = (
    "Which response follows the instruction better? Judge helpfulness, correctness and "
    "instruction following; ignore which response is longer.\n\n"
    "# Instruction\n{instruction}\n\n# Response 1\n{output_1}\n\n# Response 2\n{output_2}\n\n"
    "Reply with the number of the better response, 1 or 2.")


# What an instruction file holds (named in the not-found message; no package this project
# installs ships AlpacaEval's instructions: alpaca-eval 0.6.6 loads them from the Hub).
INSTRUCTIONS_FORMAT = ("a JSON list (or JSON lines) of objects with a string \"instruction\" "
                       "and, to judge against reference answers, its \"output\" and "
                       "\"generator\": AlpacaEval's alpaca_eval.json, 805 instructions")


def load_instructions(path: str) -> list:
    """AlpacaEval's instruction file: a JSON list (or JSONL) of objects with "instruction" and
    optionally the reference "output" and its "generator". ValueError names the file when
    malformed; FileNotFoundError when absent."""
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"alpaca instruction file not found: {path} (expected: {INSTRUCTIONS_FORMAT})")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        rows = json.loads(text) if text.lstrip().startswith("[") else [
            json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: malformed JSON ({e.msg} at line {e.lineno})") from None
    if not rows:
        raise ValueError(f"{path}: no instructions")
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict) or not isinstance(row.get("instruction"), str):
            raise ValueError(f"{path}: row {n} has no string field 'instruction'")
    return rows


def load_difficulty(path: str) -> dict:
    """instruction -> difficulty, from JSON ({instruction: value} or a list of objects) or CSV,
    with columns/keys "instruction" and "instruction_difficulty"."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"alpaca difficulty file not found: {path} (expected: CSV or "
                                "JSON with columns/keys instruction, instruction_difficulty; "
                                "no PyPI package ships AlpacaEval's difficulty file)")
    try:
        if path.endswith(".csv"):
            with open(path, newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
        else:
            with open(path, encoding="utf-8") as f:
                obj = json.load(f)
            if isinstance(obj, dict):
                return {str(k): float(v) for k, v in obj.items()}
            rows = obj
        return {r["instruction"]: float(r["instruction_difficulty"]) for r in rows}
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: expected instruction -> instruction_difficulty ({e})") from None


def _chat_prompt(lm, content: str) -> str:
    return lm.apply_chat_template([{"role": "user", "content": content}])


def _requests(kind, args_list):
    from lm_eval.api.instance import Instance  # optional dependency ([eval])

    return [Instance(request_type=kind, doc={}, arguments=a, idx=i)
            for i, a in enumerate(args_list)]


def generate_outputs(lm, instructions: Sequence[str], max_gen_toks: int = 512) -> list:
    """Greedy chat answers of `lm` (a JaxSocialLM) to each instruction."""
    kwargs = {"until": [], "max_gen_toks": int(max_gen_toks), "do_sample": False}
    prompts = [(_chat_prompt(lm, ins), kwargs) for ins in instructions]
    return [o.strip() for o in lm.generate_until(_requests("generate_until", prompts),
                                                 disable_tqdm=True)]


def judge_margins(judge, instructions, outputs_1, outputs_2) -> np.ndarray:
    """log p("2") - log p("1") of the judge for each (instruction, output_1, output_2) [n]."""
    reqs = []
    for ins, a, b in zip(instructions, outputs_1, outputs_2):
        ctx = _chat_prompt(judge, JUDGE_PROMPT.format(instruction=ins, output_1=a, output_2=b))
        reqs += [(ctx, "1"), (ctx, "2")]
    ll = [x[0] for x in judge.loglikelihood(_requests("loglikelihood", reqs), disable_tqdm=True)]
    ll = np.asarray(ll, np.float64).reshape(-1, 2)
    return ll[:, 1] - ll[:, 0]


def preferences(margin_12: np.ndarray, margin_21: np.ndarray) -> np.ndarray:
    """Combine both orders: margin_12 judges (ref, model), margin_21 judges (model, ref); a
    positive margin prefers the response shown second. 2 = model better, 1 = reference better,
    1.5 = the orders disagree or tie."""
    first = np.where(margin_12 > 0, 2.0, np.where(margin_12 < 0, 1.0, 1.5))
    second = np.where(margin_21 < 0, 2.0, np.where(margin_21 > 0, 1.0, 1.5))
    return np.where(first == second, first, 1.5)


def annotate(judge, rows: Sequence[dict], outputs: Sequence[str], generator: str,
             references: Sequence[str] | None = None, reference_generator: str | None = None,
             annotator: str = "jaxsocial_judge") -> list:
    """alpaca_eval annotations comparing `outputs` (output_2) with the references (output_1;
    default: each row's "output")."""
    instructions = [r["instruction"] for r in rows]
    if references is None:
        missing = [i for i, r in enumerate(rows) if "output" not in r]
        if missing:
            raise ValueError(f"instruction rows {missing[:5]} have no reference 'output'; "
                             "pass references (e.g. the baseline checkpoint's answers)")
        references = [r["output"] for r in rows]
    if not len(references) == len(outputs) == len(rows):
        raise ValueError(f"lengths differ: {len(rows)} rows, {len(references)} references, "
                         f"{len(outputs)} outputs")
    m12 = judge_margins(judge, instructions, references, outputs)
    m21 = judge_margins(judge, instructions, outputs, references)
    prefs = preferences(m12, m21)
    out = []
    for i, row in enumerate(rows):
        out.append({
            "instruction": row["instruction"], "output_1": references[i], "output_2": outputs[i],
            "generator_1": reference_generator or row.get("generator", "reference"),
            "generator_2": generator, "annotator": annotator, "preference": float(prefs[i]),
            "raw_margins": [float(m12[i]), float(-m21[i])],
        })
    return out


def win_rate(annotations: Sequence[dict]) -> dict:
    """Raw win rate of output_2 in percent, with its standard error and the counts."""
    p = np.asarray([a["preference"] for a in annotations], np.float64)
    if p.size == 0:
        raise ValueError("no annotations")
    bad = p[(p < 1) | (p > 2) | ~np.isfinite(p)]
    if bad.size:
        raise ValueError(f"preference must be in [1, 2], got {bad[0]!r}")
    w = p - 1.0
    return {
        "win_rate": float(100 * w.mean()),
        "standard_error": float(100 * w.std(ddof=1) / math.sqrt(w.size)) if w.size > 1 else 0.0,
        "n_wins": int((p == 2).sum()), "n_draws": int((p == 1.5).sum()),
        "n_losses": int((p == 1).sum()), "n_total": int(p.size),
        "avg_length": float(np.mean([len(a["output_2"]) for a in annotations])),
    }


def _fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-4, iters: int = 100) -> np.ndarray:
    """argmin_w  -sum[y log s(xw) + (1-y) log(1-s(xw))] + l2/2 |w|^2 by Newton's method."""
    w = np.zeros(x.shape[1])
    for _ in range(iters):
        s = 1.0 / (1.0 + np.exp(-(x @ w)))
        grad = x.T @ (s - y) + l2 * w
        hess = (x * (s * (1 - s))[:, None]).T @ x + l2 * np.eye(x.shape[1])
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    return w


def length_controlled_win_rate(annotations: Sequence[dict], difficulty: dict,
                               l2: float = 1e-4) -> float:
    """Length-controlled win rate (percent) of output_2; see the module docstring."""
    missing = [a["instruction"] for a in annotations if a["instruction"] not in difficulty]
    if missing:
        raise ValueError(f"difficulty file has no entry for instruction {missing[0][:80]!r}")
    y = np.asarray([a["preference"] - 1.0 for a in annotations], np.float64)
    dlen = np.asarray([len(a["output_2"]) - len(a["output_1"]) for a in annotations], np.float64)
    std = dlen.std()
    length = np.tanh(dlen / std) if std > 0 else np.zeros_like(dlen)
    gamma = np.asarray([difficulty[a["instruction"]] for a in annotations], np.float64)
    x = np.stack([np.ones_like(y), length, gamma], axis=1)
    theta, _, psi = _fit_logistic(x, y, l2)
    return float(100 * np.mean(1.0 / (1.0 + np.exp(-(theta + psi * gamma)))))
