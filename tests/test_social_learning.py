"""The social-learning environment and its metrics, checked against hand computations and
pure-Python references (hash schedule, interpolation, t-distribution tables)."""
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.envs import baselines as bl
from jaxsocial.envs import metrics
from jaxsocial.envs import social_learning as sl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _traj(reward, tokens):
    """A RoundRecord [S, T, N] with given rewards and tokens; other fields zero."""
    reward = np.asarray(reward, np.float32)
    z = np.zeros(reward.shape)
    return sl.RoundRecord(reward=reward, pulled=z > -1, arm=z.astype(int),
                          tokens=np.asarray(tokens),
                         learn_kind=z, requested=z, learn_invalid=z > 0, forced=z > 0,
                         forced_applied=z > 0, regret=z,
                         copied_pull=z > 0, copied_beats_own=z > 0, deployed_via_copy=z > 0,
                         deployed_root=z, mu=z)


# ----------------------------------------------------------------------------- metrics
def test_matched_cost_interpolation_by_hand():
    # one seed, T = 3 rounds, N = 2 agents
    # social: per-round mean rewards 1, 2, 3 -> J = 0, 1, 3, 6;
    #         tokens per round 10 -> C = 0, 10, 20, 30
    social = _traj([[[1, 1], [2, 2], [3, 3]]], [[[5, 5], [5, 5], [5, 5]]])
    # solo: mean rewards 2, 2, 2 -> J = 0, 2, 4, 6; tokens 20, 20, 40 -> C = 0, 20, 40, 80
    solo = _traj([[[2, 2], [2, 2], [2, 2]]], [[[10, 10], [10, 10], [20, 20]]])
    # C* = min(30, 80) = 30. social J(30) = 6. solo J(30): between C=20 (J=2) and C=40 (J=4):
    # 2 + (30-20)/(40-20) * 2 = 3. dJ = 6 - 3 = 3.
    d = metrics.matched_cost_advantage(social, solo)
    np.testing.assert_allclose(d, [3.0])
    # two seeds: second seed swaps roles -> dJ = 3 - 6 = -3
    s2 = jax.tree.map(lambda a, b: np.concatenate([a, b]), social, solo)
    o2 = jax.tree.map(lambda a, b: np.concatenate([a, b]), solo, social)
    np.testing.assert_allclose(metrics.matched_cost_advantage(s2, o2), [3.0, -3.0])


def test_reward_at_cost_flat_segments_and_ends():
    cost = np.array([0, 0, 10, 10, 30])
    reward = np.array([0, 1, 2, 5, 9])
    assert metrics.reward_at_cost(cost, reward, 0) == 1  # last reward reached at cost 0
    assert metrics.reward_at_cost(cost, reward, 10) == 5
    assert metrics.reward_at_cost(cost, reward, 20) == pytest.approx(5 + 0.5 * 4)
    assert metrics.reward_at_cost(cost, reward, 99) == 9
    # all costs zero: matched cost compares final rewards
    social = _traj([[[1.0], [1.0]]], [[[0], [0]]])
    solo = _traj([[[0.5], [0.5]]], [[[0], [0]]])
    np.testing.assert_allclose(metrics.matched_cost_advantage(social, solo), [1.0])
    with pytest.raises(ValueError, match="non-decreasing"):
        metrics.reward_at_cost(np.array([0, 5, 3]), np.array([0, 1, 2]), 4)


def test_student_t_pvalues_match_tables():
    # two-sided critical values from standard t tables
    for t, df, p in [(2.365, 7, 0.05), (3.499, 7, 0.01), (5.408, 7, 0.001), (2.262, 9, 0.05),
                     (1.980, 120, 0.05), (0.0, 5, 1.0)]:
        assert metrics.student_t_sf2(t, df) == pytest.approx(p, rel=2e-3, abs=2e-4)
    x = np.array([1.0, 2.0, 3.0, 4.0])
    m, se = metrics.mean_sem(x)
    assert (m, se) == pytest.approx((2.5, np.std(x, ddof=1) / 2))
    t, p = metrics.one_sample_ttest(x)
    assert t == pytest.approx(2.5 / se)
    scipy_stats = pytest.importorskip("scipy.stats")
    assert p == pytest.approx(scipy_stats.ttest_1samp(x, 0.0).pvalue, rel=1e-4)


