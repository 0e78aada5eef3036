"""The trajectory dataset (train.dataset, jaxsocial.train.dataset, jaxsocial.datasets): written by
tensorflow-datasets' writer, read back by TFDS, every step checked against the run's own
metrics, samples and feed (with perturbed copies the check rejects), a run killed between an
epoch's dataset and its checkpoint resumes to the same dataset, and without TensorFlow the run
is refused in one line. The writer needs `pip install -e '.[tfds]'`: without it the tests that
write skip (JAXSOCIAL_TFDS=1, as in CI, makes them fail instead)."""
import copy
import importlib.util
import json
import os

import jax
import numpy as np
import pytest
from conftest import load_config_file

from jaxsocial import datasets
from jaxsocial.train import checkpointing, checks, runner, sharding
from jaxsocial.train import dataset as dataset_lib
from jaxsocial.train import run as run_lib


def require_tfds():
    problem = dataset_lib.missing()
    if problem is None:
        return
    if os.environ.get("JAXSOCIAL_TFDS") == "1":
        pytest.fail(problem)
    pytest.skip(problem)


def _config():
    c = load_config_file("configs/demo.py", "smoke")
    c.train.epochs = 2
    c.train.checkpoint_every = 1
    c.train.export_hf = False
    c.train.log_samples = 16
    c.train.dataset = True
    return c


