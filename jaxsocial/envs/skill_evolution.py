"""Skill evolution on IFBench: the second stage of "From Solo to Social Learning".

A population of N agents plays T rounds. An agent's *skill* is a text (a system prompt) that it
deploys to answer IFBench prompts; IFBench's checkers score the answers. Each round every agent
first takes one learning action, then acts:

- REVISE: its LLM rewrites its deployed skill from that skill's failures (an evolution step in
  OpenEvolve's spirit, `jaxsocial.envs.skill_llm`), and the child is evaluated on `eval_batch`
  training prompts; the child joins the agent's library with that score;
- OBSERVE j (social populations only): copy peer j's *latest* skill and its score, as they were
  at the start of the round (a frozen snapshot, so the order of agents does not matter);
- SKIP.
Then it ACTS: its deployed skill (the best-scoring skill of its library; ties -> the oldest,
so a new skill replaces the deployed one only by scoring strictly higher; unscored = 0)
answers the round's `act_batch` training prompts; the mean score is the round's reward and
updates that skill's estimate. Learning and acting draw on one per-round token budget
(`budget`, expiring each round; `reserve` tokens are kept for acting): a decision whose tokens
exceed what learning may spend is played as SKIP; tokens are the real generated counts.

Array state vs text state: this module is the pure, jitted bookkeeping (budget, actions, skill
table, lineage) in `EnvState` (a flax.struct.dataclass). Skill *texts* live host-side in a
Python list indexed by skill id (`skill_llm.Run.texts`); everything here refers to skills by id.
The skill table has S = N * (T + 1) slots (N seeds + at most one new skill per agent per round).

Lineage: each skill records its parent, origin (SEED / REVISED / COPIED), founder (the seed skill
its chain starts from), `via_copy` (a copy lies on its chain) and `copy_then_revise` (a revision
of a skill whose chain contains a copy lies on its chain). Founding lineages of a population =
distinct founders among its deployed skills.

Deciders (`Policy`): `solo` (always revise), `random` (uniform over {self} + peers: self ->
revise, j -> observe j), `ucb` (UCB over the same sources, the reward of a source being the score
of the skill it yielded), all pure JAX; the LLM decider lives in `skill_llm`.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsocial.envs.social_learning import FAST_COMPILE, argmax_last, choice_from_uniform

SKIP, REVISE, OBSERVE = 0, 1, 2
KIND_NAMES = ("skip", "revise", "observe")
SEED, REVISED, COPIED = 0, 1, 2
EMPTY = -1  # unused skill slot


def _static(default):
    return struct.field(pytree_node=False, default=default)


@struct.dataclass
class EnvParams:
    """Static settings of one population (hashable: they select the compiled program)."""

    num_agents: int = _static(5)
    num_rounds: int = _static(10)
    budget: int = _static(4096)  # tokens per agent per round, learning + acting, expiring
    reserve: int = _static(0)  # of the budget, tokens learning may not touch
    social: bool = _static(True)  # False: OBSERVE is refused (played as SKIP)

    @property
    def num_slots(self) -> int:
        return self.num_agents * (self.num_rounds + 1)

    def validate(self) -> "EnvParams":
        """Raises ValueError naming the first bad field; returns self."""
        for name in ("num_agents", "num_rounds", "budget"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not 0 <= self.reserve < self.budget:
            raise ValueError(f"reserve must be in [0, budget={self.budget}), got {self.reserve}")
        if self.social and self.num_agents < 2:
            raise ValueError(f"a social population needs num_agents >= 2, got {self.num_agents}")
        return self


@struct.dataclass
class EnvState:
    """One population: N agents, S = N * (T + 1) skill slots."""

    t: jax.Array  # [] int32 current round
    remaining: jax.Array  # [N] int32 tokens left this round
    num_skills: jax.Array  # [] int32 slots used
    # skill table [S]
    parent: jax.Array  # int32 parent skill id (-1: a seed)
    origin: jax.Array  # int32 SEED | REVISED | COPIED (EMPTY: unused slot)
    founder: jax.Array  # int32 id of the seed skill the chain starts from
    author: jax.Array  # int32 agent that created/acquired the slot
    born: jax.Array  # int32 round created (-1: seed)
    via_copy: jax.Array  # bool a copy lies on the chain
    copy_then_revise: jax.Array  # bool a revision of a copied chain lies on the chain
    score_sum: jax.Array  # float32 sum of per-prompt training scores
    score_cnt: jax.Array  # float32 number of scored prompts
    # agents [N]
    held: jax.Array  # [N, S] bool the agent's library
    latest: jax.Array  # [N] int32 skill acquired most recently (what a peer copies)
    deployed: jax.Array  # [N] int32 best-scoring skill of the library (ties -> oldest)
    learn_tokens: jax.Array  # [N] int32 cumulative learning tokens
    act_tokens: jax.Array  # [N] int32 cumulative acting tokens


class Observation(NamedTuple):
    """What the deciders see (population arrays; agent i reads row i)."""

    t: jax.Array  # [] int32
    remaining: jax.Array  # [N] int32
    own_score: jax.Array  # [N] float32 deployed skill's mean training score
    latest_score: jax.Array  # [N] float32 latest skill's mean score (what observing it gives)
    latest_known: jax.Array  # [N] bool the latest skill has been scored


@struct.dataclass
class LearnAction:
    """One round's learning actions with their realised costs (the LLM work happens outside).

    kind [N] int32 SKIP | REVISE | OBSERVE; target [N] int32 peer (OBSERVE);
    decide_tokens [N] int32 tokens of the decision itself (0 for rule deciders);
    revise_tokens [N] int32 tokens of the rewrite + its evaluation (REVISE);
    revise_ok [N] bool the rewrite produced a skill and its evaluation ran;
    eval_sum / eval_cnt [N] float32 the child's training score (sum over eval_cnt prompts).
    """

    kind: jax.Array
    target: jax.Array
    decide_tokens: jax.Array
    revise_tokens: jax.Array
    revise_ok: jax.Array
    eval_sum: jax.Array
    eval_cnt: jax.Array


@struct.dataclass
class ActAction:
    """tokens [N] int32 answer tokens; score_sum / score_cnt [N] float32; acted [N] bool."""

    tokens: jax.Array
    score_sum: jax.Array
    score_cnt: jax.Array
    acted: jax.Array


def learn_action(kind, target=None, decide_tokens=None, revise_tokens=None, revise_ok=None,
                 eval_sum=None, eval_cnt=None) -> LearnAction:
    """LearnAction from array-likes [N] (missing costs 0; revise_ok defaults to kind==REVISE)."""
    kind = jnp.asarray(kind, jnp.int32)

    def z(x, dtype):
        return jnp.zeros(kind.shape, dtype) if x is None else jnp.asarray(x, dtype)
    ok = kind == REVISE if revise_ok is None else jnp.asarray(revise_ok, bool)
    return LearnAction(kind, z(target, jnp.int32), z(decide_tokens, jnp.int32),
                       z(revise_tokens, jnp.int32), ok, z(eval_sum, jnp.float32),
                       z(eval_cnt, jnp.float32))


def skill_means(state: EnvState) -> jax.Array:
    """[S] float32 mean training score per skill (0 where unscored)."""
    return state.score_sum / jnp.maximum(state.score_cnt, 1.0)


def _deployed(state: EnvState) -> jax.Array:
    """[N] best-scoring held skill, ties -> the oldest (lowest id): elitist, a child or a copy
    must score strictly higher to be deployed."""
    m = jnp.where(state.held, skill_means(state)[None, :], -jnp.inf)  # [N, S]
    return argmax_last(m).astype(jnp.int32)


def observe(state: EnvState) -> Observation:
    means = skill_means(state)
    return Observation(t=state.t, remaining=state.remaining, own_score=means[state.deployed],
                       latest_score=means[state.latest],
                       latest_known=state.score_cnt[state.latest] > 0)


def reset(params: EnvParams) -> tuple[Observation, EnvState]:
    """Agent i starts with seed skill i (its own founding lineage, unscored). Deterministic."""
    n, s = params.num_agents, params.num_slots
    ids = jnp.arange(s, dtype=jnp.int32)
    seed = ids < n
    held = jnp.zeros((n, s), bool).at[jnp.arange(n), jnp.arange(n)].set(True)
    state = EnvState(
        t=jnp.int32(0), remaining=jnp.full((n,), params.budget, jnp.int32),
        num_skills=jnp.int32(n),
        parent=jnp.full((s,), -1, jnp.int32),
        origin=jnp.where(seed, SEED, EMPTY).astype(jnp.int32),
        founder=jnp.where(seed, ids, -1).astype(jnp.int32),
        author=jnp.where(seed, ids, -1).astype(jnp.int32),
        born=jnp.full((s,), -1, jnp.int32),
        via_copy=jnp.zeros((s,), bool), copy_then_revise=jnp.zeros((s,), bool),
        score_sum=jnp.zeros((s,), jnp.float32), score_cnt=jnp.zeros((s,), jnp.float32),
        held=held, latest=jnp.arange(n, dtype=jnp.int32),
        deployed=jnp.arange(n, dtype=jnp.int32),
        learn_tokens=jnp.zeros((n,), jnp.int32), act_tokens=jnp.zeros((n,), jnp.int32))
    return observe(state), state


def learn(state: EnvState, action: LearnAction, params: EnvParams):
    """Apply one round's learning actions. -> (obs, state, info).

    Per agent i, with L_i = remaining_i - reserve the tokens learning may spend:
    - the decision costs d_i = decide_tokens_i; if d_i > L_i the agent ran out while deciding:
      it pays L_i and plays SKIP;
    - OBSERVE j is performed iff social, j != i, 0 <= j < N; else SKIP. The copier gets a new
      slot: parent = latest_j at the round's start, origin COPIED, j's score sum/count;
    - REVISE is performed iff revise_ok and d_i + revise_tokens_i <= L_i; it costs
      revise_tokens_i (charged min(., L_i - d_i) even when it failed). The child's parent is
      the agent's deployed skill; its score is eval_sum / eval_cnt;
    - new slots are numbered in agent order after `num_skills`.
    info: kind [N] (performed), tokens [N] (learning tokens charged), new_skill [N] (-1 none),
    invalid [N] (an OBSERVE refused or a decision over budget).
    """
    n, s = params.num_agents, params.num_slots
    agents = jnp.arange(n, dtype=jnp.int32)
    avail = jnp.maximum(state.remaining - params.reserve, 0)
    d = jnp.maximum(action.decide_tokens, 0)
    decided = d <= avail
    paid = jnp.minimum(d, avail)
    left = avail - paid
    kind = jnp.where(decided, action.kind, SKIP)
    tgt = jnp.clip(action.target, 0, n - 1)
    obs_ok = ((kind == OBSERVE) & params.social & (action.target != agents)
              & (action.target >= 0) & (action.target < n))
    rev_cost = jnp.minimum(jnp.maximum(action.revise_tokens, 0), left)
    rev_ok = (kind == REVISE) & action.revise_ok & (action.revise_tokens <= left)
    charged = paid + jnp.where(kind == REVISE, rev_cost, 0)
    performed = jnp.where(obs_ok, OBSERVE, jnp.where(rev_ok, REVISE, SKIP)).astype(jnp.int32)
    invalid = (~decided) | ((kind == OBSERVE) & ~obs_ok)

    creates = performed != SKIP
    slot = state.num_skills + jnp.cumsum(creates.astype(jnp.int32)) - 1
    slot = jnp.where(creates, slot, s).astype(jnp.int32)  # s: dropped by the scatters
    src = jnp.where(performed == OBSERVE, state.latest[tgt], state.deployed)  # parent skill
    copied = performed == OBSERVE
    new_sum = jnp.where(copied, state.score_sum[src], action.eval_sum)
    new_cnt = jnp.where(copied, state.score_cnt[src], action.eval_cnt)
    via = copied | state.via_copy[src]
    ctr = state.copy_then_revise[src] | ((performed == REVISE) & state.via_copy[src])

    def put(arr, val):
        return arr.at[slot].set(val, mode="drop")
    held = state.held.at[agents, slot].set(True, mode="drop")
    state = state.replace(
        remaining=state.remaining - charged,
        num_skills=state.num_skills + creates.sum().astype(jnp.int32),
        parent=put(state.parent, src), origin=put(state.origin, jnp.where(copied, COPIED, REVISED)),
        founder=put(state.founder, state.founder[src]), author=put(state.author, agents),
        born=put(state.born, jnp.broadcast_to(state.t, (n,))),
        via_copy=put(state.via_copy, via), copy_then_revise=put(state.copy_then_revise, ctr),
        score_sum=put(state.score_sum, new_sum), score_cnt=put(state.score_cnt, new_cnt),
        held=held, latest=jnp.where(creates, slot, state.latest),
        learn_tokens=state.learn_tokens + charged)
    state = state.replace(deployed=_deployed(state))
    info = {"kind": performed, "tokens": charged.astype(jnp.int32),
            "new_skill": jnp.where(creates, slot, -1), "invalid": invalid}
    return observe(state), state, info


def act(state: EnvState, action: ActAction, params: EnvParams):
    """Charge the acting answers, update the deployed skills' scores, end the round.

    tokens_i are charged up to remaining_i (the runner caps answers so they fit); an agent acts
    iff acted_i and score_cnt_i > 0. reward_i = score_sum_i / score_cnt_i (0 if it did not act).
    The budget then expires: remaining = budget, t += 1. -> (obs, state, reward [N], info).
    """
    acted = action.acted & (action.score_cnt > 0)
    tok = jnp.minimum(jnp.where(acted, jnp.maximum(action.tokens, 0), 0), state.remaining)
    dep = state.deployed
    add_s = jnp.where(acted, action.score_sum, 0.0)
    add_c = jnp.where(acted, action.score_cnt, 0.0)
    reward = jnp.where(acted, action.score_sum / jnp.maximum(action.score_cnt, 1.0), 0.0)
    state = state.replace(score_sum=state.score_sum.at[dep].add(add_s),
                          score_cnt=state.score_cnt.at[dep].add(add_c),
                          act_tokens=state.act_tokens + tok)
    # the acting skill was the deployed one; with its new score the best skill may change
    state = state.replace(deployed=_deployed(state), t=state.t + 1,
                          remaining=jnp.full_like(state.remaining, params.budget))
    info = {"tokens": tok.astype(jnp.int32), "acted": acted, "deployed": dep}
    return observe(state), state, reward.astype(jnp.float32), info


learn_jit = jax.jit(learn, static_argnums=2, compiler_options=FAST_COMPILE)
act_jit = jax.jit(act, static_argnums=2, compiler_options=FAST_COMPILE)
reset_jit = jax.jit(reset, static_argnums=0, compiler_options=FAST_COMPILE)


# ----------------------------------------------------------------------------- deciders
class Policy(NamedTuple):
    """A rule decider: pure functions of arrays.

    init(params) -> pstate; act(key, pstate, obs, params) -> (kind [N], target [N]);
    update(pstate, obs_before, info, params) -> pstate, where info has `kind`, `target`
    (as performed) and `gain` [N] float32 (the score of the skill the action yielded).
    """

    init: Callable
    act: Callable
    update: Callable
    name: str = ""


def _sources_to_action(src: jax.Array, n: int):
    """Source index per agent (self = i, peer = j) -> (kind, target)."""
    agents = jnp.arange(n, dtype=jnp.int32)
    own = src == agents
    return (jnp.where(own, REVISE, OBSERVE).astype(jnp.int32),
            jnp.where(own, 0, src).astype(jnp.int32))


def _no_state(params):
    return jnp.zeros((), jnp.int32)


def _keep(pstate, obs, info, params):
    return pstate


def solo() -> Policy:
    """Full solo evolution: REVISE every round."""
    def act_fn(key, pstate, obs, params):
        n = params.num_agents
        return jnp.full((n,), REVISE, jnp.int32), jnp.zeros((n,), jnp.int32)
    return Policy(_no_state, act_fn, _keep, "solo")


def uniform_random() -> Policy:
    """Uniform over the sources {self} + peers: self -> REVISE, peer j -> OBSERVE j
    (observe rate (N-1)/N). Solo populations: always REVISE."""
    def act_fn(key, pstate, obs, params):
        n = params.num_agents
        mask = jnp.ones((n, n), bool) if params.social else jnp.eye(n, dtype=bool)
        return _sources_to_action(choice_from_uniform(jax.random.uniform(key, (n, n)), mask), n)
    return Policy(_no_state, act_fn, _keep, "random")


class UCBState(NamedTuple):
    sums: jax.Array  # [N, N] float32 reward sum per (agent, source)
    counts: jax.Array  # [N, N] float32


def ucb_index(ps: UCBState, prior: float, self_bonus: float, c: float) -> jax.Array:
    """[N, N] UCB index of every (agent, source); see `ucb`."""
    n = ps.counts.shape[0]
    pri = prior + self_bonus * jnp.eye(n, dtype=jnp.float32)
    total = ps.counts.sum(-1, keepdims=True)
    bonus = c * jnp.sqrt(2.0 * jnp.log(jnp.maximum(total + n, 2.0)) / (ps.counts + 1.0))
    return (ps.sums + pri) / (ps.counts + 1.0) + bonus


def ucb(prior: float = 0.5, self_bonus: float = 0.0, c: float = 1.0) -> Policy:
    """UCB over whom to learn from (after the hierarchical UCB of stage 1).

    Sources of agent i: itself (REVISE) and each peer j (OBSERVE j). Each source starts with one
    pseudo-observation at `prior` (self: prior + self_bonus). Index of source k:

        (sum_k + prior_k) / (count_k + 1) + c * sqrt(2 ln max(total + N, 2) / (count_k + 1)),

    total = sum_k count_k. Ties -> uniform (key). The reward of a source is the training score
    of the skill the action yielded (the revised child's evaluation, the copied skill's score).
    Actions that were refused (SKIP) update nothing.
    """
    def init(params):
        n = params.num_agents
        z = jnp.zeros((n, n), jnp.float32)
        return UCBState(z, z)

    def act_fn(key, ps, obs, params):
        n = params.num_agents
        idx = ucb_index(ps, prior, self_bonus, c)
        mask = jnp.ones((n, n), bool) if params.social else jnp.eye(n, dtype=bool)
        idx = jnp.where(mask, idx, -jnp.inf)
        ties = mask & (idx >= idx.max(-1, keepdims=True) - 1e-6)
        return _sources_to_action(choice_from_uniform(jax.random.uniform(key, (n, n)), ties), n)

    def update(ps, obs, info, params):
        n = params.num_agents
        agents = jnp.arange(n)
        k = jnp.where(info["kind"] == OBSERVE, info["target"], agents)
        did = info["kind"] != SKIP
        onehot = jax.nn.one_hot(k, n, dtype=jnp.float32) * did[:, None]
        return UCBState(ps.sums + onehot * info["gain"][:, None], ps.counts + onehot)

    return Policy(init, act_fn, update, "ucb")


RULE_DECIDERS = {"solo": solo, "random": uniform_random, "ucb": ucb}
DECIDERS = ("solo", "llm", "ucb", "random")


def get(name: str, **kw) -> Policy:
    if name not in RULE_DECIDERS:
        raise ValueError(f"unknown rule decider {name!r}; choose one of {sorted(RULE_DECIDERS)}")
    return RULE_DECIDERS[name](**kw)


# ----------------------------------------------------------------------------- metrics
def lineage(state: EnvState) -> dict:
    """Lineage of the deployed skills (host-side numbers).

    -> {"copy_then_revise_share": share of agents whose deployed skill descends from a
    copy-then-revise chain, "via_copy_share": ... from any copy, "founding_lineages": number of
    distinct founders among deployed skills}."""
    dep = np.asarray(state.deployed)
    ctr = np.asarray(state.copy_then_revise)[dep]
    via = np.asarray(state.via_copy)[dep]
    founders = np.asarray(state.founder)[dep]
    return {"copy_then_revise_share": float(ctr.mean()), "via_copy_share": float(via.mean()),
            "founding_lineages": int(len(set(founders.tolist())))}