# ----------------------------------------------------------------------------- env mechanics
def _round(state, kind, target, learn_tokens, arm, exploit_tokens, params, key=0):
    n = params.num_agents
    def full(v):
        return jnp.broadcast_to(jnp.asarray(v, jnp.int32), (n,))
    la = sl.learn_action(full(kind), full(target), full(learn_tokens))
    ea = sl.exploit_action(full(arm), full(exploit_tokens))
    obs, state, info_l = sl.learn_jit(jax.random.key(key), state, la, params)
    obs, state, r, done, info_e = sl.exploit_jit(jax.random.key(key + 1), state, ea, params)
    return state, r, {**info_l, **info_e}


def test_budget_exhausted_means_no_pull():
    p = sl.EnvParams(num_agents=3, num_arms=5, num_rounds=4, budget=100)
    _, s = sl.reset_jit(jax.random.key(0), p)
    # learning eats the whole budget: nothing left to pull with, reward 0
    s, r, info = _round(s, sl.INNOVATE, 0, 100, sl.PULL_ACQUIRED, 0, p)
    assert not np.asarray(info["pulled"]).any() and np.all(np.asarray(r) == 0)
    np.testing.assert_array_equal(info["tokens"], [100, 100, 100])
    assert np.asarray(info["learn_ok"]).all()  # the innovation itself was affordable
    # a pull that needs more than what is left is missed, and charges only what was left
    s, r, info = _round(s, sl.SKIP, 0, 60, 0, 41, p)
    assert not np.asarray(info["pulled"]).any()
    np.testing.assert_array_equal(info["tokens"], [100, 100, 100])
    s, r, info = _round(s, sl.SKIP, 0, 60, 0, 40, p)
    assert np.asarray(info["pulled"]).all()
    np.testing.assert_array_equal(info["tokens"], [100, 100, 100])
    # a learning action that needs more than the budget fails (performed as SKIP)
    s, r, info = _round(s, sl.INNOVATE, 0, 101, 0, 0, p)
    assert not np.asarray(info["learn_ok"]).any()
    np.testing.assert_array_equal(info["learn_kind"], [sl.SKIP] * 3)


def test_reserve_is_respected():
    p = sl.EnvParams(num_agents=3, num_arms=5, budget=4096, reserve=2048)
    _, s = sl.reset_jit(jax.random.key(1), p)
    s, r, info = _round(s, sl.INNOVATE, 0, 3000, sl.PULL_ACQUIRED, 500, p)
    # learning may not touch the reserve: it fails after spending 4096 - 2048 ...
    assert not np.asarray(info["learn_ok"]).any()
    np.testing.assert_array_equal(info["learn_tokens"], [2048] * 3)
    # ... and the pull is still paid from the reserve (PULL_ACQUIRED with nothing acquired is
    # an invalid arm, so pull arm 0 explicitly next round)
    s, r, info = _round(s, sl.INNOVATE, 0, 2048, 0, 2048, p)
    assert np.asarray(info["learn_ok"]).all() and np.asarray(info["pulled"]).all()
    np.testing.assert_array_equal(info["tokens"], [4096] * 3)
    # without a reserve the same 3000-token learning step succeeds
    p0 = p.replace(reserve=0)
    _, s = sl.reset_jit(jax.random.key(1), p0)
    s, r, info = _round(s, sl.INNOVATE, 0, 3000, sl.PULL_ACQUIRED, 500, p0)
    assert np.asarray(info["learn_ok"]).all() and np.asarray(info["pulled"]).all()


def test_carry_over_budget():
    p = sl.EnvParams(num_agents=3, num_arms=5, budget=100, budget_mode="carry")
    obs, s = sl.reset_jit(jax.random.key(2), p)
    np.testing.assert_array_equal(obs.available, [100] * 3)
    s, _, _ = _round(s, sl.SKIP, 0, 30, 0, 0, p)  # spend 30 of 100
    np.testing.assert_array_equal(s.available, [170] * 3)
    s, _, info = _round(s, sl.SKIP, 0, 170, 0, 0, p)  # spend everything
    np.testing.assert_array_equal(s.available, [100] * 3)
    pe = p.replace(budget_mode="expire")
    _, s = sl.reset_jit(jax.random.key(2), pe)
    s, _, _ = _round(s, sl.SKIP, 0, 30, 0, 0, pe)
    np.testing.assert_array_equal(s.available, [100] * 3)


