"""Social-loop epochs outside the PPO + crowd default: GRPO, and the LLM-only society.

Each test builds the real trainer set-up (`train.run.build_run`) from `configs/demo.py:smoke` on one
device and runs its first epoch (rollout, social reward, scoring, update), next to a negative
control that differs from it by one config key:

- GRPO (`rl.algo="grpo"`, crowd on). A GRPO gradient needs scores that differ within a group
  (`grpo.group_advantages`: A = (r - group mean) / (group std + eps); a group is the agents
  acting in one tick), so the test asserts a positive in-group score spread, non-zero
  advantages and a finite positive gradient norm that moved the weights. `rl.kl_coef = 0` (the
  run config's shared default is PPO's 0.05, demo.py sets 0.01, GRPOConfig's own is 0.0) and
  `ent_coef = 0`, so the advantages are the loss's only gradient. Control: `reward.like = 0`
  (repost, comment and new_followers already weigh 0, and demo's non_post_baseline gives
  non-posts the mean post score, also 0): every score is 0, every advantage 0, so the same
  assertions must fail: the gradient norm is exactly 0 and the weights and Adam moments do not
  move. Its rollout is the arm's (same likes), so nothing but the reward weight makes it fail.
- LLM-only society (`society.crowd = False`, the OASIS blog's setting: only the LLM agents
  act). With the default 6 actions over 4 ticks the 8 random agents like once or never, so
  the arm lets them choose among `post`, `like` and `nothing` for 8 ticks (feeds: the 32 seed
  posts and the agents' own posts; the recommender favours recent posts). The test asserts that
  the crowd did nothing (no crowd posts), that every like in the society is an applied agent
  like, that agents' posts earned likes within the horizon, a positive reward and a finite
  positive PPO gradient norm. Control: the same config without `like` in `agents.actions`:
  the agents still post, but no one can like, so there are no likes and zero reward.
"""
import jax
import numpy as np
import pytest
from conftest import load_config_file
from test_train_loop import assert_trained, mismatches, trained_parts

from jaxsocial.rl import grpo, ppo
from jaxsocial.train import run as run_lib
from jaxsocial.train import sharding

pytestmark = pytest.mark.slow  # each build compiles a one-program epoch (~40-60 s on 2 cores)

LLM_ONLY_ACTIONS = ("post", "like", "nothing")


def _grpo_config(like=1.0):
    c = load_config_file("configs/demo.py", "smoke")
    c.rl.algo = "grpo"
    c.rl.kl_coef = 0.0  # no KL term: the advantages alone give the gradient
    c.reward.like = like
    return c


def _llm_only_config(actions=LLM_ONLY_ACTIONS):
    c = load_config_file("configs/demo.py", "smoke")
    c.society.crowd = False
    c.agents.actions = actions
    c.rollout.ticks_per_epoch = 8  # 4 ticks of the smoke: 0-4 agent likes, 2 counted rewarded
    return c


