"""Cohorts: several policies in one society, each a LoRA adapter over one shared base.

`agents.cohorts` names groups of LLM agents. A cohort is `trainable` (its own adapter, value
head, optimizer state and PPO / GRPO update) or frozen (the base model alone), and has its own
reward weights and, optionally, its own personas. The default, `()`, is today's run: one
trainable policy for every agent, with none of the machinery below.

The layout is static, so every shape in the epoch is too:
- members: cohort c holds agents `members[c]` (contiguous blocks by `share`, or explicit `ids`);
- each tick, `active[c]` of its agents act (all of them, a uniform subset, or drawn by the
  activity profile within the cohort), and the tick's B rows are the cohorts' rows in order:
  row b belongs to cohort `row_cohort[b]` and uses adapter `row_slot[b]` (-1: frozen);
- trainable cohort k (adapter slot k) owns the epoch's rows `rows[k]` [R] of the flattened
  [T * B] trajectories. Trainable cohorts act equally often (R is the same for all of them),
  so their updates run as one `lax.map` over stacked [K, ...] states with no padding.

The train state of a cohort run is a `TrainState` whose every field but `ref_params` (the shared
base) is stacked along a leading [K] axis (`init_train_states`, `map_cohorts`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsocial.rl import optim
from jaxsocial.rl.state import TrainState
from jaxsocial.train import config as run_config

# the engagement channels' weights in their recorded order, then new followers
REWARD_KEYS = run_config.ENGAGEMENT_REWARDS + ("new_followers",)
COHORT_KEYS = ("name", "share", "ids", "trainable", "reward", "personas", "copy_from",
               "copy_every")


@dataclasses.dataclass(frozen=True, eq=False)
class Cohorts:
    """The static cohort layout of a run (see the module docstring); C cohorts, K trainable."""

    names: Tuple[str, ...]
    trainable: Tuple[bool, ...]
    members: Tuple[np.ndarray, ...]   # per cohort: its agent ids [n_c] int32, sorted
    active: Tuple[int, ...]           # per cohort: agents acting per tick
    reward: np.ndarray                # [C, 6] float32, one column per REWARD_KEYS entry
    personas: Tuple[Tuple[str, ...], ...]  # per cohort: its personas (() = agents.personas)
    agent_cohort: np.ndarray          # [A] int32
    copy_from: Tuple[str, ...] = ()   # per cohort: "" (never), "best" or a cohort's name
    copy_every: Tuple[int, ...] = ()  # per cohort: copy after every N-th epoch

    @property
    def num(self) -> int:
        return len(self.names)

    @property
    def slots(self) -> Tuple[int, ...]:
        """Cohort -> adapter slot (its index among the trainable cohorts), -1 when frozen."""
        out, k = [], 0
        for t in self.trainable:
            out.append(k if t else -1)
            k += int(t)
        return tuple(out)

    @property
    def trained(self) -> Tuple[int, ...]:
        """The trainable cohorts' indices, in slot order."""
        return tuple(c for c, t in enumerate(self.trainable) if t)

    @property
    def num_trainable(self) -> int:
        return len(self.trained)

    @property
    def row_cohort(self) -> np.ndarray:
        """[B] int32: the cohort of each row of a tick."""
        return np.repeat(np.arange(self.num, dtype=np.int32), self.active)

    @property
    def row_slot(self) -> np.ndarray:
        """[B] int32: the adapter of each row of a tick (-1: frozen, the base alone)."""
        return np.asarray(self.slots, np.int32)[self.row_cohort]

    def rows(self, ticks: int) -> np.ndarray:
        """[K, ticks * active_k] int32: each trainable cohort's rows of the flat [T * B] epoch."""
        b = int(sum(self.active))
        start = np.concatenate([[0], np.cumsum(self.active)[:-1]])
        return np.stack([(np.arange(ticks)[:, None] * b + start[c]
                          + np.arange(self.active[c])[None, :]).reshape(-1)
                         for c in self.trained]).astype(np.int32)


def _problem(msg: str):
    return ValueError(f"agents.cohorts: {msg}")


