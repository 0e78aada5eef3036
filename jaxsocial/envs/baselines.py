"""Algorithmic baselines for the social-learning tournament, as pure `Policy`s.

Every policy acts for a whole population (arrays [N, ...]) and is vmapped over seeds by
`social_learning.rollout_batch`. Rules (spec `social_learning.md`, "Baselines"):

- solo UCB1: untried arms first (random tie-break; a known untried arm needs no learning, an
  unknown one is innovated first), else argmax_k mean_k + sqrt(2 ln n / n_k) over own samples.
- hierarchical social UCB (Shin, Lee & Ok 2022): an outer UCB over sources {self} + peers that
  have pulled, each with one pseudo-observation at mu0 (self mu0 + 0.5):
  index_s = (sum_s + mu0_s) / (count_s + 1) + sqrt(2 ln max(total + N, 2) / (count_s + 1)),
  total = sum_s count_s. Self -> the solo UCB1 learning step, and self's stats get the agent's own
  reward; peer j -> OBSERVE j, j's stats get j's last reward, and (j's arm, reward) enters the
  inner arm-UCB as one sample. The inner UCB1 (over known arms, own + observed samples) picks
  the pull. All statistics reset when the means are redrawn.
- random-copy: observe a uniformly random peer that has pulled each round (solo UCB1 learning
  step when none has), then UCB1 over known arms (own + observed samples).
- copy-best: observe the peer with the best last reward; pull its arm if that reward beats
  your own best estimate, else your best-estimate arm.
- discounting observer (after DISCOUNTMACHINE): p = 1/sqrt(t+1); innovate with prob p, else
  observe a random peer if 20 rounds passed without observing, after a >3 sigma surprise, or
  with prob p; else skip. Estimates S/max(W, 1) with S, W decaying by 0.95 per round, so stale
  estimates shrink; pull the best estimate (an untried known arm first).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxsocial.envs import social_learning as sl


# ----------------------------------------------------------------------------- building blocks
def ucb_scores(est_sum, est_count, known):
    """UCB1 index over pullable arms `known`. [N, K] -> [N, K]; untried +inf, unpullable -inf.

    index_k = sum_k / n_k + sqrt(2 ln n / n_k), n = sum_k n_k.
    """
    n = jnp.maximum(jnp.sum(est_count, -1, keepdims=True), 1).astype(jnp.float32)
    cnt = jnp.maximum(est_count, 1).astype(jnp.float32)
    idx = est_sum / cnt + jnp.sqrt(2.0 * jnp.log(n) / cnt)
    idx = jnp.where(est_count == 0, jnp.inf, idx)
    return jnp.where(known, idx, -jnp.inf)


def ucb_pick(key, est_sum, est_count, known):
    """[N] arm: a uniformly random untried pullable arm if any, else argmax UCB1 (-1: none).

    `known` [N, K] marks the pullable arms: the repertoire, or every arm when `open_arms`.
    """
    untried = known & (est_count == 0)
    rnd = sl.random_choice_mask(key, untried)
    best = sl.argmax_last(ucb_scores(est_sum, est_count, known))
    best = jnp.where(known.any(-1), best, -1)
    return jnp.where(untried.any(-1), rnd, best)


def pullable(obs: sl.Observation, params: sl.EnvParams):
    """[N, K] arms a pull may target: every arm with `open_arms`, else the repertoire."""
    return obs.known | params.open_arms


def solo_learn_kind(obs: sl.Observation, params: sl.EnvParams):
    """[N] learning action of UCB1's "untried arms first": with a closed repertoire, innovate
    only when every known arm has been tried and some arm is still unknown; otherwise (and
    always with `open_arms`, where untried arms are pulled directly) skip."""
    known_untried = (obs.known & (obs.est_count == 0)).any(-1)
    unknown = (~obs.known).any(-1)
    innovate = ~known_untried & unknown & ~jnp.asarray(params.open_arms)
    return jnp.where(innovate, sl.INNOVATE, sl.SKIP).astype(jnp.int32)


def _eligible_peers(obs: sl.Observation, params: sl.EnvParams):
    """[N, N] bool: peer j is observable by agent i (social, j != i, j has pulled)."""
    n = params.num_agents
    has = (obs.last_arm >= 0)[None, :] & ~jnp.eye(n, dtype=bool)
    return has & params.social


def _exploit_ucb(key, pstate, obs, params):
    arm = ucb_pick(key, obs.est_sum, obs.est_count, pullable(obs, params))
    return sl.exploit_action(jnp.where(arm >= 0, arm, sl.PULL_NONE)), pstate


def _no_update(pstate, obs, reward, info, params):
    return pstate


def _empty_init(key, params):
    return jnp.zeros((), jnp.int32)


# ----------------------------------------------------------------------------- solo UCB1
def _solo_learn(key, pstate, obs, params):
    return sl.learn_action(solo_learn_kind(obs, params)), pstate


solo_ucb = sl.Policy("solo_ucb", _empty_init, _solo_learn, _exploit_ucb, _no_update)


# ----------------------------------------------------------------------------- hierarchical UCB
@struct.dataclass
class HierState:
    src_sum: jax.Array  # [N, N] agent i's reward sum credited to source s (s == i: self)
    src_count: jax.Array  # [N, N]
    choice: jax.Array  # [N] int32 source picked this round


HIER_MU0 = 1.0
HIER_SELF_BONUS = 0.5


def hier_outer_scores(src_sum, src_count, eligible_peer, mu0=HIER_MU0, self_bonus=HIER_SELF_BONUS):
    """Outer source index. src_* [N, N], eligible_peer [N, N] -> [N, N] (-inf ineligible).

    index_s = (sum_s + mu0_s) / (count_s + 1) + sqrt(2 ln max(total + N, 2) / (count_s + 1)),
    mu0_self = mu0 + self_bonus, total = sum_s count_s.
    """
    n = src_sum.shape[-1]
    eye = jnp.eye(n, dtype=bool)
    mu0s = jnp.where(eye, mu0 + self_bonus, mu0)
    total = jnp.sum(src_count, -1, keepdims=True).astype(jnp.float32)
    c1 = src_count.astype(jnp.float32) + 1.0
    idx = (src_sum + mu0s) / c1 + jnp.sqrt(2.0 * jnp.log(jnp.maximum(total + n, 2.0)) / c1)
    return jnp.where(eye | eligible_peer, idx, -jnp.inf)


def _hier_init(key, params):
    n = params.num_agents
    return HierState(jnp.zeros((n, n), jnp.float32), jnp.zeros((n, n), jnp.int32),
                     jnp.arange(n, dtype=jnp.int32))


def _hier_learn(key, ps: HierState, obs, params):
    n = params.num_agents
    agents = jnp.arange(n)
    # statistics reset when all means were redrawn
    ps = jax.tree.map(lambda x: jnp.where(obs.redrawn, jnp.zeros_like(x), x), ps)
    eligible = _eligible_peers(obs, params) & ~obs.forced[:, None]
    choice = sl.argmax_last(hier_outer_scores(ps.src_sum, ps.src_count, eligible))
    peer = choice != agents
    kind = jnp.where(peer, sl.OBSERVE, solo_learn_kind(obs, params))
    # choosing peer j credits j's (snapshot) reward to j's source stats now
    onehot = (agents[None, :] == choice[:, None]) & peer[:, None]
    r_peer = obs.last_reward[choice]
    ps = HierState(ps.src_sum + jnp.where(onehot, r_peer[:, None], 0.0),
                   ps.src_count + onehot.astype(jnp.int32), choice)
    return sl.learn_action(kind, target=choice), ps


def _hier_update(ps: HierState, obs, reward, info, params):
    n = params.num_agents
    agents = jnp.arange(n)
    self_pull = (ps.choice == agents) & info["pulled"]
    eye = jnp.eye(n, dtype=bool) & self_pull[:, None]
    return ps.replace(src_sum=ps.src_sum + jnp.where(eye, reward[:, None], 0.0),
                      src_count=ps.src_count + eye.astype(jnp.int32))


hierarchical_ucb = sl.Policy("hierarchical_ucb", _hier_init, _hier_learn, _exploit_ucb,
                             _hier_update)


# ----------------------------------------------------------------------------- random-copy
def _random_copy_learn(key, pstate, obs, params):
    eligible = _eligible_peers(obs, params)
    target = sl.random_choice_mask(key, eligible)
    kind = jnp.where(target >= 0, sl.OBSERVE, solo_learn_kind(obs, params))
    return sl.learn_action(kind, target=jnp.maximum(target, 0)), pstate


random_copy = sl.Policy("random_copy", _empty_init, _random_copy_learn, _exploit_ucb, _no_update)


# ----------------------------------------------------------------------------- copy-best
def own_best(est_sum, est_count, known):
    """-> (best mean [N] (-inf if nothing sampled), its arm [N] (-1))."""
    sampled = known & (est_count > 0)
    mean = jnp.where(sampled, est_sum / jnp.maximum(est_count, 1), -jnp.inf)
    arm = sl.argmax_last(mean)
    return jnp.max(mean, -1), jnp.where(sampled.any(-1), arm, -1)


def _copy_best_init(key, params):
    return jnp.zeros((params.num_agents,), bool)  # copy this round's observed arm


def _copy_best_learn(key, pstate, obs, params):
    eligible = _eligible_peers(obs, params)
    scores = jnp.where(eligible, obs.last_reward[None, :], -jnp.inf)
    target = sl.argmax_last(scores)
    has = eligible.any(-1)
    best_val, _ = own_best(obs.est_sum, obs.est_count, obs.known)
    copy = has & (obs.last_reward[target] > best_val)
    kind = jnp.where(has, sl.OBSERVE, solo_learn_kind(obs, params))
    return sl.learn_action(kind, target=target), copy


def _copy_best_exploit(key, copy, obs, params):
    _, best_arm = own_best(obs.est_sum, obs.est_count, obs.known)
    # without any sampled arm (e.g. just innovated): untried-first like UCB1
    fallback = ucb_pick(key, obs.est_sum, obs.est_count, pullable(obs, params))
    mine = jnp.where(best_arm >= 0, best_arm, fallback)
    mine = jnp.where(pullable(obs, params).any(-1), mine, sl.PULL_NONE)
    use_copy = copy & (obs.learn_kind == sl.OBSERVE) & (obs.acquired >= 0)
    untried = (obs.known & (obs.est_count == 0)).any(-1)
    mine = jnp.where(untried, fallback, mine)
    return sl.exploit_action(jnp.where(use_copy, obs.acquired, mine)), copy


copy_best = sl.Policy("copy_best", _copy_best_init, _copy_best_learn, _copy_best_exploit,
                      _no_update)


# ----------------------------------------------------------------------------- discounting observer
@struct.dataclass
class DiscountState:
    s: jax.Array  # [N, K] discounted reward sums
    w: jax.Array  # [N, K] discounted sample weights
    since_obs: jax.Array  # [N] int32 rounds since the last successful observation
    surprise: jax.Array  # [N] bool last own pull deviated > 3 sigma from its estimate


DISCOUNT = 0.95
OBSERVE_AFTER = 20
SURPRISE_SIGMA = 3.0


def discount_estimates(s, w):
    """S / max(W, 1): the discounted mean while evidence is fresh, shrinking once stale."""
    return s / jnp.maximum(w, 1.0)


def _disc_init(key, params):
    n, k = params.num_agents, params.num_arms
    return DiscountState(jnp.zeros((n, k)), jnp.zeros((n, k)), jnp.zeros((n,), jnp.int32),
                         jnp.zeros((n,), bool))


def _disc_learn(key, ps: DiscountState, obs, params):
    n = params.num_agents
    k_u1, k_u2, k_peer = jax.random.split(key, 3)
    p = 1.0 / jnp.sqrt(obs.t.astype(jnp.float32) + 1.0)
    u1 = jax.random.uniform(k_u1, (n,))
    u2 = jax.random.uniform(k_u2, (n,))
    unknown = (~obs.known).any(-1)
    eligible = _eligible_peers(obs, params)
    target = sl.random_choice_mask(k_peer, eligible)
    want_obs = (ps.since_obs >= OBSERVE_AFTER) | ps.surprise | (u2 < p)
    kind = jnp.where((u1 < p) & unknown, sl.INNOVATE,
                     jnp.where(want_obs & (target >= 0), sl.OBSERVE, sl.SKIP))
    # nothing known and nobody to observe: the only way to get an arm
    kind = jnp.where(~obs.known.any(-1) & (kind == sl.SKIP), sl.INNOVATE, kind)
    return sl.learn_action(kind, target=jnp.maximum(target, 0)), ps


def _disc_exploit(key, ps: DiscountState, obs, params):
    k = params.num_arms
    got = (obs.learn_kind == sl.OBSERVE) & (obs.acquired >= 0)
    onehot = (jnp.arange(k)[None, :] == obs.acquired[:, None]) & got[:, None]
    s = ps.s + jnp.where(onehot, obs.acquired_reward[:, None], 0.0)
    w = ps.w + onehot
    est = jnp.where(obs.known & (w > 0), discount_estimates(s, w), -jnp.inf)
    untried = obs.known & (w == 0)
    rnd = sl.random_choice_mask(key, untried)
    best = sl.argmax_last(est)
    arm = jnp.where(untried.any(-1), rnd, best)
    arm = jnp.where(obs.known.any(-1), arm, sl.PULL_NONE)
    ps = ps.replace(s=s, w=w, since_obs=jnp.where(got, 0, ps.since_obs))
    return sl.exploit_action(arm), ps


def _disc_update(ps: DiscountState, obs, reward, info, params):
    k = params.num_arms
    pulled = info["pulled"]
    arm = jnp.maximum(info["arm"], 0)
    onehot = (jnp.arange(k)[None, :] == arm[:, None]) & pulled[:, None]
    w_arm = jnp.take_along_axis(ps.w, arm[:, None], 1)[:, 0]
    est_before = jnp.take_along_axis(discount_estimates(ps.s, ps.w), arm[:, None], 1)[:, 0]
    surprise = pulled & (w_arm > 0) & (
        jnp.abs(reward - est_before) > SURPRISE_SIGMA * params.noise_std)
    s = (ps.s + jnp.where(onehot, reward[:, None], 0.0)) * DISCOUNT
    w = (ps.w + onehot) * DISCOUNT
    if params.drift == "periodic" and params.reset_on_redraw:
        s = jnp.where(obs.redrawn, 0.0, s)
        w = jnp.where(obs.redrawn, 0.0, w)
    return DiscountState(s, w, ps.since_obs + 1, surprise)


discounting_observer = sl.Policy("discounting_observer", _disc_init, _disc_learn, _disc_exploit,
                                 _disc_update)

BASELINES = {p.name: p for p in (solo_ucb, hierarchical_ucb, random_copy, copy_best,
                                 discounting_observer)}


def get(name: str) -> sl.Policy:
    if name not in BASELINES:
        raise ValueError(f"unknown baseline {name!r}; choose from {sorted(BASELINES)}")
    return BASELINES[name]
