"""The trajectory dataset (`train.dataset=True`): each epoch's trajectories as a TFDS dataset.

RLDS-shaped (episodes of steps, as TFDS stores RL data): one episode per LLM agent that acted in
the epoch, one step per tick it acted, in tick order. A step holds what the agent saw (the
prompt's text and token ids), what it answered (text, ids and the rollout's log-probs), the
parsed action (type, target post or user, the targeted post's author, the post it created),
the reward (the trajectory's score) and its engagement parts (the likes, reposts, comments, ...
the created post drew within the reward horizon). An episode carries the agent, its persona and
cohort, the epoch and the seed; the dataset's description is the run's config.json.

Written with tensorflow-datasets' own writer (`tfds.dataset_builders.store_as_tfds_dataset`,
array_record files), which needs TensorFlow: `pip install -e '.[tfds]'`. Each epoch is one
builder config, `W/dataset/society/epoch_NNNN/1.0.0/`, written whole (TFDS writes into an
`incomplete.*` directory and renames it) after the epoch's metrics and before its checkpoint;
`cut(W, epoch)` runs on every start and removes the epochs after the restored one (and any
half-written directory), so a resumed run, even after kill -9, holds each epoch once.
Read it with `jaxsocial.datasets` (no TensorFlow needed) or
`tfds.builder_from_directory(W/dataset/society/epoch_NNNN/1.0.0)`.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import io
import os
import re
import shutil
from typing import Any, Dict, List, Optional

import numpy as np
from absl import logging

from jaxsocial.social.actions import ActionType
from jaxsocial.train.config import ENGAGEMENT_REWARDS

NAME, VERSION = "society", "1.0.0"
_EPOCH = re.compile(r"epoch_(\d{4,})$")


def missing() -> Optional[str]:
    """None when the writer can run, else one line naming what to install."""
    need = [m for m in ("tensorflow_datasets", "tensorflow", "array_record")
            if importlib.util.find_spec(m) is None]
    if not need:
        return None
    return (f"train.dataset=True writes the trajectories with tensorflow-datasets' writer, which "
            f"needs {', '.join(need)}: pip install -e '.[tfds]'")


def epoch_dir(workdir: str, epoch: int) -> str:
    """W/dataset/society/epoch_NNNN/1.0.0: the TFDS directory of one epoch."""
    return os.path.join(workdir, "dataset", NAME, f"epoch_{epoch:04d}", VERSION)


def epochs(workdir: str) -> Dict[int, str]:
    """{epoch: its TFDS directory} of the complete epochs in `workdir`, in epoch order."""
    out = {}
    for path in glob.glob(os.path.join(workdir, "dataset", NAME, "epoch_*", VERSION)):
        m = _EPOCH.search(os.path.dirname(path))
        if m and os.path.exists(os.path.join(path, "dataset_info.json")):
            out[int(m.group(1))] = path
    return dict(sorted(out.items()))


def cut(workdir: str, epoch: int) -> List[int]:
    """Remove the epochs after `epoch` and every half-written directory (`incomplete.*`);
    returns the epochs removed."""
    removed = []
    for path in glob.glob(os.path.join(workdir, "dataset", NAME, "epoch_*")):
        m = _EPOCH.search(path)
        if m and int(m.group(1)) > epoch:
            shutil.rmtree(path)
            removed.append(int(m.group(1)))
    for path in glob.glob(os.path.join(workdir, "dataset", NAME, "epoch_*", "incomplete.*")):
        shutil.rmtree(path)
    return sorted(removed)


def features(prompt_len: int, answer_len: int, engagement: int):
    """The TFDS features of an episode (token ids padded to the run's static lengths, so the
    numpy reader decodes them without TensorFlow)."""
    import tensorflow_datasets as tfds

    text, ids = tfds.features.Text(), lambda n: tfds.features.Tensor(shape=(n,), dtype=np.int32)
    return tfds.features.FeaturesDict({
        "agent": np.int32, "persona": text, "cohort": text, "epoch": np.int32, "seed": np.int32,
        "steps": tfds.features.Dataset({
            "observation": {"prompt": text, "prompt_ids": ids(prompt_len),
                            "prompt_length": np.int32, "tick": np.int32},
            "action": {"text": text, "ids": ids(answer_len), "length": np.int32,
                       "logprobs": tfds.features.Tensor(shape=(answer_len,), dtype=np.float32),
                       "type": text, "parsed": np.bool_, "target": np.int32,
                       "target_author": np.int32, "created_id": np.int32},
            "reward": np.float32,
            "engagement": {k: np.int32 for k in ENGAGEMENT_REWARDS[:engagement]},
            "discount": np.float32, "is_first": np.bool_, "is_last": np.bool_,
            "is_terminal": np.bool_,
        })})


def episodes(setup, view, epoch: int) -> List[tuple]:
    """[(key, episode)] of one epoch from its host-side `EpochView` (with `steps`): one per
    agent that acted, its steps in tick order."""
    ro = view.steps
    agent = np.asarray(ro.agent)
    t, b = agent.shape
    p_ids, p_mask = np.asarray(ro.prompt_ids), np.asarray(ro.prompt_mask)
    a_ids, a_mask = np.asarray(ro.tokens), np.asarray(ro.mask)
    logp = np.where(a_mask, np.asarray(ro.logprobs), 0.0).astype(np.float32)
    eng = np.asarray(view.engagement)
    score = np.asarray(view.score)
    tok = setup.tokenizer
    prompts = tok.batch_decode([p_ids[i, j][p_mask[i, j]].tolist() for i in range(t)
                                for j in range(b)], skip_special_tokens=True)
    answers = tok.batch_decode([a_ids[i, j][a_mask[i, j]].tolist() for i in range(t)
                                for j in range(b)], skip_special_tokens=True)
    cohort_of = (np.asarray(setup.cohorts.agent_cohort) if setup.cohorts is not None else None)
    ticks = np.asarray(ro.tick)
    by_agent: Dict[int, List[Dict[str, Any]]] = {}
    for i in range(t):
        for j in range(b):
            k = i * b + j
            by_agent.setdefault(int(agent[i, j]), []).append({
                "observation": {"prompt": prompts[k], "prompt_ids": np.where(
                    p_mask[i, j], p_ids[i, j], 0).astype(np.int32),
                    "prompt_length": int(p_mask[i, j].sum()), "tick": int(ticks[i])},
                "action": {"text": answers[k], "ids": np.where(a_mask[i, j], a_ids[i, j], 0)
                           .astype(np.int32), "length": int(a_mask[i, j].sum()),
                           "logprobs": logp[i, j],
                           "type": ActionType(int(ro.action_type[i, j])).name.lower(),
                           "parsed": bool(ro.parsed[i, j]), "target": int(ro.target[i, j]),
                           "target_author": int(ro.target_author[i, j]),
                           "created_id": int(ro.created_id[i, j])},
                "reward": float(score[i, j]),
                "engagement": {name: int(eng[i, j, c]) for c, name in
                               enumerate(ENGAGEMENT_REWARDS[:eng.shape[-1]])},
                "discount": 1.0, "is_first": False, "is_last": False, "is_terminal": False})
    out = []
    seed = int(setup.config.seed)
    for a, steps in sorted(by_agent.items()):
        steps[0]["is_first"], steps[-1]["is_last"] = True, True
        cohort = setup.cohorts.names[int(cohort_of[a])] if cohort_of is not None else ""
        out.append((f"epoch{epoch}-agent{a}", {
            "agent": a, "persona": setup.personas[a], "cohort": cohort, "epoch": epoch,
            "seed": seed, "steps": steps}))
    return out


def write_epoch(workdir: str, epoch: int, episodes: List[tuple], description: str = "") -> str:
    """Write epoch `epoch`'s `episodes` (from `episodes`) as its TFDS directory (replacing it
    and any later epoch); returns the path."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up lines, once
    import tensorflow_datasets as tfds

    tfds.disable_progress_bar()
    step = episodes[0][1]["steps"][0]
    feats = features(len(step["observation"]["prompt_ids"]), len(step["action"]["ids"]),
                     len(step["engagement"]))
    cut(workdir, epoch - 1)
    # TFDS prints "Downloading and preparing ..." to stdout: nothing is downloaded here, so it
    # goes to the log instead, as one line.
    with contextlib.redirect_stdout(io.StringIO()):
        tfds.dataset_builders.store_as_tfds_dataset(
            name=NAME, version=VERSION, features=feats, split_datasets={"train": episodes},
            config=f"epoch_{epoch:04d}", data_dir=os.path.join(workdir, "dataset"),
            description=description, file_format="array_record", disable_shuffling=True)
    shutil.rmtree(os.path.join(workdir, "dataset", "downloads"), ignore_errors=True)
    path = epoch_dir(workdir, epoch)
    logging.info("dataset: epoch %d, %d episodes, %d steps -> %s", epoch, len(episodes),
                 sum(len(ep["steps"]) for _, ep in episodes), path)
    return path