def _sizes_by_share(shares: Sequence[float], num_agents: int) -> list:
    total = float(sum(shares))
    if abs(total - 1.0) > 1e-6:
        raise _problem(f"the shares {tuple(shares)} sum to {total:g}, not 1")
    sizes = [int(round(s * num_agents)) for s in shares]
    sizes[-1] = num_agents - sum(sizes[:-1])
    if min(sizes) < 1:
        raise _problem(f"shares {tuple(shares)} of {num_agents} agents leave a cohort empty "
                       f"(sizes {sizes})")
    return sizes


def _members(entries, num_agents: int) -> list:
    by_ids = [bool(e.get("ids")) for e in entries]
    if any(by_ids) and not all(by_ids):
        raise _problem("give every cohort `ids` or every cohort a `share`, not a mix")
    if all(by_ids):
        members = [np.sort(np.asarray(e["ids"], np.int64)) for e in entries]
        flat = np.concatenate(members)
        bad = flat[(flat < 0) | (flat >= num_agents)]
        if bad.size:
            raise _problem(f"agent id {int(bad[0])} is outside [0, {num_agents}) "
                           f"(agents.num_agents={num_agents})")
        if len(set(flat.tolist())) != flat.size or flat.size != num_agents:
            missing = sorted(set(range(num_agents)) - set(flat.tolist()))
            raise _problem("every agent must be in exactly one cohort: "
                           + (f"agents {missing[:5]} are in none" if missing else
                              "some agent is in two cohorts"))
        return [m.astype(np.int32) for m in members]
    shares = []
    for i, e in enumerate(entries):
        s = e.get("share", None)
        if s is None or not float(s) > 0:
            raise _problem(f"cohort {i} ({e.get('name', '?')!r}) needs share > 0 or ids, "
                           f"got share={s!r}")
        shares.append(float(s))
    sizes = _sizes_by_share(shares, num_agents)
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return [np.arange(s, s + n, dtype=np.int32) for s, n in zip(start, sizes)]


def from_config(config) -> Optional[Cohorts]:
    """The run's `Cohorts` from `agents.cohorts` (None for `()`: one policy, today's run).
    Raises ValueError naming the bad value: unknown keys, shares that do not sum to 1, agents
    in no cohort or two, duplicate names, a per-tick activity that does not split evenly,
    trainable cohorts that act unequally, or cohorts without LoRA."""
    entries = [dict(e) for e in (config.agents.get("cohorts", ()) or ())]
    if not entries:
        return None
    a = int(config.agents.num_agents)
    active = int(config.agents.get("active_per_tick", 0)) or a
    _check_keys(entries)
    names = tuple(str(e.get("name", f"cohort{i}")) for i, e in enumerate(entries))
    if len(set(names)) != len(names) or not all(n and "/" not in n for n in names):
        raise _problem(f"names {names} must be distinct, non-empty and free of '/'")
    trainable = tuple(bool(e.get("trainable", True)) for e in entries)
    _check_run(config, trainable)
    members = _members(entries, a)
    acting = _acting(names, trainable, members, active, a, config.rl)
    copy_from = tuple(str(e.get("copy_from", "") or "") for e in entries)
    copy_every = tuple(int(e.get("copy_every", 1)) for e in entries)
    _check_copies(names, trainable, copy_from, copy_every)
    r = config.reward
    reward = np.asarray([[float(dict(e.get("reward", {}) or {}).get(k, r.get(k, 0.0)))
                          for k in REWARD_KEYS] for e in entries], np.float32)
    agent_cohort = np.zeros(a, np.int32)
    for c, m in enumerate(members):
        agent_cohort[m] = c
    return Cohorts(names=names, trainable=trainable, members=tuple(members),
                   active=tuple(acting), reward=reward,
                   personas=tuple(tuple(e.get("personas", ()) or ()) for e in entries),
                   agent_cohort=agent_cohort, copy_from=copy_from, copy_every=copy_every)


