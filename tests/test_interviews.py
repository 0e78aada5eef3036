"""Interviews (`agents.interviews`, `host.interview`, launch/interview.py): the agents answer
a question outside the society. The run with interviews trains exactly as the run without them
(nothing is posted or rewarded), the answers land in interviews.jsonl and summary.md, and the
launcher reproduces them from the checkpoint."""
import json
import os
import subprocess
import sys

import jax
import pytest
from conftest import ONE_DEVICE_ENV, load_config_file

from jaxsocial.train import checks, runner, sharding
from jaxsocial.train import run as run_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING = ("tokens_per_s", "ticks_per_s", "rollout_s", "wall_s")
QUESTIONS = ((1, "What do you post about?"), (2, "Who likes your posts?"))


def config(interviews=()):
    c = load_config_file("configs/demo.py", "smoke")
    c.train.epochs, c.train.checkpoint_every, c.train.export_hf = 2, 1, False
    c.agents.interviews = interviews
    return c


def records(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in f]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("interviews")
    c = config(QUESTIONS)
    run = run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1]))
    runner.train(c, str(base / "asked"), run=run)
    runner.train(config(), str(base / "plain"), run=run)
    return base


def test_interviews_are_written_and_change_nothing(runs):
    asked = runner.read_interviews(str(runs / "asked"))
    assert sorted(asked) == [1, 2]
    for epoch, question in QUESTIONS:
        answers = asked[epoch]
        assert [a["agent"] for a in answers] == list(range(8))  # every agent, once
        assert all(a["question"] == question and a["persona"] for a in answers)
    md = (runs / "asked" / "summary.md").read_text()
    assert "## Interview, first (epoch 1): What do you post about?" in md
    assert "## Interview, last (epoch 2): Who likes your posts?" in md
    # Outside the society: the run trains exactly as one that asks nothing.
    assert records(runs / "asked") == records(runs / "plain")
    assert records(runs / "plain")[1]["ppo"]["grad_norm"] > 0  # and it did train
    assert not (runs / "plain" / "interviews.jsonl").exists()


def test_the_launcher_reproduces_the_answers_from_the_checkpoint(runs):
    env = dict(os.environ, **ONE_DEVICE_ENV)
    out = subprocess.run([sys.executable, "launch/interview.py", f"--workdir={runs / 'asked'}",
                          "--epoch=2", f"--question={QUESTIONS[1][1]}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert got == runner.read_interviews(str(runs / "asked"))[2]
    bad = subprocess.run([sys.executable, "launch/interview.py", f"--workdir={runs / 'asked'}",
                          "--epoch=7", "--question=x"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1 and "--epoch=7: no such checkpoint" in bad.stderr


@pytest.mark.parametrize("interviews", [((3, "q"),), ((1, ""),), (("one", "q"),), ((1,),)])
def test_bad_interviews_are_one_error(interviews):
    with pytest.raises(ValueError, match="agents.interviews"):
        checks.check(config(interviews))
