"""PPO pieces against independent plain-loop NumPy references and hand-computed values."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.rl import losses, optim, ppo
from jaxsocial.rl import state as state_lib


def ragged_mask(rng, b, t):
    """Right-padded rows of random length (incl. empty and full), plus one row with a hole."""
    lengths = rng.integers(0, t + 1, size=b)
    lengths[0], lengths[1] = 0, t
    mask = np.arange(t)[None, :] < lengths[:, None]
    mask[2] = rng.random(t) < 0.6  # interior holes (e.g. tool-output tokens not trained on)
    return mask


def gae_loop(rewards, values, mask, gamma, lam):
    """Independent reference: walk each row's valid positions backwards."""
    b, t = rewards.shape
    adv = np.zeros((b, t))
    ret = np.zeros((b, t))
    for i in range(b):
        valid = [j for j in range(t) if mask[i, j]]
        next_value, next_adv = 0.0, 0.0
        for j in reversed(valid):
            delta = rewards[i, j] + gamma * next_value - values[i, j]
            a = delta + gamma * lam * next_adv
            adv[i, j] = a
            ret[i, j] = a + values[i, j]
            next_value, next_adv = values[i, j], a
    return adv, ret


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (0.99, 1.0)])
def test_gae_matches_numpy_loop(gamma, lam):
    rng = np.random.default_rng(0)
    b, t = 7, 13
    rewards = rng.normal(size=(b, t)).astype(np.float32)
    values = rng.normal(size=(b, t)).astype(np.float32)
    mask = ragged_mask(rng, b, t)
    adv, ret = ppo.compute_gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask),
                               gamma, lam)
    assert adv.dtype == jnp.float32 and ret.dtype == jnp.float32
    ref_adv, ref_ret = gae_loop(rewards.astype(np.float64), values.astype(np.float64), mask,
                                gamma, lam)
    np.testing.assert_allclose(np.asarray(adv), ref_adv, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ret), ref_ret, atol=1e-5, rtol=1e-5)


def test_gae_gamma_lambda_one_is_reward_to_go_minus_value():
    r = np.array([[1.0, 2.0, 3.0, 0.0]], np.float32)
    v = np.array([[0.5, 0.1, 0.2, 9.0]], np.float32)
    m = np.array([[1, 1, 1, 0]], bool)
    adv, ret = ppo.compute_gae(r, v, m, 1.0, 1.0)
    np.testing.assert_allclose(np.asarray(ret), [[6.0, 5.0, 3.0, 0.0]], atol=1e-6)
    np.testing.assert_allclose(np.asarray(adv), [[5.5, 4.9, 2.8, 0.0]], atol=1e-6)


def test_token_rewards_match_loop():
    rng = np.random.default_rng(1)
    b, t = 6, 9
    mask = ragged_mask(rng, b, t)
    kl = rng.normal(size=(b, t)).astype(np.float32)
    scores = rng.normal(size=b).astype(np.float32)
    beta = 0.05
    got = np.asarray(ppo.token_rewards(scores, kl, mask, beta))
    want = np.zeros((b, t))
    for i in range(b):
        last = None
        for j in range(t):
            if mask[i, j]:
                want[i, j] = -beta * kl[i, j]
                last = j
        if last is not None:
            want[i, last] += scores[i]
    np.testing.assert_allclose(got, want, atol=1e-6)
    # float32 buffers: a 0.7 score is not truncated.
    assert got.dtype == np.float32