def test_forced_schedule_matches_reference_and_is_shared(closed_runs):
    p, keys, runs = closed_runs
    st_solo, tr_solo = runs["solo_ucb"]
    st_soc, tr_soc = runs["hierarchical_ucb"]
    forced = np.asarray(tr_soc.forced)
    np.testing.assert_array_equal(forced, np.asarray(tr_solo.forced))  # matched populations
    np.testing.assert_array_equal(forced, np.asarray(runs["random"][1].forced))
    # pure-Python reference of the hash schedule
    for b in range(keys.shape[0]):
        seed = int(st_soc.seed[b])
        ref = [[hash_py(seed, t, i) / 2**32 < 0.15 for i in range(p.num_agents)]
               for t in range(p.num_rounds)]
        np.testing.assert_array_equal(forced[b], np.asarray(ref))
    assert 0.05 < forced.mean() < 0.3
    # forced agents never observe and innovate (while some arm is unknown to them)
    for name in ("hierarchical_ucb", "random"):
        tr = runs[name][1]
        kinds, applied = np.asarray(tr.learn_kind), np.asarray(tr.forced_applied)
        assert (applied <= forced).all() and applied.sum() > 0.5 * forced.sum()
        assert (kinds[applied] == sl.INNOVATE).all()
        assert not (np.asarray(tr.requested)[forced & ~applied] == -1).any()
    # the forced agent pulls the innovated arm: it was acquired in that very round
    st, tr = runs["random"]
    b, t, i = np.argwhere(forced & (np.asarray(tr.learn_kind) == sl.INNOVATE))[0]
    arm = int(tr.arm[b, t, i])
    assert int(st.acquired_at[b, i, arm]) == t and int(st.origin[b, i, arm]) == sl.ORIGIN_INNOVATED


def hash_py(*xs):
    return sl.hash_u32_py(*xs)


def test_hash_twins_agree():
    for xs in [(0, 0, 0), (123456789, 99, 7), (2**32 - 1, 5, 3)]:
        assert int(sl.hash_u32(*[jnp.uint32(x) for x in xs])) == sl.hash_u32_py(*xs)


# ----------------------------------------------------------------------------- lineage / observe
def _rand_learn(key, ps, obs, params):
    n = params.num_agents
    k1, k2 = jax.random.split(key)
    kind = jax.random.randint(k1, (n,), 0, 4)
    target = jax.random.randint(k2, (n,), 0, n)
    return sl.learn_action(kind, target), ps


def _rand_exploit(key, ps, obs, params):
    arm = sl.random_choice_mask(key, obs.known | params.open_arms)
    return sl.exploit_action(jnp.where(arm >= 0, arm, sl.PULL_NONE)), ps


# Uniformly random learning actions (incl. revise and observe j) and random pulls.
RANDOM = sl.Policy("random", bl._empty_init, _rand_learn, _rand_exploit, bl._no_update)


@pytest.fixture(scope="module")
def closed_runs():
    """Closed repertoire, forced search; populations matched by seed. Shapes (and static
    settings) equal configs "small", so these share compiled programs with the other tests."""
    p = sl.EnvParams(num_agents=4, num_arms=6, num_rounds=10, forced_search_prob=0.15,
                     open_arms=False)
    keys = jax.random.split(jax.random.key(3), 3)
    solo = p.replace(social=False)
    def run(pol, params):
        return sl.rollout_batch(keys, pol, params, fast_compile=True)
    runs = {"solo_ucb": run(bl.solo_ucb, solo),
            "hierarchical_ucb": run(bl.hierarchical_ucb, p),
            "hierarchical_ucb_solo": run(bl.hierarchical_ucb, solo),
            "random": run(RANDOM, p),
            "random_solo": run(RANDOM, solo)}
    return p, keys, runs


def test_solo_populations_never_observe(closed_runs):
    _, _, runs = closed_runs
    for name in ("random_solo", "hierarchical_ucb_solo", "solo_ucb"):
        st, tr = runs[name]
        kinds, req = np.asarray(tr.learn_kind), np.asarray(tr.requested)
        assert not (kinds == sl.OBSERVE).any()
        assert not (np.asarray(st.origin) == sl.ORIGIN_COPIED).any()
    # the random policy did ask to observe: counted as invalid, not fatal
    req = np.asarray(runs["random_solo"][1].requested)
    assert (req == sl.OBSERVE).any()
    asked = (req == sl.OBSERVE) & ~np.asarray(runs["random_solo"][1].forced)  # forced: overridden
    assert np.asarray(runs["random_solo"][1].learn_invalid)[asked].all()
    # while the same seeds in a social population do observe
    assert (np.asarray(runs["random"][1].learn_kind) == sl.OBSERVE).any()


