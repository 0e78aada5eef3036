"""Reading a run's trajectory dataset (`train.dataset=True`; `jaxsocial.train.dataset` writes
it): episodes, preference pairs and SFT rows. TFDS reads it without TensorFlow
(`tfds.builder_from_directory(...).as_data_source()`); `pip install -e '.[tfds]'`.

    from jaxsocial import datasets
    for ep in datasets.episodes("runs/smol_study/trained-seed0"):
        ep["agent"], ep["epoch"], ep["steps"][0]["action"]["text"], ep["steps"][0]["reward"]
    pairs = datasets.preference_pairs(W)   # most- vs least-liked post, same agent and epoch
    rows = datasets.sft_rows(W, min_likes=5)
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np

from jaxsocial.train import dataset as dataset_lib

POST_TYPES = ("create_post", "quote_post")


def _plain(x: Any) -> Any:
    """TFDS's numpy values -> Python: bytes -> str, numpy scalars -> numbers; arrays stay."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, bytes):
        return x.decode("utf-8")
    if isinstance(x, np.generic):
        return x.item()
    return x


def load(workdir: str, epoch: int):
    """The TFDS data source of one epoch's episodes (random access, `len`)."""
    import tensorflow_datasets as tfds

    path = dataset_lib.epochs(workdir).get(epoch)
    if path is None:
        raise FileNotFoundError(
            f"{workdir}: no trajectory dataset of epoch {epoch} (have: "
            f"{sorted(dataset_lib.epochs(workdir)) or 'none; run with train.dataset=True'})")
    return tfds.builder_from_directory(path).as_data_source()["train"]


def episodes(workdir: str, epochs: Optional[Sequence[int]] = None) -> Iterator[Dict[str, Any]]:
    """Every episode of the run (or of `epochs`), epoch by epoch, agents in order: {"agent",
    "persona", "cohort", "epoch", "seed", "steps": [step, ...]}, each step as the writer's
    features (`jaxsocial.train.dataset.features`) with text as str; token ids keep their
    padding (`prompt_length`, `length` say how many are real)."""
    have = dataset_lib.epochs(workdir)
    for e in (sorted(have) if epochs is None else epochs):
        source = load(workdir, e)
        for i in range(len(source)):
            ep = source[i]
            steps = ep.pop("steps")
            out = _plain(ep)
            out["steps"] = [_plain(steps[j]) for j in range(len(steps))]
            yield out


def post_steps(ep: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The steps of an episode (`episodes`) that created a post (create_post / quote_post)."""
    return [s for s in ep["steps"] if s["action"]["type"] in POST_TYPES
            and s["action"]["created_id"] >= 0]


def preference_pairs(workdir: str, epochs: Optional[Sequence[int]] = None
                     ) -> List[Dict[str, Any]]:
    """For every agent and epoch with two posts of different likes: its most-liked post
    ("chosen", the earliest of ties) and its least-liked ("rejected", the earliest of ties),
    each with the prompt it answered: {"agent", "epoch", "prompt", "chosen", "rejected",
    "chosen_prompt", "rejected_prompt", "chosen_likes", "rejected_likes"} ("prompt" is the
    chosen one's)."""
    out = []
    for ep in episodes(workdir, epochs):
        posts = post_steps(ep)
        if len(posts) < 2:
            continue
        likes = [s["engagement"]["like"] for s in posts]
        hi, lo = int(np.argmax(likes)), int(np.argmin(likes))
        if likes[hi] == likes[lo]:
            continue
        out.append({"agent": ep["agent"], "epoch": ep["epoch"],
                    "prompt": posts[hi]["observation"]["prompt"],
                    "chosen": posts[hi]["action"]["text"],
                    "rejected": posts[lo]["action"]["text"],
                    "chosen_prompt": posts[hi]["observation"]["prompt"],
                    "rejected_prompt": posts[lo]["observation"]["prompt"],
                    "chosen_likes": likes[hi], "rejected_likes": likes[lo]})
    return out


def sft_rows(workdir: str, min_likes: int = 1, epochs: Optional[Sequence[int]] = None
             ) -> List[Dict[str, Any]]:
    """Prompt -> answer rows of the posts that drew at least `min_likes` likes: {"agent",
    "epoch", "prompt", "completion", "likes"}."""
    return [{"agent": ep["agent"], "epoch": ep["epoch"], "prompt": s["observation"]["prompt"],
             "completion": s["action"]["text"], "likes": s["engagement"]["like"]}
            for ep in episodes(workdir, epochs) for s in post_steps(ep)
            if s["engagement"]["like"] >= min_likes]