def test_sequence_kl_is_one_mean_term_at_the_last_token():
    """kl_per="sequence": r = score - beta * mean_t kl_t at the last valid token, 0 elsewhere;
    the per-token rewards (the negative control) differ from it wherever answers differ in
    length, and their sum grows with the length while the sequence term does not."""
    rng = np.random.default_rng(2)
    b, t = 6, 9
    mask = ragged_mask(rng, b, t)
    kl = np.abs(rng.normal(size=(b, t))).astype(np.float32)
    scores = rng.normal(size=b).astype(np.float32)
    beta = 0.05
    got = np.asarray(ppo.token_rewards(scores, kl, mask, beta, kl_per="sequence"))
    want = np.zeros((b, t))
    for i in range(b):
        valid = [j for j in range(t) if mask[i, j]]
        if valid:
            want[i, valid[-1]] = scores[i] - beta * np.mean(kl[i, valid])
    np.testing.assert_allclose(got, want, atol=1e-6)
    per_token = np.asarray(ppo.token_rewards(scores, kl, mask, beta))
    assert np.abs(per_token - want).max() > 1e-3
    one, long_ = np.ones((1, t), np.float32), np.ones((1, t), bool)
    short = np.zeros((1, t), bool)
    short[0, 0] = True
    seq = [float(np.asarray(ppo.token_rewards(np.zeros(1), one, m, 1.0, "sequence")).sum())
           for m in (short, long_)]
    tok = [float(np.asarray(ppo.token_rewards(np.zeros(1), one, m, 1.0)).sum())
           for m in (short, long_)]
    assert seq == [-1.0, -1.0] and tok == [-1.0, -float(t)]
    with pytest.raises(ValueError, match="kl_per='tokens'"):
        ppo.token_rewards(scores, kl, mask, beta, kl_per="tokens")
    with pytest.raises(ValueError, match="kl_per="):
        ppo.PPOConfig(kl_per="tokens")


def test_masked_whiten_matches_numpy():
    rng = np.random.default_rng(2)
    x = rng.normal(3.0, 2.0, size=(5, 8)).astype(np.float32)
    mask = ragged_mask(rng, 5, 8)
    vals = x[mask].astype(np.float64)
    mean, var = vals.mean(), vals.var(ddof=1)
    want = np.where(mask, (x - mean) / np.sqrt(var + 1e-8), 0.0)
    np.testing.assert_allclose(np.asarray(losses.masked_whiten(x, mask)), want, atol=1e-5)
    want_scale = np.where(mask, (x - mean) / np.sqrt(var + 1e-8) + mean, 0.0)
    np.testing.assert_allclose(np.asarray(losses.masked_whiten(x, mask, shift_mean=False)),
                               want_scale, atol=1e-5)


def test_policy_loss_ratio_one_is_minus_mean_advantage():
    adv = jnp.array([[1.0, -2.0, 3.0, 100.0]])
    mask = jnp.array([[1, 1, 1, 0]], bool)
    lp = jnp.array([[-1.0, -2.0, -0.5, -3.0]])
    loss, stats = losses.policy_loss(lp, lp, adv, mask)
    assert float(loss) == pytest.approx(-(1.0 - 2.0 + 3.0) / 3, abs=1e-6)
    assert float(stats["clip_frac"]) == 0.0
    assert float(stats["approx_kl"]) == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("adv,ratio,eps_high,want,clipped", [
    (1.0, 1.5, None, -1.2, True),     # A > 0, ratio above 1 + eps: clipped (no extra push)
    (1.0, 0.5, None, -0.5, False),    # A > 0, ratio below 1 - eps: unclipped (pessimistic)
    (-1.0, 0.5, None, 0.8, True),     # A < 0, ratio below 1 - eps: clipped
    (-1.0, 1.5, None, 1.5, False),    # A < 0, ratio above 1 + eps: unclipped
    (1.0, 1.5, 0.28, -1.28, True),    # asymmetric clip-higher
    (-2.0, 0.7, 0.28, 1.6, True),     # lower side keeps eps = 0.2: 2 * 0.8
    (1.0, 1.1, None, -1.1, False),    # inside the trust region
])
def test_policy_loss_clipped_branches(adv, ratio, eps_high, want, clipped):
    lp_old = jnp.array([[-1.0]])
    lp = lp_old + math.log(ratio)
    loss, stats = losses.policy_loss(lp, lp_old, jnp.array([[adv]]), jnp.ones((1, 1), bool),
                                  clip_eps=0.2, clip_eps_high=eps_high)
    assert float(loss) == pytest.approx(want, abs=1e-5)
    assert float(stats["clip_frac"]) == (1.0 if clipped else 0.0)
    assert float(stats["approx_kl"]) == pytest.approx(ratio - 1 - math.log(ratio), abs=1e-6)