def test_lineage_is_consistent(closed_runs):
    p, keys, runs = closed_runs
    n, k = p.num_agents, p.num_arms
    counts = {o: 0 for o in (1, 2, 3)}
    for name in ("random", "hierarchical_ucb"):
        st = runs[name][0]
        origin, source = np.asarray(st.origin), np.asarray(st.source)
        parent, root = np.asarray(st.parent), np.asarray(st.root)
        at, known, via = np.asarray(st.acquired_at), np.asarray(st.known), np.asarray(st.via_copy)
        for b in range(keys.shape[0]):
            for i in range(n):
                for a in range(k):
                    o = origin[b, i, a]
                    assert known[b, i, a] == (o != sl.ORIGIN_NONE)
                    assert (at[b, i, a] >= 0) == known[b, i, a]
                    if o == sl.ORIGIN_INNOVATED:
                        assert root[b, i, a] == i and not via[b, i, a]
                    elif o == sl.ORIGIN_COPIED:
                        j = source[b, i, a]
                        assert j != i and known[b, j, a]
                        # the source held the arm before (it pulled it in an earlier round)
                        assert at[b, j, a] < at[b, i, a]
                        assert root[b, i, a] == root[b, j, a] and via[b, i, a]
                    elif o == sl.ORIGIN_REVISED:
                        q = parent[b, i, a]
                        assert known[b, i, q] and at[b, i, q] <= at[b, i, a]
                        assert (a - q) % k in (1, k - 1)
                        assert root[b, i, a] == root[b, i, q] and via[b, i, a] == via[b, i, q]
                    if o in counts:
                        counts[o] += 1
    assert all(v > 0 for v in counts.values()), counts


def test_copy_error_and_estimate_noise():
    p = sl.EnvParams(num_agents=3, num_arms=5, copy_error=1.0, obs_noise=0.5)
    _, s = sl.reset_jit(jax.random.key(6), p)
    s, _, _ = _round(s, sl.SKIP, 0, 0, jnp.array([0, 1, 2]), 0, p)  # everyone pulls
    la = sl.learn_action(jnp.array([sl.OBSERVE] * 3), jnp.array([1, 2, 0]))
    obs, s2, info = sl.learn_jit(jax.random.key(7), s, la, p)
    observed = np.asarray(s.last_arm)[[1, 2, 0]]
    assert (np.asarray(obs.acquired) != observed).all()  # every copy went wrong
    assert (np.asarray(obs.acquired_reward) != np.asarray(s.last_reward)[[1, 2, 0]]).all()
    new = np.asarray(s2.origin)[np.arange(3), np.asarray(obs.acquired)]
    assert ((new == sl.ORIGIN_MISCOPIED) | (new == sl.ORIGIN_INNOVATED)).all()
    # without errors/noise: exact arm and reward
    p0 = p.replace(copy_error=0.0, obs_noise=0.0)
    obs, s3, _ = sl.learn_jit(jax.random.key(7), s, la, p0)
    np.testing.assert_array_equal(obs.acquired, observed)
    np.testing.assert_allclose(obs.acquired_reward, np.asarray(s.last_reward)[[1, 2, 0]])
    # observing adds exactly one sample to the copier's estimate
    i = np.arange(3)
    np.testing.assert_array_equal(np.asarray(s3.est_count)[i, observed],
                                  np.asarray(s.est_count)[i, observed] + 1)


# ----------------------------------------------------------------------------- arms and drift
def test_arm_distributions_have_mean_one():
    for dist, shape in [("exponential", 1.0), ("weibull", 0.6), ("weibull", 2.0)]:
        p = sl.EnvParams(num_arms=20000, arm_dist=dist, weibull_shape=shape)
        mu = np.asarray(sl.draw_means(jax.random.key(8), p))
        assert mu.mean() == pytest.approx(1.0, abs=0.04), (dist, shape)
        assert (mu >= 0).all()
    # exponential: std 1; Weibull(2): std sqrt(4/pi - 1) ~ 0.523 after normalisation
    mu = np.asarray(sl.draw_means(jax.random.key(9), sl.EnvParams(num_arms=20000)))
    assert mu.std() == pytest.approx(1.0, abs=0.05)
    mu = np.asarray(sl.draw_means(jax.random.key(9), sl.EnvParams(
        num_arms=20000, arm_dist="weibull", weibull_shape=2.0)))
    assert mu.std() == pytest.approx(math.sqrt(4 / math.pi - 1), abs=0.03)
    # ring correlation: neighbours correlated, marginal unchanged
    mu = np.asarray(sl.draw_means(jax.random.key(10), sl.EnvParams(num_arms=20000, ring_width=3.0)))
    assert np.corrcoef(mu, np.roll(mu, 1))[0, 1] > 0.5 and mu.mean() == pytest.approx(1, abs=0.1)