def _check_keys(entries) -> None:
    """Every cohort's keys and reward keys are known ones."""
    for i, e in enumerate(entries):
        unknown = sorted(set(e) - set(COHORT_KEYS))
        if unknown:
            raise _problem(f"cohort {i} has unknown keys {unknown}; use {COHORT_KEYS}")
        bad = sorted(set(dict(e.get("reward", {}) or {})) - set(REWARD_KEYS))
        if bad:
            raise _problem(f"cohort {i}'s reward has unknown keys {bad}; use {REWARD_KEYS}")


def _check_run(config, trainable: Tuple[bool, ...]) -> None:
    """What a cohort run needs of the rest of the config: a trainable cohort, LoRA, and the
    one-program epoch."""
    if not any(trainable):
        raise _problem("no cohort is trainable: set trainable=True on at least one")
    if int(config.rl.lora_rank) < 1:
        raise _problem(f"cohorts train one LoRA adapter each over a shared base: set "
                       f"rl.lora_rank > 0 (got {config.rl.lora_rank})")
    if bool(config.code.enabled) or not bool(config.train.get("fused_epoch", True)):
        raise _problem("cohorts run as one compiled epoch: the host-reward path "
                       "(code.enabled, train.fused_epoch=False) is not supported with them")


def _acting(names, trainable, members, active: int, num_agents: int, rl) -> list:
    """Per cohort: its agents acting per tick (its share of `active`, a whole number), equal
    over the trainable cohorts and (GRPO) split evenly by rl.group_size."""
    acting = []
    for name, m in zip(names, members):
        n_act = active * len(m) / num_agents
        if n_act != int(n_act) or n_act < 1:
            raise _problem(f"cohort {name!r} has {len(m)} of {num_agents} agents: with "
                           f"agents.active_per_tick={active} its share of the acting agents "
                           f"({n_act:g}) must be a whole number >= 1")
        acting.append(int(n_act))
    trained_active = {acting[c] for c, t in enumerate(trainable) if t}
    if len(trained_active) > 1:
        raise _problem(f"trainable cohorts must act equally often (their updates share one "
                       f"compiled step): agents acting per tick {dict(zip(names, acting))}")
    if rl.algo == "grpo":
        g = int(rl.get("group_size", 0) or 0)
        if g and next(iter(trained_active)) % g:
            raise _problem(f"rl.group_size={g} must divide each trainable cohort's agents "
                           f"acting per tick ({next(iter(trained_active))})")
    return acting


def _check_copies(names, trainable, copy_from, copy_every) -> None:
    """copy_from: only a trainable cohort copies, from "best" or another trainable cohort,
    every copy_every >= 1 epochs."""
    for name, t, src, every in zip(names, trainable, copy_from, copy_every):
        if not src:
            continue
        if not t:
            raise _problem(f"cohort {name!r} is frozen: only a trainable cohort can copy "
                           f"(copy_from={src!r})")
        if src != "best" and (src not in names or not trainable[names.index(src)]
                              or src == name):
            raise _problem(f"cohort {name!r}: copy_from={src!r} must be 'best' or another "
                           f"trainable cohort's name")
        if every < 1:
            raise _problem(f"cohort {name!r}: copy_every={every} must be >= 1")


def personas(cohorts: Optional[Cohorts], base: Sequence[str]) -> Tuple[str, ...]:
    """Each agent's persona: its cohort's own (cycled over the cohort's members) where the
    cohort gives personas, else the run's `base` [A] personas."""
    out = list(base)
    if cohorts is not None:
        for m, own in zip(cohorts.members, cohorts.personas):
            for j, agent in enumerate(m):
                if own:
                    out[int(agent)] = own[j % len(own)]
    return tuple(out)


# ----------------------------------------------------------------------------------------------
# inside the epoch


