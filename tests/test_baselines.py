"""Baseline policies against pure-Python references of their rules, and the qualitative result."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.envs import baselines as bl
from jaxsocial.envs import metrics
from jaxsocial.envs import social_learning as sl

ucb_pick = jax.jit(bl.ucb_pick, compiler_options=sl.FAST_COMPILE)
h_learn = jax.jit(bl.hierarchical_ucb.learn, compiler_options=sl.FAST_COMPILE)
h_exploit = jax.jit(bl.hierarchical_ucb.exploit, compiler_options=sl.FAST_COMPILE)
h_update = jax.jit(bl.hierarchical_ucb.update, compiler_options=sl.FAST_COMPILE)


def _random_memory(rng, n, k, p_known=0.7, p_untried=0.15):
    known = rng.random((n, k)) < p_known
    known[:, 0] = True
    count = rng.integers(1, 6, (n, k)) * (rng.random((n, k)) > p_untried)
    count = np.where(known, count, 0)
    s = rng.normal(1.0, 1.0, (n, k)) * count
    return known, s.astype(np.float32), count.astype(np.int32)


def ucb1_reference(known, s, c, u):
    """UCB1 over the `known` arms of one agent: untried first (tie-break = highest u), else
    argmax mean + sqrt(2 ln n / n_k)."""
    untried = [k for k in range(len(known)) if known[k] and c[k] == 0]
    if untried:
        return max(untried, key=lambda k: u[k])
    n = sum(int(x) for x in c)
    best, arm = -math.inf, -1
    for k in range(len(known)):
        if known[k]:
            v = s[k] / c[k] + math.sqrt(2 * math.log(n) / c[k])
            if v > best:
                best, arm = v, k
    return arm


def test_ucb1_matches_reference():
    rng = np.random.default_rng(0)
    for trial in range(20):
        n, k = 7, 11
        known, s, c = _random_memory(rng, n, k, p_untried=0.15 if trial % 2 else 0.0)
        key = jax.random.key(trial)
        got = np.asarray(ucb_pick(key, jnp.asarray(s), jnp.asarray(c), jnp.asarray(known)))
        u = np.asarray(jax.random.uniform(key, (n, k)))  # the tie-break draw ucb_pick uses
        ref = [ucb1_reference(known[i], s[i], c[i], u[i]) for i in range(n)]
        np.testing.assert_array_equal(got, ref)


def _obs(known, s, c, last_arm, last_reward, t=5, forced=None):
    n = known.shape[0]
    z = jnp.zeros((n,), jnp.int32)
    return sl.Observation(
        t=jnp.int32(t), redrawn=jnp.bool_(False), known=jnp.asarray(known),
        est_sum=jnp.asarray(s), est_count=jnp.asarray(c), last_arm=jnp.asarray(last_arm, jnp.int32),
        last_reward=jnp.asarray(last_reward, jnp.float32), available=z + 4096, remaining=z + 4096,
        forced=jnp.zeros((n,), bool) if forced is None else jnp.asarray(forced),
        learn_kind=z, acquired=z - 1, acquired_reward=jnp.zeros((n,)))


def hier_reference(src_sum, src_count, eligible, i, mu0=1.0, bonus=0.5):
    """Outer source choice of agent i (pure Python)."""
    n = len(src_sum)
    total = sum(int(x) for x in src_count)
    best, choice = -math.inf, None
    for s in range(n):
        if s != i and not eligible[s]:
            continue
        m0 = mu0 + bonus if s == i else mu0
        v = (src_sum[s] + m0) / (src_count[s] + 1) + math.sqrt(
            2 * math.log(max(total + n, 2)) / (src_count[s] + 1))
        if v > best:
            best, choice = v, s
    return choice


def test_hierarchical_ucb_matches_reference():
    rng = np.random.default_rng(1)
    n, k = 6, 9
    params = sl.EnvParams(num_agents=n, num_arms=k, open_arms=True)
    for trial in range(20):
        known, s, c = _random_memory(rng, n, k)
        last_arm = np.where(rng.random(n) < 0.7, rng.integers(0, k, n), -1)
        last_reward = rng.normal(1.5, 1, n)
        ps = bl.HierState(jnp.asarray(rng.normal(2, 2, (n, n)) * (trial % 3 != 0), jnp.float32),
                          jnp.asarray(rng.integers(0, 5, (n, n)), jnp.int32),
                          jnp.zeros((n,), jnp.int32))
        if trial % 4 == 0:  # fresh stats: the prior decides
            ps = bl._hier_init(None, params)
        obs = _obs(known, s, c, last_arm, last_reward)
        action, ps2 = h_learn(jax.random.key(trial), ps, obs, params)
        src_sum, src_count = np.asarray(ps.src_sum), np.asarray(ps.src_count)
        for i in range(n):
            eligible = [j != i and last_arm[j] >= 0 for j in range(n)]
            choice = hier_reference(src_sum[i], src_count[i], eligible, i)
            assert int(ps2.choice[i]) == choice
            if choice == i:
                assert int(action.kind[i]) == sl.SKIP  # open arms: self needs no learning action
                np.testing.assert_array_equal(ps2.src_count[i], src_count[i])
            else:
                assert int(action.kind[i]) == sl.OBSERVE and int(action.target[i]) == choice
                # choosing peer j credits j's last reward to j's source stats
                exp_sum = src_sum[i].copy()
                exp_sum[choice] += np.float32(last_reward[choice])
                np.testing.assert_allclose(ps2.src_sum[i], exp_sum, rtol=1e-6)
                assert int(ps2.src_count[i, choice]) == src_count[i, choice] + 1
    # a solo population only ever has the self source
    solo = params.replace(social=False)
    action, ps2 = h_learn(jax.random.key(0), bl._hier_init(None, solo), obs, solo)
    np.testing.assert_array_equal(ps2.choice, np.arange(n))


def test_hierarchical_round_through_env():
    """One env round: the observed (arm, reward) enters the inner UCB as one sample, the pull is
    the UCB1 choice on that memory, and self-choosers' source stats get their own reward."""
    n, k = 3, 5  # same programs as test_social_learning's single-round tests
    p = sl.EnvParams(num_agents=n, num_arms=k)
    _, s = sl.reset(jax.random.key(3), p)
    ps = bl._hier_init(None, p)
    key = jax.random.key(4)
    for r in range(6):
        key, k1, k2, k3, k4 = jax.random.split(key, 5)
        la, ps = h_learn(k1, ps, sl._obs(s), p)
        obs, s_l, _ = sl.learn_jit(k2, s, la, p)
        ea, ps = h_exploit(k3, ps, obs, p)
        # reference inner choice on the post-learning memory
        u = np.asarray(jax.random.uniform(k3, (n, k)))
        es, ec = np.asarray(obs.est_sum), np.asarray(obs.est_count)
        pullable = np.ones((n, k), bool)  # open arms: every arm may be pulled
        ref = [ucb1_reference(pullable[i], es[i], ec[i], u[i]) for i in range(n)]
        np.testing.assert_array_equal(ea.arm, ref)
        observed = np.asarray(obs.learn_kind) == sl.OBSERVE
        for i in np.flatnonzero(observed):
            j = int(la.target[i])
            a = int(obs.acquired[i])
            assert a == int(s.last_arm[j])
            assert ec[i, a] == int(s.est_count[i, a]) + 1
        src_before = np.asarray(ps.src_sum)
        _, s, reward, _, info = sl.exploit_jit(k4, s_l, ea, p)
        ps_new = h_update(ps, None, reward, info, p)
        for i in range(n):
            delta = np.asarray(ps_new.src_sum)[i] - src_before[i]
            if int(ps.choice[i]) == i and bool(info["pulled"][i]):
                assert delta[i] == pytest.approx(float(reward[i]), abs=1e-5)
            assert np.count_nonzero(np.delete(delta, i)) == 0
        ps = ps_new


