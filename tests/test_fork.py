"""Forks (`train.fork_from`): a world restored from another run's checkpoint and trained on. A
fork that changes nothing reproduces its source's later epochs bit for bit; one under another
recommender diverges; keys a fork may not change are refused before anything is written; and
launch/compare.py puts the branches in one table."""
import json
import os
import subprocess
import sys

import jax
import pytest
from conftest import ONE_DEVICE_ENV, load_config_file

from jaxsocial.train import run as run_lib
from jaxsocial.train import runner, sharding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING = ("tokens_per_s", "ticks_per_s", "rollout_s", "wall_s")


def records(workdir, start=1):
    out = []
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r["epoch"] >= start:
                out.append({k: v for k, v in r.items() if k not in TIMING})
    return out


def config(**overrides):
    c = load_config_file("configs/demo.py", "smoke")
    c.train.epochs, c.train.checkpoint_every, c.train.export_hf = 3, 1, False
    for key, value in overrides.items():
        node = c
        *path, last = key.split(".")
        for p in path:
            node = node[p]
        node[last] = value
    return c


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A 3-epoch run W and the Run that trained it (one device)."""
    w = str(tmp_path_factory.mktemp("fork") / "world")
    c = config()
    run = run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1]))
    runner.train(c, w, run=run)
    return w, c, run


def test_a_fork_without_changes_reproduces_its_source(world, tmp_path):
    w, c, run = world
    fork = config(**{"train.fork_from": os.path.join(w, "checkpoints", "1")})
    out = runner.train(fork, str(tmp_path / "same"), run=run)
    assert out["epochs"] == 3
    got, want = records(tmp_path / "same"), records(w)
    assert [r["epoch"] for r in got] == [1, 2, 3]  # the shared epoch 1 is copied over
    assert got == want  # epochs 2 and 3 trained again, bit for bit
    assert want[1]["ppo"]["grad_norm"] > 0 and want[1]["total_posts"] > 0  # not trivial
    stored = json.load(open(tmp_path / "same" / "config.json"))
    assert stored["train"]["fork_from"].endswith(os.path.join("checkpoints", "1"))  # lineage


def test_a_fork_under_another_recommender_diverges(world, tmp_path):
    w, _, _ = world
    fork = config(**{"train.fork_from": os.path.join(w, "checkpoints", "1"),
                     "society.recsys": "random"})
    runner.train(fork, str(tmp_path / "random"))
    got, want = records(tmp_path / "random"), records(w)
    assert got[0] == want[0]  # the shared past
    assert got[1] != want[1]  # the negative control: another world from epoch 2 on
    # launch/compare.py: one table of the branches from the fork point on
    env = dict(os.environ, **ONE_DEVICE_ENV)
    out = subprocess.run([sys.executable, "launch/compare.py", w, str(tmp_path / "random"),
                          f"--out={tmp_path / 'compare.md'}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    table = (tmp_path / "compare.md").read_text()
    assert "forked at epoch 1" in table and "| 2 | world |" in table and "| 3 | random |" in table
    assert not any(line.startswith("| 1 |") for line in table.splitlines())  # shared past


@pytest.mark.parametrize("overrides, message", [
    ({"society.num_users": 300}, "may not change society.num_users"),
    ({"rl.learning_rate": 0.5}, "may not change rl.learning_rate"),
    ({"train.epochs": 1}, "train.epochs=1 must be past the fork's epoch 1"),
])
def test_a_fork_refuses_what_it_may_not_change(world, tmp_path, overrides, message):
    w, _, _ = world
    fork = config(**{"train.fork_from": os.path.join(w, "checkpoints", "1"), **overrides})
    with pytest.raises(ValueError, match=message):
        runner.fork_source(fork, str(tmp_path / "bad"))


def test_a_fork_names_a_missing_or_wrong_checkpoint(world, tmp_path):
    w, _, _ = world
    missing = config(**{"train.fork_from": os.path.join(w, "checkpoints", "9")})
    with pytest.raises(ValueError, match=r"does not exist \(checkpoints of .*: \[1, 2, 3\]\)"):
        runner.fork_source(missing, str(tmp_path / "x"))
    with pytest.raises(ValueError, match="not a checkpoint directory"):
        runner.fork_source(config(**{"train.fork_from": w}), str(tmp_path / "x"))
    with pytest.raises(ValueError, match="needs its own --workdir"):
        runner.fork_source(config(**{"train.fork_from": os.path.join(w, "checkpoints", "1")}),
                           w)
