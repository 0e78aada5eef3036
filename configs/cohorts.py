"""Cohorts: two policies in one society of SmolLM2-135M-Instruct agents (configs/smol.py:study's
society, model and update), each cohort its own LoRA adapter over the shared base.

    python launch/study.py --config=configs/cohorts.py:control --cohorts --seeds=3 \
        --parallel=1 --workdir=runs/cohorts_control
    python launch/study.py --config=configs/cohorts.py:objectives --cohorts --seeds=3 \
        --parallel=1 --workdir=runs/cohorts_objectives
    python launch/train.py --config=configs/cohorts.py:smoke       # tiny, random (tests)

`:control`: 9 agents trained, 9 frozen (the base model alone), in the same feed and rewarded
alike. An in-world control: does the trained cohort's share of the likes rise against agents
who live in the same society at the same time?

`:objectives`: two trainable cohorts of 9, one rewarded for the likes its posts earn, the other
for the comments. Do their posts drift apart (crowd_interest_sim, topic shares, text drift)?

docs/cohorts.md has both studies. The study's `--cohorts` flag makes each cohort a column of
the table (`jaxsocial.study.cohort_runs`).
"""
import importlib.util
import os

from jaxsocial.train import config as run_config


def _smol_module():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "smol.py")
    spec = importlib.util.spec_from_file_location("smol_config", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Each cohort cycles configs/smol.py's four personas over its 9 agents (Ada x3, Bo, Cy, Di x2
# each), so the cohorts differ only in their policy (or reward): the run-wide cycling would give
# the first block of agents 2 home cooks and the second 3, in a society whose crowd likes
# cooking.
PERSONAS = tuple(_smol_module().PERSONAS)
CONTROL = (dict(name="trained", share=0.5, trainable=True, personas=PERSONAS),
           dict(name="frozen", share=0.5, trainable=False, personas=PERSONAS))
OBJECTIVES = (dict(name="likes", share=0.5, reward=dict(like=1.0, comment=0.0),
                   personas=PERSONAS),
              dict(name="comments", share=0.5, reward=dict(like=0.0, comment=1.0),
                   personas=PERSONAS))


def get_config(arg=None):
    if arg == "smoke":  # the tiny random model of demo.py:smoke, two cohorts
        c = run_config.base_config()
        run_config.smoke(c)
        c.name = "cohorts_smoke"
        c.society.update(like_bias=-5.0, like_sim=8.0)
        c.reward.non_post_mode = "mean"
        c.rl.lora_rank = 4
        c.agents.cohorts = OBJECTIVES
        return c
    if arg not in ("control", "objectives"):
        raise ValueError(f"unknown cohorts variant {arg!r}; use configs/cohorts.py:control, "
                         f":objectives or :smoke")
    c = _smol_module().get_config("study")
    c.name = f"cohorts_{arg}"
    c.agents.cohorts = CONTROL if arg == "control" else OBJECTIVES
    return c