def test_value_loss_hand_values():
    v = jnp.array([[0.5, 1.0, 0.1, 7.0]])
    v_old = jnp.array([[0.0, 0.0, 0.0, 0.0]])
    ret = jnp.array([[1.0, 0.5, 0.0, 0.0]])
    mask = jnp.array([[1, 1, 1, 0]], bool)
    loss, stats = losses.value_loss(v, v_old, ret, mask, value_clip=0.2)
    # token 0: max(0.25, (0.2-1)^2 = 0.64); token 1: max(0.25, 0.09); token 2: max(0.01, 0.01)
    assert float(loss) == pytest.approx(0.5 * (0.64 + 0.25 + 0.01) / 3, abs=1e-6)
    assert float(stats["vf_clip_frac"]) == pytest.approx(1 / 3)
    assert float(stats["value_error"]) == pytest.approx((0.25 + 0.25 + 0.01) / 3, abs=1e-6)


def test_kl_estimators():
    lp = np.array([[-1.0, -0.3, -2.0]], np.float32)
    ref = np.array([[-1.5, -0.3, -1.0]], np.float32)
    d = lp.astype(np.float64) - ref
    np.testing.assert_allclose(np.asarray(losses.kl_penalty(lp, ref, "k1")), d, atol=1e-6)
    np.testing.assert_allclose(np.asarray(losses.kl_penalty(lp, ref, "k2")), 0.5 * d ** 2,
                               atol=1e-6)
    k3 = np.exp(-d) - (-d) - 1
    np.testing.assert_allclose(np.asarray(losses.kl_penalty(lp, ref, "k3")), k3, atol=1e-6)
    assert np.all(np.asarray(losses.kl_penalty(lp, ref, "k3")) >= 0)
    with pytest.raises(ValueError, match="k4"):
        losses.kl_penalty(lp, ref, "k4")


def test_k3_is_unbiased_estimate_of_kl():
    # E_{x~p}[k3] = KL(p || q) for sampled tokens.
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([0.2, 0.5, 0.3])
    x = np.asarray(jax.random.choice(jax.random.PRNGKey(0), 3, (200_000,), p=jnp.asarray(p)))
    est = losses.kl_penalty(jnp.log(p[x]), jnp.log(q[x]), "k3").mean()
    assert float(est) == pytest.approx(float(np.sum(p * np.log(p / q))), abs=5e-3)


@pytest.mark.parametrize("kl,want_err", [(9.0, 0.2), (6.6, 0.1), (3.0, -0.2), (6.0, 0.0)])
def test_adaptive_kl_controller(kl, want_err):
    coef, n, horizon, target = 0.2, 64, 10_000.0, 6.0
    got = ppo.adaptive_kl_update(jnp.float32(coef), jnp.float32(kl), n, target, horizon)
    assert float(got) == pytest.approx(coef * (1 + want_err * n / horizon), rel=1e-6)
    cfg = ppo.PPOConfig(adaptive_kl=True)
    st = ppo.update_kl_state(cfg, state_lib.KLState(jnp.float32(coef)), jnp.float32(kl), n)
    assert float(st.coef) == pytest.approx(float(got))
    fixed = ppo.update_kl_state(ppo.PPOConfig(), state_lib.KLState(jnp.float32(0.05)),
                                jnp.float32(kl), n)
    assert float(fixed.coef) == pytest.approx(0.05)
    # non-finite KL leaves beta alone
    assert float(ppo.adaptive_kl_update(jnp.float32(coef), jnp.float32(np.nan), n, target,
                                        horizon)) == pytest.approx(coef)