def _jsonl(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def mismatches(eps, metrics, samples, feeds, tokenizer) -> list:
    """What in the episodes `eps` disagrees with the run's metrics.jsonl, samples.jsonl and
    feed.jsonl records; [] when every step agrees."""
    out = []
    for m in metrics:
        e = m["epoch"]
        steps = [(ep["agent"], s) for ep in eps if ep["epoch"] == e for s in ep["steps"]]
        rewards = np.array([s["reward"] for _, s in steps])
        if len(steps) != m["interactions"]:
            out.append(f"epoch {e}: {len(steps)} steps, {m['interactions']} interactions")
        if not np.isclose(rewards.mean(), m["reward_mean"], rtol=1e-5, atol=1e-6):
            out.append(f"epoch {e}: mean reward {rewards.mean()} != {m['reward_mean']}")
        mix = {}
        for _, s in steps:
            mix[s["action"]["type"]] = mix.get(s["action"]["type"], 0) + 1
        if mix != m["action_mix"]:
            out.append(f"epoch {e}: action mix {mix} != {m['action_mix']}")
        for a, s in steps:
            ids = s["action"]["ids"][:s["action"]["length"]]
            if tokenizer.decode(ids.tolist(), skip_special_tokens=True) != s["action"]["text"]:
                out.append(f"epoch {e} agent {a} tick {s['observation']['tick']}: ids != text")
        last = max(s["observation"]["tick"] for _, s in steps)
        final = {a: s for a, s in steps if s["observation"]["tick"] == last}
        for row in (r for r in samples if r["epoch"] == e):
            s = final.get(row["agent"])
            if s is None or s["action"]["text"] != row["text"] or not np.isclose(
                    s["reward"], row["score"], rtol=1e-6):
                out.append(f"epoch {e} agent {row['agent']}: last step != samples.jsonl")
        # the feed's tick counts the epoch's agent ticks; a step's is the society's clock
        rank = {t: i for i, t in enumerate(sorted({s["observation"]["tick"] for _, s in steps}))}
        posts = {(a, rank[s["observation"]["tick"]],
                  s["action"]["text"].split(":", 1)[-1].strip(),
                  s["engagement"]["like"]) for a, s in steps
                 if s["action"]["type"] in datasets.POST_TYPES and s["action"]["created_id"] >= 0}
        for p in next(f for f in feeds if f["epoch"] == e)["posts"]:
            if (p["agent"], p["tick"], p["text"], p["likes"]) not in posts:
                out.append(f"epoch {e}: feed post of agent {p['agent']} at tick {p['tick']} "
                           "is no step")
    return out


@pytest.mark.slow
def test_dataset_is_the_runs_steps_and_a_killed_run_resumes_to_the_same(tmp_path, monkeypatch):
    require_tfds()
    c = _config()
    run = run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    w = str(tmp_path / "w")
    # What kill -9 during epoch 2's checkpoint leaves: epoch 2's dataset complete, its
    # checkpoint not, and a half-written dataset directory beside it.
    real = checkpointing.Checkpointer.save

    def dies_saving_2(self, step, tree, meta):
        if step == 2:
            os.makedirs(os.path.join(dataset_lib.epoch_dir(w, 2), os.pardir,
                                     "incomplete.x1_1.0.0"))
            raise KeyboardInterrupt("killed")
        return real(self, step, tree, meta)
    monkeypatch.setattr(checkpointing.Checkpointer, "save", dies_saving_2)
    with pytest.raises(KeyboardInterrupt):
        runner.train(c, w, run=run)
    monkeypatch.undo()
    assert sorted(dataset_lib.epochs(w)) == [1, 2]
    before = list(datasets.episodes(w, [2]))
    info = os.path.join(dataset_lib.epoch_dir(w, 2), "dataset_info.json")
    inode = os.stat(info).st_ino
    runner.train(c, w, run=run)  # resumes from checkpoint 1 and writes epoch 2 again
    assert sorted(dataset_lib.epochs(w)) == [1, 2] and os.stat(info).st_ino != inode
    assert os.listdir(os.path.dirname(dataset_lib.epoch_dir(w, 2))) == ["1.0.0"]
    eps = list(datasets.episodes(w))
    assert _same([e for e in eps if e["epoch"] == 2], before)  # the same epoch, once

    metrics, samples = _jsonl(f"{w}/metrics.jsonl"), _jsonl(f"{w}/samples.jsonl")
    feeds = _jsonl(f"{w}/feed.jsonl")
    tok = run.setup.tokenizer
    assert [m["epoch"] for m in metrics] == [1, 2] and mismatches(
        eps, metrics, samples, feeds, tok) == []
    # the comparison is not trivial: rewards vary, posts drew likes, log-probs were recorded
    assert np.std([s["reward"] for ep in eps for s in ep["steps"]]) > 0
    assert any(s["engagement"]["like"] > 0 for ep in eps for s in ep["steps"])
    assert all(ep["steps"][0]["is_first"] and ep["steps"][-1]["is_last"] for ep in eps)
    assert all(np.any(s["action"]["logprobs"] < 0) for ep in eps for s in ep["steps"]
               if s["action"]["length"])
    # Negative controls: one step's reward, one answer's text, one post's likes, one step lost.
    for broken in ("reward", "text", "likes", "lost"):
        bad = copy.deepcopy(eps)
        step = next(s for ep in bad for s in ep["steps"] if s["action"]["type"] == "create_post"
                    and s["engagement"]["like"] > 0)
        if broken == "reward":
            step["reward"] += 1.0
        elif broken == "text":
            step["action"]["text"] += "!"
        elif broken == "likes":
            step["engagement"]["like"] += 1
        else:
            bad[0]["steps"].pop()
        assert mismatches(bad, metrics, samples, feeds, tok), broken
    # Preference pairs and SFT rows, by their definitions.
    pairs = datasets.preference_pairs(w)
    assert pairs and all(p["chosen_likes"] > p["rejected_likes"] for p in pairs)
    rows = datasets.sft_rows(w, min_likes=1)
    assert rows and all(r["likes"] >= 1 for r in rows)
    assert len(rows) == sum(1 for ep in eps for s in datasets.post_steps(ep)
                            if s["engagement"]["like"] >= 1)
    # TFDS's own reader of one epoch: its description is the run's config.
    import tensorflow_datasets as tfds
    builder = tfds.builder_from_directory(dataset_lib.epoch_dir(w, 2))
    assert json.loads(builder.info.description)["train"]["dataset"] is True
    assert builder.info.splits["train"].num_examples == sum(ep["epoch"] == 2 for ep in eps)


def _same(a, b) -> bool:
    def flat(x):
        if isinstance(x, dict):
            return {k: flat(v) for k, v in x.items()}
        if isinstance(x, list):
            return [flat(v) for v in x]
        return np.asarray(x).tolist()
    return flat(a) == flat(b)


def test_cut_removes_later_and_half_written_epochs(tmp_path):
    for e in (1, 2, 3):
        path = dataset_lib.epoch_dir(str(tmp_path), e)
        os.makedirs(path)
        open(os.path.join(path, "dataset_info.json"), "w").close()
    os.makedirs(os.path.join(os.path.dirname(dataset_lib.epoch_dir(str(tmp_path), 2)),
                             "incomplete.abc_1.0.0"))
    os.makedirs(os.path.dirname(dataset_lib.epoch_dir(str(tmp_path), 4)))  # no dataset_info
    assert sorted(dataset_lib.epochs(str(tmp_path))) == [1, 2, 3]
    assert dataset_lib.cut(str(tmp_path), 2) == [3, 4]
    assert sorted(dataset_lib.epochs(str(tmp_path))) == [1, 2]
    assert os.listdir(os.path.dirname(dataset_lib.epoch_dir(str(tmp_path), 2))) == ["1.0.0"]
    with pytest.raises(FileNotFoundError, match=r"no trajectory dataset of epoch 3 \(have: \[1, 2"):
        datasets.load(str(tmp_path), 3)


def test_without_tensorflow_the_run_is_refused_in_one_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorflow" else real(name, *a))
    c = _config()
    with pytest.raises(ValueError, match=r"train.dataset=True .* needs tensorflow: "
                                         r"pip install -e '.\[tfds\]'"):
        checks.check(c)
    c.train.dataset = False
    checks.check(c)  # control: off, nothing is needed