def acting_agents(cohorts: Cohorts, key, weights_of_hour=None, sample=None):
    """[B] int32: each cohort's acting agents in cohort order: all of its members, a uniform
    subset, or (weights_of_hour [A], `sample(key, weights, n)` -> [n] sorted indices) drawn by
    the activity profile within the cohort."""
    keys = jax.random.split(key, cohorts.num)
    out = []
    for c, (m, n) in enumerate(zip(cohorts.members, cohorts.active)):
        members = jnp.asarray(m)
        if weights_of_hour is not None:
            out.append(members[sample(keys[c], weights_of_hour[members], n)])
        elif n < len(m):
            out.append(jnp.sort(members[jax.random.permutation(keys[c], len(m))[:n]]))
        else:
            out.append(members)
    return jnp.concatenate(out).astype(jnp.int32)


def row_values(head: dict, hidden: jax.Array, row_slot: jax.Array) -> jax.Array:
    """Values [B, N] float32 of hidden [B, N, H] through each row's cohort value head (head:
    kernel [K, H], bias [K]); frozen rows (slot -1) get 0."""
    v = hidden.astype(jnp.float32) @ head["kernel"].T + head["bias"]          # [B, N, K]
    pick = jax.nn.one_hot(row_slot, head["bias"].shape[0], dtype=jnp.float32)  # [B, K]
    return jnp.sum(v * pick[:, None, :], axis=-1)


def init_train_states(rl_config, pdef, params_list: Sequence[Any], ref_params, key
                      ) -> TrainState:
    """The K trainable cohorts' TrainStates stacked along [K] (each its own params, optimizer
    state, KL and reward statistics, counters and key from `key`), sharing `ref_params`."""
    keys = jax.random.split(key, len(params_list))
    states = [optim.init_train_state(rl_config, pdef, p, None, k).replace(ref_params=None)
              for p, k in zip(params_list, keys)]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *states)
    return stacked.replace(ref_params=ref_params)


def map_cohorts(fn: Callable, train: TrainState, xs) -> Tuple[TrainState, Any]:
    """`lax.map` of fn(train_k, x_k) -> (train_k, out_k) over the K stacked cohorts: one cohort's
    step is live at a time (a merged or adapted forward of one adapter), the base shared."""
    ref = train.ref_params

    def one(args):
        t, x = args
        new, out = fn(t.replace(ref_params=ref), x)
        return new.replace(ref_params=None), out

    new, out = jax.lax.map(one, (train.replace(ref_params=None), xs))
    return new.replace(ref_params=ref), out


def copies(cohorts: Cohorts, epoch: int, reward: dict) -> dict:
    """{copying cohort: source cohort} after `epoch` (1-based): each trainable cohort with
    `copy_from` whose `copy_every` divides the epoch takes the named cohort's adapter, or with
    "best" the trainable cohort with the highest mean reward this epoch (`reward`: {name:
    reward_mean}; ties: the first in order), unless that is itself. The tournament paper's
    "observe", as an operation on adapters."""
    out = {}
    trained = [cohorts.names[c] for c in cohorts.trained]
    best = max(trained, key=lambda n: (float(reward[n]), -trained.index(n)))
    for c in cohorts.trained:
        name, src = cohorts.names[c], cohorts.copy_from[c] if cohorts.copy_from else ""
        if src and epoch % cohorts.copy_every[c] == 0:
            src = best if src == "best" else src
            if src != name:
                out[name] = src
    return out


@jax.jit
def _copy_slot(train: TrainState, dst, src) -> TrainState:
    move = lambda x: x.at[dst].set(x[src])  # noqa: E731
    return train.replace(params=jax.tree.map(move, train.params),
                         opt_state=jax.tree.map(move, train.opt_state))


def copy_adapters(cohorts: Cohorts, train: TrainState, moves: dict) -> TrainState:
    """`train` with each {dst: src} cohort's adapter, value head and optimizer state (the
    Adam moments and step count) replaced by the source cohort's; its KL and reward
    statistics, counters and key stay its own."""
    for dst, src in moves.items():
        slots = cohorts.slots
        train = _copy_slot(train, jnp.int32(slots[cohorts.names.index(dst)]),
                           jnp.int32(slots[cohorts.names.index(src)]))
    return train


def cohort_params(train: TrainState, slot: int):
    """The trainable params of adapter slot `slot` (one cohort's slice of the stacked state)."""
    return jax.tree.map(lambda x: x[slot], train.params)