def test_running_stats_match_concatenated_numpy():
    rng = np.random.default_rng(3)
    chunks = [rng.normal(2.0, 3.0, size=n).astype(np.float32) for n in (5, 17, 1, 8)]
    stats = state_lib.init_running_stats()
    for c in chunks:
        stats = state_lib.update_running_stats(stats, c)
    allv = np.concatenate(chunks).astype(np.float64)
    assert float(stats.count) == len(allv)
    assert float(stats.mean) == pytest.approx(allv.mean(), rel=1e-5)
    assert float(stats.var) == pytest.approx(allv.var(), rel=1e-4)
    poisoned = state_lib.update_running_stats(stats, np.array([1.0, np.nan], np.float32))
    assert float(poisoned.count) == float(stats.count)
    assert float(poisoned.mean) == float(stats.mean)


def test_missing_stop_penalty_and_reward_norm():
    cfg = ppo.PPOConfig(missing_stop_penalty=1.0, stop_token_ids=(2,), whiten_advantages=False,
                        kl_coef=0.0, lam=1.0)
    from jaxsocial.rl import buffer
    toks = np.array([[5, 2, 0], [5, 6, 7]], np.int32)
    mask = np.array([[1, 1, 0], [1, 1, 1]], bool)
    traj = buffer.make_trajectory(np.ones((2, 1), np.int32), np.ones((2, 1), bool), toks, mask,
                                  scores=[0.7, 0.7])
    adv, ret, rewards, kl, _ = ppo.rollout_advantages(cfg, traj, jnp.float32(0.0),
                                                      state_lib.init_running_stats())
    np.testing.assert_allclose(np.asarray(rewards), [[0, 0.7, 0], [0, 0, -0.3]], atol=1e-6)
    np.testing.assert_allclose(np.asarray(ret), [[0.7, 0.7, 0], [-0.3, -0.3, -0.3]], atol=1e-6)
    cfg2 = ppo.PPOConfig(reward_norm="running", whiten_advantages=False, kl_coef=0.0)
    traj2 = traj.replace(scores=jnp.array([1.0, 3.0], jnp.float32))
    _, _, rewards2, _, st = ppo.rollout_advantages(cfg2, traj2, jnp.float32(0.0),
                                                   state_lib.init_running_stats())
    # one batch: running var = population var of [1, 3] = 1 -> scores unchanged
    assert float(st.var) == pytest.approx(1.0)
    np.testing.assert_allclose(np.asarray(rewards2)[:, 1], [1.0, 0.0], atol=1e-4)


def test_config_validation_names_bad_value():
    with pytest.raises(ValueError, match="k5"):
        ppo.PPOConfig(kl_estimator="k5")
    with pytest.raises(ValueError, match="ppo_epochs"):
        ppo.PPOConfig(ppo_epochs=0)
    with pytest.raises(ValueError, match="temperature"):
        ppo.PPOConfig(temperature=0.0)
    with pytest.raises(ValueError, match="linear"):
        ppo.PPOConfig(lr_schedule="linear")


def test_schedules():
    cfg = ppo.PPOConfig(learning_rate=1e-3, warmup_steps=10)
    sched = optim.make_schedule(cfg)
    assert float(sched(0)) == 0.0
    assert float(sched(5)) == pytest.approx(5e-4)
    assert float(sched(100)) == pytest.approx(1e-3)
    _, shape = optim.make_optimizer(cfg)  # the optimizer's: the same shape at peak 1
    assert [float(shape(k)) for k in (0, 5, 100)] == pytest.approx([0.0, 0.5, 1.0])
    cfg = ppo.PPOConfig(learning_rate=1e-3, lr_schedule="cosine", warmup_steps=0,
                        decay_steps=100, end_lr_ratio=0.1)
    sched = optim.make_schedule(cfg)
    assert float(sched(50)) == pytest.approx(1e-4 + 0.5 * (1e-3 - 1e-4), rel=1e-4)
    assert float(sched(100)) == pytest.approx(1e-4, rel=1e-4)
    assert float(optim.make_optimizer(cfg)[1](100)) == pytest.approx(0.1, rel=1e-4)