def _mu_path(params, rounds, key=11):
    """Arm means at the start of each round, stepping the env with no pulls."""
    _, s = sl.reset_jit(jax.random.key(key), params)
    none = sl.exploit_action(jnp.full((params.num_agents,), sl.PULL_NONE))
    mus = []
    for t in range(rounds):
        mus.append(np.asarray(s.mu))
        _, s, _, _, _ = sl.exploit_jit(jax.random.key(1000 + t), s, none, params)
    return np.stack(mus)


def test_drift_modes():
    base = sl.EnvParams(num_agents=3, num_arms=5, num_rounds=30)
    mu = _mu_path(base, 30)
    assert (mu == mu[:1]).all()
    mu = _mu_path(base.replace(drift="periodic", period=10), 30)
    changed = (mu[1:] != mu[:-1]).any(-1)  # change between round t-1 and t
    expect = np.zeros(29, bool)
    expect[[9, 19]] = True  # rounds 10 and 20 start with fresh means
    np.testing.assert_array_equal(changed, expect)
    assert (mu[10] != mu[9]).all()  # every arm redrawn
    mu = _mu_path(base.replace(drift="per_arm", p_change=0.2), 30)
    frac = (mu[1:] != mu[:-1]).mean()
    assert 0.1 < frac < 0.3


def test_periodic_redraw_resets_estimates():
    p = sl.EnvParams(num_agents=3, num_arms=5, num_rounds=30, drift="periodic", period=3)
    _, s = sl.reset_jit(jax.random.key(12), p)
    for t in range(2):
        s, _, _ = _round(s, sl.SKIP, 0, 0, t, 0, p, key=2 * t)
    assert not bool(s.redrawn) and int(np.asarray(s.est_count).sum()) == 3 * 2
    s, _, _ = _round(s, sl.SKIP, 0, 0, 2, 0, p, key=4)
    assert bool(s.redrawn) and int(np.asarray(s.est_count).sum()) == 0
    assert np.asarray(s.known).sum() == 3 * 3  # the repertoire survives


def test_bad_params_raise_clear_errors():
    with pytest.raises(ValueError, match="drift.*'sideways'"):
        sl.EnvParams(drift="sideways").validate()
    with pytest.raises(ValueError, match="reserve"):
        sl.EnvParams(budget=100, reserve=200).validate()
    with pytest.raises(ValueError, match="copy_error"):
        sl.reset(jax.random.key(0), sl.EnvParams(copy_error=1.5))
    with pytest.raises(ValueError, match="forced_search_prob"):
        sl.rollout_batch(jax.random.split(jax.random.key(0), 2), bl.solo_ucb,
                         sl.EnvParams(forced_search_prob=-0.1))
    with pytest.raises(ValueError, match="unknown baseline 'ucb9'"):
        bl.get("ucb9")


# ----------------------------------------------------------------------------- entry point
def test_entry_point_writes_results(tmp_path, capsys):
    from conftest import load_config_file, load_launcher
    mod = load_launcher("launch/tournament.py")
    cfg = load_config_file("configs/social_learning.py", "small")
    with cfg.unlocked():
        cfg.baselines = ["solo_ucb", "hierarchical_ucb"]  # the rest: test_baselines.small_runs
    mod.run(cfg, str(tmp_path))
    res = json.loads((tmp_path / "results.json").read_text())
    pol = res["policies"]
    assert set(pol) == set(cfg.baselines)
    for name, row in pol.items():
        for key in ("J_mean", "J_sem", "distinct_arms", "completion"):
            assert key in row
        if name != "solo_ucb":
            assert {"dJ_C", "dJ_C_sem", "dJ_C_p"} <= set(row)
            assert len(row["dJ_C_per_seed"]) == cfg.num_seeds
    out = capsys.readouterr().out
    assert "hierarchical_ucb" in out and "dJ(C*)" in out
    with pytest.raises(ValueError, match="unknown social_learning config variant"):
        load_config_file("configs/social_learning.py", "nope")
