"""GRPO: group-normalised advantages vs a plain loop, loss aggregation, learning."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_rl_common import (
    GRPO_LEARN,
    TARGET,
    compiled_update,
    count_token,
    rollout,
    standard_prompts,
    tiny_policy,
)

from jaxsocial.rl import grpo, optim, ppo


def group_adv_loop(scores, g, eps, ddof, scale):
    out = []
    for start in range(0, len(scores), g):
        grp = [float(s) for s in scores[start:start + g]]
        mean = sum(grp) / g
        std = math.sqrt(sum((s - mean) ** 2 for s in grp) / (g - ddof))
        out += [(s - mean) / (std + eps) if scale else s - mean for s in grp]
    return np.array(out)


@pytest.mark.parametrize("g,ddof,scale", [(4, 1, True), (8, 0, True), (3, 1, False)])
def test_group_advantages_match_loop(g, ddof, scale):
    rng = np.random.default_rng(g)
    scores = rng.normal(size=5 * g).astype(np.float32)
    scores[:g] = 2.5  # a group with zero spread: advantages 0, not NaN
    got = grpo.group_advantages(jnp.asarray(scores), g, eps=1e-4, scale=scale, ddof=ddof)
    want = group_adv_loop(scores, g, 1e-4, ddof, scale)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)
    assert np.all(np.asarray(got)[:g] == 0.0)


def test_group_advantages_bad_batch():
    with pytest.raises(ValueError, match="group_size 4"):
        grpo.group_advantages(jnp.zeros(6), 4)
    with pytest.raises(ValueError, match="group_size"):
        grpo.GRPOConfig(group_size=1)


def test_grpo_loss_aggregation_and_kl_hand_values():
    lp = jnp.array([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    mask = jnp.array([[1, 1, 1], [1, 0, 0]], bool)
    adv = jnp.array([1.0, -2.0])
    cfg = grpo.GRPOConfig(kl_coef=0.0)
    # ratio 1: per-token loss is -A.  token mean: (-1 * 3 + 2 * 1) / 4; seq mean: (-1 + 2) / 2
    loss, stats = grpo.grpo_loss(lp, lp, lp, adv, mask, cfg)
    assert float(loss) == pytest.approx(-1.0 / 4)
    loss, _ = grpo.grpo_loss(lp, lp, lp, adv, mask, cfg.replace(loss_aggregation="seq_mean"))
    assert float(loss) == pytest.approx(0.5)
    # k3 KL term: ref = lp - 0.5 per token -> k3 = exp(-0.5) + 0.5 - 1
    ref = lp - 0.5
    k3 = math.exp(-0.5) + 0.5 - 1
    loss, stats = grpo.grpo_loss(lp, lp, ref, adv, mask, cfg.replace(kl_coef=0.1))
    assert float(loss) == pytest.approx(-1.0 / 4 + 0.1 * k3, rel=1e-5)
    assert float(stats["kl_loss"]) == pytest.approx(k3, rel=1e-5)
    # clipped branch: A > 0, ratio 1.5 -> -1.2 per token
    loss, stats = grpo.grpo_loss(lp + math.log(1.5), lp, lp, jnp.array([1.0, 1.0]), mask, cfg)
    assert float(loss) == pytest.approx(-1.2, rel=1e-5)
    assert float(stats["clip_frac"]) == 1.0


def test_grpo_learns_synthetic_reward():
    """Group of 4 samples per prompt, no critic: mean count of the target token rises."""
    pdef, params, ref = tiny_policy("none")
    assert params["value"] is None
    cfg = GRPO_LEARN
    state = optim.init_train_state(cfg, pdef, params, ref, jax.random.PRNGKey(0))
    update = compiled_update(cfg, "none")
    before = update.trace_count
    prompt, pmask = standard_prompts(group=cfg.group_size)
    scores = []
    for i in range(12):
        traj, _ = rollout(pdef, state.params, ref, cfg, jax.random.PRNGKey(10 + i), prompt,
                          pmask, 16, count_token(TARGET))
        assert np.all(np.asarray(traj.values) == 0.0)
        state, metrics = update(state, traj)
        scores.append(float(metrics["score_mean"]))
    first, last = np.mean(scores[:2]), np.mean(scores[-3:])
    assert last >= first + 0.75 and last >= 2.0 * first, scores
    assert update.trace_count - before <= 1
    assert int(state.nonfinite_skips) == 0


def test_grpo_rejects_value_free_ppo():
    pdef = tiny_policy("none")[0]
    with pytest.raises(ValueError, match="critic"):
        ppo.make_update(ppo.PPOConfig(), pdef)