def _first_epoch(config):
    """(run, metrics, trained parts before and after, society likes before and after) of the
    first epoch of `config` on one device."""
    run = run_lib.build_run(config, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    state = run.init_state()
    before = trained_parts(state.train)
    likes0 = int(np.asarray(sharding.to_host(state.society.posts.likes)).sum())
    state, metrics, _ = run.run_epoch(state)
    likes1 = int(np.asarray(sharding.to_host(state.society.posts.likes)).sum())
    return dict(run=run, m=metrics, before=before, after=trained_parts(state.train),
                likes=(likes0, likes1))


@pytest.fixture(scope="module")
def grpo_arm():
    return _first_epoch(_grpo_config())


@pytest.fixture(scope="module")
def grpo_unrewarded():
    return _first_epoch(_grpo_config(like=0.0))


@pytest.fixture(scope="module")
def llm_only():
    return _first_epoch(_llm_only_config())


@pytest.fixture(scope="module")
def llm_only_no_like():
    return _first_epoch(_llm_only_config(("post", "nothing")))


def _grpo_signal(m):
    """What a GRPO update needs for a gradient: scores that differ within some group."""
    u = m["ppo"]
    return u["score_std_in_group"] > 0 and u["adv_abs_mean"] > 0 and m["reward_std"] > 0


def _rollout_facts(m):
    return {k: m[k] for k in ("action_mix", "total_posts", "avg_likes_per_post", "likes_hist",
                              "crowd_posts", "parse_failures")}


def test_grpo_epoch_learns_from_in_group_score_differences(grpo_arm, grpo_unrewarded):
    run, m = grpo_arm["run"], grpo_arm["m"]
    cfg = run.setup.rl_config
    assert isinstance(cfg, grpo.GRPOConfig) and cfg.kl_coef == 0.0 and cfg.ent_coef == 0.0
    # Groups = the 8 agents acting in one tick: 4 ticks, 4 groups of 8 trajectories.
    assert cfg.group_size == run.setup.active == 8
    assert m["parse_failures"] == 0 and m["total_posts"] > 0
    # The crowd liked some posts: positive rewards that differ inside the tick groups.
    assert m["avg_likes_per_post"] > 0 and m["reward_mean"] > 0
    assert _grpo_signal(m), m["ppo"]
    u = m["ppo"]
    assert np.isfinite(u["grad_norm"]) and u["grad_norm"] > 0, u
    assert np.isfinite(u["loss"]) and u["kl_coef"] == 0.0 and u["skipped_steps"] == 0, u
    assert_trained(grpo_arm["before"], grpo_arm["after"], u["grad_norm"])

    # Negative control, reward.like=0: the same rollout (same posts and likes), every score 0.
    c = grpo_unrewarded["m"]
    assert _rollout_facts(c) == _rollout_facts(m)
    assert c["avg_likes_per_post"] > 0  # likes happened, they are just worth nothing
    assert c["reward_mean"] == 0.0 and c["reward_std"] == 0.0
    assert c["ppo"]["score_mean"] == 0.0
    assert not _grpo_signal(c), c["ppo"]
    assert c["ppo"]["score_std_in_group"] == 0.0 and c["ppo"]["adv_abs_mean"] == 0.0
    assert c["ppo"]["grad_norm"] == 0.0, c["ppo"]
    # A zero gradient moves nothing: weights and both Adam moments stay as they were.
    assert mismatches(grpo_unrewarded["before"], grpo_unrewarded["after"]) == []
    with pytest.raises(AssertionError):
        assert_trained(grpo_unrewarded["before"], grpo_unrewarded["after"],
                       c["ppo"]["grad_norm"])


def test_llm_only_society_rewards_likes_by_agents(llm_only, llm_only_no_like):
    run, m = llm_only["run"], llm_only["m"]
    assert isinstance(run.setup.rl_config, ppo.PPOConfig)
    assert not run.setup.social_params.crowd and run.setup.social_params.num_seed_posts > 0
    assert m["parse_failures"] == 0
    # No crowd: it created no post, and every like in the society is an agent's applied like
    # (the applied actions are the created posts plus the applied likes).
    assert m["crowd_posts"] == 0
    likes0, likes1 = llm_only["likes"]
    applied_likes = m["interactions_applied"] - m["total_posts"]
    assert likes0 == 0 and likes1 == applied_likes > 0, (llm_only["likes"], m["action_mix"])
    assert applied_likes <= m["action_mix"]["like_post"]
    # Agents liked agents' posts within the reward horizon: a positive reward, and an update.
    assert m["total_posts"] > 0 and m["avg_likes_per_post"] > 0
    assert m["reward_mean"] > 0 and m["reward_std"] > 0
    u = m["ppo"]
    assert np.isfinite(u["grad_norm"]) and u["grad_norm"] > 0, u
    assert np.isfinite(u["loss"]) and u["skipped_steps"] == 0, u
    assert_trained(llm_only["before"], llm_only["after"], u["grad_norm"])

    # Negative control: agents that cannot like. They still post (so there were posts to like),
    # but no like happens anywhere and no trajectory earns a reward.
    c = llm_only_no_like["m"]
    assert "like_post" not in c["action_mix"] and c["crowd_posts"] == 0
    assert c["total_posts"] > 0
    assert llm_only_no_like["likes"] == (0, 0)
    assert c["avg_likes_per_post"] == 0.0 and c["positive_engagement_share"] == 0.0
    assert c["reward_mean"] == 0.0 and c["reward_std"] == 0.0