def test_copy_best_rule():
    n, k = 3, 5
    p = sl.EnvParams(num_agents=n, num_arms=k)
    known = np.ones((n, k), bool)
    c = np.ones((n, k), np.int32)
    s = np.array([[0, 0.5, 0, 0, 0], [0, 0, 3.0, 0, 0], [0, 0, 0, 0.2, 0]], np.float32)
    obs = _obs(known, s, c, [1, 2, 3], [0.4, 2.5, 0.9])
    la, copy = bl.copy_best.learn(jax.random.key(0), bl.copy_best.init(None, p), obs, p)
    # agent 0 and 2 observe agent 1 (best last reward 2.5); agent 1 observes agent 2 (0.9)
    np.testing.assert_array_equal(la.target, [1, 2, 1])
    np.testing.assert_array_equal(la.kind, [sl.OBSERVE] * 3)
    # 2.5 beats agent 0's best (0.5) and agent 2's (0.2); 0.9 does not beat agent 1's 3.0
    np.testing.assert_array_equal(copy, [True, False, True])


@pytest.fixture(scope="module")
def small_runs():
    p = sl.EnvParams(num_agents=4, num_arms=6, num_rounds=10)  # = configs "small": shared programs
    keys = jax.random.split(jax.random.key(0), 3)
    return p, keys, {name: sl.rollout_batch(keys, pol, p, fast_compile=True)
                     for name, pol in bl.BASELINES.items()}


def test_all_baselines_vmapped_and_deterministic(small_runs):
    p, keys, runs = small_runs
    for name, pol in bl.BASELINES.items():
        st, tr = runs[name]
        assert tr.reward.shape == (3, 10, 4)
        assert np.isfinite(np.asarray(tr.reward)).all()
        assert np.asarray(tr.pulled).mean() > 0.9, name
        st2, tr2 = sl.rollout_batch(keys, pol, p, fast_compile=True)  # same seeds -> same run
        np.testing.assert_array_equal(tr.reward, tr2.reward)
        # different seeds differ
        assert not np.array_equal(np.asarray(tr.reward[0]), np.asarray(tr.reward[1]))
    kinds = {n: np.asarray(runs[n][1].learn_kind) for n in runs}
    assert (kinds["random_copy"][:, 1:] == sl.OBSERVE).all()  # observes every round once possible
    assert (kinds["discounting_observer"] == sl.INNOVATE).any()


def test_hierarchical_beats_solo_ucb():
    """Qualitative: 8 seeds, 10 agents x 25 arms x 100 rounds (paper: +25.68 +- 2.87, p < .001)."""
    p = sl.EnvParams()
    keys = jax.random.split(jax.random.key(0), 8)
    _, solo = sl.rollout_batch(keys, bl.solo_ucb, p.replace(social=False), fast_compile=True)
    _, hier = sl.rollout_batch(keys, bl.hierarchical_ucb, p, fast_compile=True)
    cmp = metrics.compare(hier, solo)
    print(f"hier - solo UCB: dJ = {cmp['dJ_final']:.2f} +- {cmp['dJ_final_sem']:.2f}, "
          f"p = {cmp['dJ_final_p']:.2g}")
    assert cmp["dJ_final"] > 0 and cmp["dJ_final_p"] < 0.01
