"""The social-learning tournament: a vectorised multi-agent bandit with a token budget.

One population is N agents on a K-armed bandit for T rounds (Rendell et al. 2010 turned into a
bandit, as in "From Solo to Social Learning"). Everything here is for ONE population; batch over
B populations (seeds) with `jax.vmap` (see `rollout_batch`).

A round has two phases, each a pure function (gymnax shape, `key, state, action, params`):

1. `learn`: every agent takes one learning action against a frozen snapshot of all agents'
   last pull (arm, reward): SKIP, INNOVATE (a uniformly random never-known arm), REVISE (a ring
   neighbour of its own best arm) or OBSERVE j (j's last arm and realised reward, with copy
   error `copy_error` and estimate noise `obs_noise`; impossible in solo populations).
2. `exploit`: every agent pulls one arm, r ~ Normal(mu[k], noise_std), or misses the pull
   (r = 0) when its tokens ran out. With `open_arms` (default, the paper's bandit) any arm may
   be pulled and pulling a never-known arm discovers it; otherwise only known arms.

`step(key, state, action, params)` runs both phases when the policy can name its arm up front
(`PULL_ACQUIRED` = "the arm I just learned"). Two-phase policies (UCB, LLM agents) call `learn`,
look at the new observation, then call `exploit`.

Token budget per agent and round: available = budget (mode "expire") or carried balance +
budget (mode "carry"). Learning may spend at most available - reserve; a learning action that
needs more fails (the tokens up to the cap are spent). The pull needs its exploit tokens out of
what is left; otherwise it is missed. A token count of -1 in an action means "use the cost
model in `EnvParams`" (algorithmic agents); LLM agents pass their real generated counts.

Forced independent search: with probability `forced_search_prob`, decided by a hash of
(seed, round, agent) so matched solo/social populations with the same seed share the schedule,
the agent's learning action is replaced by INNOVATE and it must pull the innovated arm.

Lineage: for every (agent, arm) the env keeps how the arm was acquired (origin), from whom
(source), when (acquired_at), the arm it was revised from (parent), the founding innovator
(root) and whether a copy lies on its chain (via_copy).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import struct

# Learning actions.
SKIP, INNOVATE, REVISE, OBSERVE = 0, 1, 2, 3
LEARN_NAMES = ("skip", "innovate", "revise", "observe")
# Exploit targets besides an arm index.
PULL_ACQUIRED = -1  # the arm acquired by this round's learning action
PULL_NONE = -2  # do not pull
# Lineage origins.
ORIGIN_NONE, ORIGIN_INNOVATED, ORIGIN_COPIED, ORIGIN_REVISED, ORIGIN_MISCOPIED = 0, 1, 2, 3, 4

ARM_DISTS = ("exponential", "weibull")
DRIFTS = ("stationary", "periodic", "per_arm")
BUDGET_MODES = ("expire", "carry")


def _static(default):
    return struct.field(pytree_node=False, default=default)


def _concrete(*xs) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


@struct.dataclass
class EnvParams:
    """Environment settings. Shapes and modes are static (hashable, they select the program);
    the numeric knobs marked `dynamic` are pytree leaves, so e.g. solo and social populations
    or different budgets share one compiled rollout."""

    num_agents: int = _static(10)
    num_arms: int = _static(25)
    num_rounds: int = _static(100)
    arm_dist: str = _static("exponential")  # "exponential" | "weibull" (mean-normalised)
    weibull_shape: float = _static(1.0)
    ring_width: float = _static(0.0)  # correlation length of means along the arm ring; 0 = iid
    drift: str = _static("stationary")  # "stationary" | "periodic" | "per_arm"
    period: int = _static(25)
    reset_on_redraw: bool = _static(True)  # forget estimates when all means are redrawn
    budget_mode: str = _static("expire")  # "expire" | "carry"
    # dynamic
    # True: a pull may target any arm; pulling a never-known arm discovers it (origin INNOVATED),
    # as in the paper's bandit. False: only known arms can be pulled (Rendell-style repertoire).
    open_arms: bool = True
    social: bool = True
    noise_std: float = 1.0
    p_change: float = 0.0
    copy_error: float = 0.0
    obs_noise: float = 0.0
    budget: int = 4096
    reserve: int = 0
    forced_search_prob: float = 0.0
    # Cost model for actions whose token count is -1: tokens per learning action and per pull.
    cost_skip: int = 0
    cost_innovate: int = 0
    cost_revise: int = 0
    cost_observe: int = 0
    cost_exploit: int = 0

    def validate(self) -> "EnvParams":
        """Raises ValueError naming the first bad field; returns self. Dynamic fields are only
        checked when concrete (not traced)."""
        if self.num_agents < 1:
            raise ValueError(f"num_agents must be >= 1, got {self.num_agents}")
        if self.num_arms < 2:
            raise ValueError(f"num_arms must be >= 2, got {self.num_arms}")
        if self.num_rounds < 1:
            raise ValueError(f"num_rounds must be >= 1, got {self.num_rounds}")
        if self.arm_dist not in ARM_DISTS:
            raise ValueError(f"arm_dist must be one of {ARM_DISTS}, got {self.arm_dist!r}")
        if self.weibull_shape <= 0:
            raise ValueError(f"weibull_shape must be > 0, got {self.weibull_shape}")
        if self.drift not in DRIFTS:
            raise ValueError(f"drift must be one of {DRIFTS}, got {self.drift!r}")
        if self.drift == "periodic" and self.period < 1:
            raise ValueError(f"period must be >= 1, got {self.period}")
        if self.ring_width < 0:
            raise ValueError(f"ring_width must be >= 0, got {self.ring_width}")
        if self.budget_mode not in BUDGET_MODES:
            raise ValueError(f"budget_mode must be one of {BUDGET_MODES}, got {self.budget_mode!r}")
        if not _concrete(self.budget, self.reserve, self.p_change, self.copy_error,
                         self.forced_search_prob, self.noise_std, self.obs_noise,
                         *self.learn_costs, self.cost_exploit):
            return self
        for name in ("p_change", "copy_error", "forced_search_prob"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        for name in ("noise_std", "obs_noise"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.budget < 0 or not 0 <= self.reserve <= max(self.budget, 0):
            raise ValueError(f"need 0 <= reserve <= budget, got reserve={self.reserve}, "
                             f"budget={self.budget}")
        for name in ("cost_skip", "cost_innovate", "cost_revise", "cost_observe", "cost_exploit"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        return self

    @property
    def learn_costs(self) -> tuple[int, int, int, int]:
        return (self.cost_skip, self.cost_innovate, self.cost_revise, self.cost_observe)


@struct.dataclass
class EnvState:
    """One population. N agents, K arms."""

    mu: jax.Array  # [K] float32 arm means
    t: jax.Array  # [] int32 current round
    seed: jax.Array  # [] uint32, drives the forced-search schedule
    redrawn: jax.Array  # [] bool, all means were redrawn at the start of this round
    known: jax.Array  # [N, K] bool repertoire
    est_sum: jax.Array  # [N, K] float32 sum of own pulls + observed rewards
    est_count: jax.Array  # [N, K] int32 number of those samples
    last_arm: jax.Array  # [N] int32 last pulled arm (-1 never): the snapshot peers observe
    last_reward: jax.Array  # [N] float32 its realised reward
    balance: jax.Array  # [N] int32 tokens carried into this round (carry mode)
    # This round (filled by `learn`, consumed by `exploit`).
    available: jax.Array  # [N] int32 tokens available this round
    spent: jax.Array  # [N] int32 tokens spent so far this round
    forced: jax.Array  # [N] bool forced independent search this round
    learn_kind: jax.Array  # [N] int32 learning action actually performed (SKIP if it failed)
    acquired: jax.Array  # [N] int32 arm acquired this round (-1 none)
    acquired_reward: jax.Array  # [N] float32 reward estimate obtained by observing (0 else)
    # Lineage, per (agent, arm).
    origin: jax.Array  # [N, K] int32 ORIGIN_*
    source: jax.Array  # [N, K] int32 agent copied from (-1 else)
    parent: jax.Array  # [N, K] int32 arm revised from (-1 else)
    root: jax.Array  # [N, K] int32 agent whose independent discovery founded this lineage
    via_copy: jax.Array  # [N, K] bool a copy lies on the arm's acquisition chain
    acquired_at: jax.Array  # [N, K] int32 round acquired (-1 never)


class Observation(NamedTuple):
    """What agents see. Population-level arrays; agent i reads row i."""

    t: jax.Array  # [] int32
    redrawn: jax.Array  # [] bool
    known: jax.Array  # [N, K] bool
    est_sum: jax.Array  # [N, K] float32
    est_count: jax.Array  # [N, K] int32
    last_arm: jax.Array  # [N] int32 snapshot of last pulls (-1 never pulled)
    last_reward: jax.Array  # [N] float32
    available: jax.Array  # [N] int32 tokens this round
    remaining: jax.Array  # [N] int32 tokens left this round
    forced: jax.Array  # [N] bool
    learn_kind: jax.Array  # [N] int32 (after `learn`)
    acquired: jax.Array  # [N] int32 (after `learn`; -1 none)
    acquired_reward: jax.Array  # [N] float32


@struct.dataclass
class LearnAction:
    kind: jax.Array  # [N] int32 SKIP | INNOVATE | REVISE | OBSERVE
    target: jax.Array  # [N] int32 peer to observe (ignored otherwise)
    tokens: jax.Array  # [N] int32 tokens this decision used; -1 = cost model


@struct.dataclass
class ExploitAction:
    arm: jax.Array  # [N] int32 arm index | PULL_ACQUIRED | PULL_NONE
    tokens: jax.Array  # [N] int32; -1 = cost model


@struct.dataclass
class Action:
    learn: LearnAction
    exploit: ExploitAction


def learn_action(kind, target=None, tokens=None) -> LearnAction:
    kind = jnp.asarray(kind, jnp.int32)
    target = jnp.zeros_like(kind) if target is None else jnp.asarray(target, jnp.int32)
    tokens = jnp.full_like(kind, -1) if tokens is None else jnp.asarray(tokens, jnp.int32)
    return LearnAction(kind=kind, target=target, tokens=tokens)


def exploit_action(arm, tokens=None) -> ExploitAction:
    arm = jnp.asarray(arm, jnp.int32)
    tokens = jnp.full_like(arm, -1) if tokens is None else jnp.asarray(tokens, jnp.int32)
    return ExploitAction(arm=arm, tokens=tokens)


# ----------------------------------------------------------------------------- randomness
def hash_u32(*xs) -> jax.Array:
    """Deterministic 32-bit mix of integers (lowbias32 finaliser chained over the inputs).

    Identical to `hash_u32_py`; used for the forced-search schedule so that populations with the
    same seed share it regardless of their actions.
    """
    h = jnp.uint32(0x9E3779B9)
    for x in xs:
        h = h ^ (jnp.asarray(x).astype(jnp.uint32) + jnp.uint32(0x7F4A7C15))
        h = h ^ (h >> 16)
        h = h * jnp.uint32(0x21F0AAAD)
        h = h ^ (h >> 15)
        h = h * jnp.uint32(0x735A2D97)
        h = h ^ (h >> 15)
    return h


def hash_u32_py(*xs: int) -> int:
    """Pure-Python twin of `hash_u32` (reference for tests)."""
    m = 0xFFFFFFFF
    h = 0x9E3779B9
    for x in xs:
        h ^= (int(x) + 0x7F4A7C15) & m
        h ^= h >> 16
        h = (h * 0x21F0AAAD) & m
        h ^= h >> 15
        h = (h * 0x735A2D97) & m
        h ^= h >> 15
    return h


def forced_schedule(seed, t, num_agents: int, prob: float) -> jax.Array:
    """[N] bool: agent i must search independently in round t. u = hash(seed,t,i)/2^32 < prob."""
    agents = jnp.arange(num_agents, dtype=jnp.uint32)
    u = hash_u32(seed, t, agents).astype(jnp.float32) / jnp.float32(2.0**32)
    return u < prob


def seed_from_key(key) -> jax.Array:
    """[] uint32 schedule seed derived from a PRNG key (same key => same schedule)."""
    return jax.random.bits(jax.random.fold_in(key, 0x5EED), (), jnp.uint32)


def random_choice_mask(key, mask: jax.Array) -> jax.Array:
    """Uniform index among the True entries of the last axis: [..., K] -> [...] int32 (-1: none)."""
    return choice_from_uniform(jax.random.uniform(key, mask.shape), mask)


def argmax_last(x: jax.Array) -> jax.Array:
    """jnp.argmax(x, -1) (first maximal index) as max + min reductions: [..., K] -> [...] int32.

    XLA CPU lowers argmax to a variadic reduce that is about twice as slow on these shapes.
    """
    m = jnp.max(x, axis=-1, keepdims=True)
    iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.min(jnp.where(x == m, iota, x.shape[-1]), axis=-1).clip(0, x.shape[-1] - 1)


def choice_from_uniform(u: jax.Array, mask: jax.Array) -> jax.Array:
    """argmax of iid uniforms u over the True entries of mask (a uniform choice); -1 if none."""
    idx = argmax_last(jnp.where(mask, u, -1.0))
    return jnp.where(mask.any(-1), idx, -1)


def normal_from_uniform(u1: jax.Array, u2: jax.Array) -> jax.Array:
    """Box-Muller: two iid U[0, 1) -> one N(0, 1). (One threefry block per phase instead of a
    generator call per variable keeps the compiled program small.)"""
    return jnp.sqrt(-2.0 * jnp.log1p(-u1)) * jnp.cos(2.0 * jnp.pi * u2)


def draw_means(key, params: EnvParams) -> jax.Array:
    """[K] arm means with mean 1: Exponential(1), or Weibull(shape) scaled to mean 1.

    With ring_width w > 0 the uniforms come from a Gaussian field smoothed along the arm ring
    (kernel exp(-d^2 / 2w^2), d = ring distance), so neighbouring arms have correlated means
    while every marginal stays the same distribution.
    """
    K = params.num_arms
    if params.ring_width > 0:
        z = jax.random.normal(key, (K,))
        d = jnp.arange(K)
        d = jnp.minimum(d, K - d).astype(jnp.float32)
        kern = jnp.exp(-0.5 * (d / params.ring_width) ** 2)
        kern = kern / jnp.sqrt(jnp.sum(kern**2))
        # circular convolution keeps each entry N(0, 1)
        zs = jnp.real(jnp.fft.ifft(jnp.fft.fft(z) * jnp.fft.fft(kern)))
        u = jax.scipy.stats.norm.cdf(zs)
    else:
        u = jax.random.uniform(key, (K,))
    u = jnp.clip(u, 0.0, 1.0 - 1e-7)
    e = -jnp.log1p(-u)  # Exponential(1)
    if params.arm_dist == "exponential":
        return e.astype(jnp.float32)
    k = params.weibull_shape
    lam = 1.0 / jnp.exp(jax.scipy.special.gammaln(1.0 + 1.0 / k))
    return (lam * e ** (1.0 / k)).astype(jnp.float32)


# ----------------------------------------------------------------------------- env
def _obs(state: EnvState) -> Observation:
    return Observation(
        t=state.t, redrawn=state.redrawn, known=state.known, est_sum=state.est_sum,
        est_count=state.est_count, last_arm=state.last_arm, last_reward=state.last_reward,
        available=state.available, remaining=state.available - state.spent, forced=state.forced,
        learn_kind=state.learn_kind, acquired=state.acquired, acquired_reward=state.acquired_reward)


def _begin_round(state: EnvState, params: EnvParams) -> EnvState:
    n = params.num_agents
    if params.budget_mode == "carry":
        available = state.balance + params.budget
    else:
        available = jnp.full((n,), params.budget, jnp.int32)
    return state.replace(
        available=available.astype(jnp.int32),
        spent=jnp.zeros((n,), jnp.int32),
        forced=forced_schedule(state.seed, state.t, n, params.forced_search_prob),
        learn_kind=jnp.zeros((n,), jnp.int32),
        acquired=jnp.full((n,), -1, jnp.int32),
        acquired_reward=jnp.zeros((n,), jnp.float32),
    )


def reset(key, params: EnvParams, seed=None) -> tuple[Observation, EnvState]:
    """New population: means drawn from `key`, nobody knows any arm. -> (obs, state).

    `seed` ([] uint32-able) fixes the forced-search schedule; default derived from `key`, so
    matched populations reset with the same key share means and schedule.
    """
    params.validate()
    n, k = params.num_agents, params.num_arms
    seed = seed_from_key(key) if seed is None else jnp.asarray(seed).astype(jnp.uint32)
    zi = jnp.zeros((n, k), jnp.int32)
    state = EnvState(
        mu=draw_means(jax.random.fold_in(key, 1), params), t=jnp.int32(0), seed=seed,
        redrawn=jnp.bool_(False), known=jnp.zeros((n, k), bool),
        est_sum=jnp.zeros((n, k), jnp.float32), est_count=zi,
        last_arm=jnp.full((n,), -1, jnp.int32), last_reward=jnp.zeros((n,), jnp.float32),
        balance=jnp.zeros((n,), jnp.int32), available=jnp.zeros((n,), jnp.int32),
        spent=jnp.zeros((n,), jnp.int32), forced=jnp.zeros((n,), bool),
        learn_kind=jnp.zeros((n,), jnp.int32), acquired=jnp.full((n,), -1, jnp.int32),
        acquired_reward=jnp.zeros((n,), jnp.float32),
        origin=zi, source=zi - 1, parent=zi - 1, root=zi - 1,
        via_copy=jnp.zeros((n, k), bool), acquired_at=zi - 1)
    state = _begin_round(state, params)
    return _obs(state), state


def learn(key, state: EnvState, action: LearnAction, params: EnvParams):
    """Phase 1 of a round. action fields [N]. -> (obs, state, info).

    info: dict of [N] arrays: requested kind, performed kind, ok (learning took effect),
    invalid (malformed/impossible request, e.g. observing in a solo population), learn_tokens.
    """
    n, k = params.num_agents, params.num_arms
    chex.assert_shape([action.kind, action.target, action.tokens], (n,))
    agents = jnp.arange(n)
    kk = max(k, 6)
    u = jax.random.uniform(key, (3, n, kk))  # every draw of this phase, one block
    u_innov, u_any, u_misc = u[0, :, :k], u[1, :, :k], u[2]

    # forced search applies while some arm is still unknown to the agent
    scheduled = state.forced
    forced = scheduled & (~state.known).any(-1)
    kind = jnp.where(forced, INNOVATE, action.kind.astype(jnp.int32))
    bad_kind = (kind < 0) | (kind > OBSERVE)
    kind = jnp.where(bad_kind, SKIP, kind)
    costs = jnp.asarray(params.learn_costs, jnp.int32)
    tokens = jnp.where(action.tokens < 0, costs[kind], action.tokens).astype(jnp.int32)
    cap = jnp.maximum(state.available - params.reserve, 0)
    affordable = tokens <= cap
    spent_learn = jnp.minimum(tokens, cap)

    known = state.known
    # INNOVATE: a uniformly random never-known arm.
    innov_arm = choice_from_uniform(u_innov, ~known)
    # REVISE: from own best (highest mean estimate among sampled arms, else any known arm) to a
    # ring neighbour, preferring one not yet known.
    mean = state.est_sum / jnp.maximum(state.est_count, 1)
    sampled = known & (state.est_count > 0)
    best_sampled = argmax_last(jnp.where(sampled, mean, -jnp.inf))
    any_known_arm = choice_from_uniform(u_any, known)
    best = jnp.where(sampled.any(-1), best_sampled, any_known_arm).astype(jnp.int32)
    nbrs = jnp.stack([(best - 1) % k, (best + 1) % k], -1)  # [N, 2]
    nbr_new = ~jnp.take_along_axis(known, nbrs, axis=1)
    pick = choice_from_uniform(u_misc[:, :2],
                               jnp.where(nbr_new.any(-1, keepdims=True), nbr_new, True))
    rev_arm = jnp.take_along_axis(nbrs, pick[:, None], axis=1)[:, 0]
    # OBSERVE j: j's last arm and reward from the frozen snapshot.
    target = jnp.clip(action.target, 0, n - 1)
    tgt_ok = (action.target >= 0) & (action.target < n) & (action.target != agents)
    obs_arm = state.last_arm[target]
    can_observe = params.social & tgt_ok & (obs_arm >= 0)
    miscopy = u_misc[:, 2] < params.copy_error
    # copy error: a uniformly random arm other than the one observed
    shift = 1 + jnp.minimum(jnp.floor(u_misc[:, 3] * (k - 1)).astype(jnp.int32), k - 2)
    obs_arm_got = jnp.where(miscopy, (obs_arm + shift) % k, obs_arm)
    obs_reward = state.last_reward[target] + params.obs_noise * normal_from_uniform(
        u_misc[:, 4], u_misc[:, 5])

    possible = jnp.select(
        [kind == INNOVATE, kind == REVISE, kind == OBSERVE],
        [innov_arm >= 0, best >= 0, can_observe], default=True)
    invalid = bad_kind | ~possible
    ok = affordable & possible & (kind != SKIP)
    arm = jnp.select([kind == INNOVATE, kind == REVISE, kind == OBSERVE],
                     [innov_arm, rev_arm, obs_arm_got], default=-1)
    arm = jnp.where(ok, arm, -1).astype(jnp.int32)
    performed = jnp.where(ok, kind, SKIP)

    # Repertoire, memory and lineage updates.
    onehot = (jnp.arange(k)[None, :] == arm[:, None]) & (arm[:, None] >= 0)  # [N, K]
    new = onehot & ~known
    is_obs = performed == OBSERVE
    add_sample = onehot & is_obs[:, None]
    est_sum = state.est_sum + jnp.where(add_sample, obs_reward[:, None], 0.0)
    est_count = state.est_count + add_sample.astype(jnp.int32)
    origin_new = jnp.select(
        [performed == INNOVATE, performed == REVISE, is_obs & ~miscopy, is_obs & miscopy],
        [ORIGIN_INNOVATED, ORIGIN_REVISED, ORIGIN_COPIED, ORIGIN_MISCOPIED], default=ORIGIN_NONE)
    src_root = state.root[target, jnp.maximum(obs_arm, 0)]
    par_root = state.root[agents, best]
    par_via = state.via_copy[agents, best]
    root_new = jnp.select([performed == REVISE, is_obs & ~miscopy], [par_root, src_root],
                          default=agents)
    via_new = jnp.select([performed == REVISE, is_obs & ~miscopy], [par_via, True], default=False)
    def col(v):
        return jnp.broadcast_to(v[:, None], (n, k))
    state = state.replace(
        known=known | onehot,
        est_sum=est_sum, est_count=est_count,
        origin=jnp.where(new, col(origin_new), state.origin),
        source=jnp.where(new & is_obs[:, None], col(target), state.source),
        parent=jnp.where(new & (performed == REVISE)[:, None], col(best), state.parent),
        root=jnp.where(new, col(root_new), state.root),
        via_copy=jnp.where(new, col(via_new), state.via_copy),
        acquired_at=jnp.where(new, state.t, state.acquired_at),
        spent=state.spent + spent_learn,
        learn_kind=performed,
        acquired=arm,
        acquired_reward=jnp.where(is_obs, obs_reward, 0.0).astype(jnp.float32),
        forced=forced,
    )
    info = dict(requested=action.kind.astype(jnp.int32), learn_kind=performed, learn_ok=ok,
                learn_invalid=invalid, learn_unaffordable=~affordable, learn_tokens=spent_learn,
                forced=scheduled, forced_applied=forced, new_arm=new.any(-1))
    return _obs(state), state, info


def exploit(key, state: EnvState, action: ExploitAction, params: EnvParams):
    """Phase 2 of a round: pull, then advance to the next round (with drift).

    action fields [N]. -> (obs, state, reward [N], done [], info). A pull needs a known arm and
    its tokens out of what learning left; otherwise it is missed and earns 0.
    """
    n, k = params.num_agents, params.num_arms
    chex.assert_shape([action.arm, action.tokens], (n,))
    agents = jnp.arange(n)
    u = jax.random.uniform(key, (2, n))
    k_drift = jax.random.fold_in(key, 1)  # only drawn from when the means drift

    arm = jnp.where(action.arm == PULL_ACQUIRED, state.acquired, action.arm).astype(jnp.int32)
    # Forced search must pull the innovated arm.
    forced_pull = state.forced & (state.learn_kind == INNOVATE)
    arm = jnp.where(forced_pull, state.acquired, arm)
    in_range = (arm >= 0) & (arm < k)
    safe = jnp.clip(arm, 0, k - 1)
    valid_arm = in_range & (state.known[agents, safe] | params.open_arms)
    wants_pull = action.arm != PULL_NONE
    # Explicit token counts (LLM agents) are paid even for a malformed / absent pull; the cost
    # model charges only pulls that are attempted.
    costs_e = jnp.where(action.tokens < 0,
                        jnp.where(wants_pull | forced_pull, params.cost_exploit, 0),
                        action.tokens).astype(jnp.int32)
    remaining = state.available - state.spent
    affordable = (remaining > 0) & (costs_e <= remaining)
    pulled = valid_arm & affordable & (wants_pull | forced_pull)
    spent_exploit = jnp.maximum(jnp.minimum(costs_e, remaining), 0)

    r = state.mu[safe] + params.noise_std * normal_from_uniform(u[0], u[1])
    reward = jnp.where(pulled, r, 0.0).astype(jnp.float32)
    onehot = (jnp.arange(k)[None, :] == safe[:, None]) & pulled[:, None]
    # Pulling a never-known arm (open_arms) is an independent discovery.
    new = onehot & ~state.known
    def col(v):
        return jnp.broadcast_to(v[:, None], (n, k))
    root_at = jnp.where(new.any(-1), agents, state.root[agents, safe])

    # Copied-vs-own-best, evaluated on true means at the pull.
    self_found = state.known & ((state.origin == ORIGIN_INNOVATED)
                                | (state.origin == ORIGIN_REVISED))
    own_best_mu = jnp.max(jnp.where(self_found, state.mu[None, :], -jnp.inf), axis=-1)
    copied_pull = pulled & (state.origin[agents, safe] == ORIGIN_COPIED) & self_found.any(-1)
    copied_beats = copied_pull & (state.mu[safe] > own_best_mu)

    spent = state.spent + spent_exploit
    total_tokens = spent
    balance = jnp.where(params.budget_mode == "carry", state.available - spent, 0)
    best_mu = jnp.max(state.mu)
    info = dict(arm=jnp.where(pulled, arm, -1), pulled=pulled, reward=reward,
                pull_invalid=wants_pull & ~valid_arm, exploit_tokens=spent_exploit,
                tokens=total_tokens, regret=best_mu - jnp.where(pulled, state.mu[safe], 0.0),
                copied_pull=copied_pull, copied_beats_own=copied_beats,
                deployed_via_copy=pulled & state.via_copy[agents, safe],
                deployed_root=jnp.where(pulled, root_at, -1),
                mu=state.mu, t=state.t)

    # Advance: drift for the next round.
    t_next = state.t + 1
    mu = state.mu
    redrawn = jnp.bool_(False)
    if params.drift == "periodic":
        redrawn = (t_next % params.period) == 0
        mu = jnp.where(redrawn, draw_means(k_drift, params), mu)
    elif params.drift == "per_arm":
        k_which, k_new = jax.random.split(k_drift)
        change = jax.random.uniform(k_which, (k,)) < params.p_change
        mu = jnp.where(change, draw_means(k_new, params), mu)
    est_sum = state.est_sum + jnp.where(onehot, r[:, None], 0.0)
    est_count = state.est_count + onehot.astype(jnp.int32)
    if params.reset_on_redraw and params.drift == "periodic":
        est_sum = jnp.where(redrawn, 0.0, est_sum)
        est_count = jnp.where(redrawn, 0, est_count)
    state = state.replace(
        mu=mu, t=t_next, redrawn=redrawn, est_sum=est_sum, est_count=est_count,
        known=state.known | onehot,
        origin=jnp.where(new, ORIGIN_INNOVATED, state.origin),
        root=jnp.where(new, col(agents), state.root),
        acquired_at=jnp.where(new, state.t, state.acquired_at),
        last_arm=jnp.where(pulled, arm, state.last_arm),
        last_reward=jnp.where(pulled, reward, state.last_reward),
        balance=balance.astype(jnp.int32), spent=spent)
    state = _begin_round(state, params)
    done = t_next >= params.num_rounds
    return _obs(state), state, reward, done, info


def step(key, state: EnvState, action: Action, params: EnvParams):
    """Both phases with a pre-committed arm (gymnax shape). -> (obs, state, reward, done, info)."""
    k1, k2 = jax.random.split(key)
    _, state, info_l = learn(k1, state, action.learn, params)
    obs, state, reward, done, info_e = exploit(k2, state, action.exploit, params)
    return obs, state, reward, done, {**info_l, **info_e}


class Policy(NamedTuple):
    """A pure population policy. All functions are jit/vmap-able.

    init(key, params) -> pstate
    learn(key, pstate, obs, params) -> (LearnAction, pstate)
    exploit(key, pstate, obs, params) -> (ExploitAction, pstate)   # obs after `learn`
    update(pstate, obs, reward [N], info, params) -> pstate        # obs after `exploit`
    """

    name: str
    init: Any
    learn: Any
    exploit: Any
    update: Any


class RoundRecord(NamedTuple):
    """Per-round records of one population, leading axis T (then N)."""

    reward: jax.Array  # [T, N]
    pulled: jax.Array  # [T, N] bool
    arm: jax.Array  # [T, N] int32 (-1 missed)
    tokens: jax.Array  # [T, N] int32 (learning + exploit)
    learn_kind: jax.Array  # [T, N] int32 performed
    requested: jax.Array  # [T, N] int32
    learn_invalid: jax.Array  # [T, N] bool
    forced: jax.Array  # [T, N] bool scheduled forced search (identical for matched seeds)
    forced_applied: jax.Array  # [T, N] bool forced search imposed (scheduled, arms left)
    regret: jax.Array  # [T, N]
    copied_pull: jax.Array  # [T, N] bool
    copied_beats_own: jax.Array  # [T, N] bool
    deployed_via_copy: jax.Array  # [T, N] bool
    deployed_root: jax.Array  # [T, N] int32
    mu: jax.Array  # [T, K]


def round_fn(key, state: EnvState, obs: Observation, pstate, policy: Policy, params: EnvParams):
    """One full round: policy.learn -> env.learn -> policy.exploit -> env.exploit -> update."""
    k1, k2, k3, k4 = jax.random.split(key, 4)
    la, pstate = policy.learn(k1, pstate, obs, params)
    obs, state, info_l = learn(k2, state, la, params)
    ea, pstate = policy.exploit(k3, pstate, obs, params)
    obs, state, reward, done, info_e = exploit(k4, state, ea, params)
    info = {**info_l, **info_e}
    pstate = policy.update(pstate, obs, reward, info, params)
    return state, obs, pstate, info


def rollout(key, policy: Policy, params: EnvParams, seed=None):
    """Play one population for T rounds. -> (final EnvState, RoundRecord).

    The env is reset with `key` itself, so two policies rolled out with the same key face the
    same arm means and forced-search schedule (matched populations).
    """
    _, k_pol, k_run = jax.random.split(key, 3)
    obs, state = reset(key, params, seed)
    pstate = policy.init(k_pol, params)

    def body(carry, k):
        state, obs, pstate = carry
        state, obs, pstate, info = round_fn(k, state, obs, pstate, policy, params)
        rec = RoundRecord(**{f: info[f] for f in RoundRecord._fields})
        return (state, obs, pstate), rec

    keys = jax.random.split(k_run, params.num_rounds)
    (state, _, _), traj = jax.lax.scan(body, (state, obs, pstate), keys)
    return state, traj


# XLA CPU spends most of a small program's compile time in LLVM optimisation; level 0 compiles
# ~3x faster and runs a few times slower: the right trade for tests and one-off interactive use.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def _rollout_batch_impl(keys, policy: Policy, params: EnvParams):
    return jax.vmap(lambda k: rollout(k, policy, params))(keys)


_rollout_batch = jax.jit(_rollout_batch_impl, static_argnames=("policy",))
_rollout_batch_fast = jax.jit(_rollout_batch_impl, static_argnames=("policy",),
                              compiler_options=FAST_COMPILE)


def rollout_batch(keys, policy: Policy, params: EnvParams, fast_compile: bool = False):
    """Vectorised over populations (jitted; one program per policy and static settings).

    keys [B] -> (EnvState with leading B, RoundRecord [B, T, ...]). fast_compile: compile with
    `FAST_COMPILE` (tests, small runs) instead of full optimisation (benchmarks, sweeps).
    """
    params.validate()
    fn = _rollout_batch_fast if fast_compile else _rollout_batch
    return fn(keys, policy, params)


# Jitted single-population phases (params is a pytree argument; its static fields key the
# cache), compiled for a short compile: interactive loops (LLM agents) and tests.
reset_jit = jax.jit(reset, compiler_options=FAST_COMPILE)
learn_jit = jax.jit(learn, compiler_options=FAST_COMPILE)
exploit_jit = jax.jit(exploit, compiler_options=FAST_COMPILE)
step_jit = jax.jit(step, compiler_options=FAST_COMPILE)
