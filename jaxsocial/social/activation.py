"""Which LLM agents act at each tick: per-agent activity over a simulated 24-hour clock.

OASIS activates a subset of agents each step, each agent by its own hourly activity profile
(24 probabilities per user, taken from real accounts: a few very active users, a long tail of
occasional ones, most activity in the evening). Here:

    hourly = activation.make_profile(key, num_agents)         # [A, 24] weights in (0, 1]
    hour = activation.hour_of_tick(soc.tick, params)          # the society's clock
    agents = activation.sample_active(key, hourly[:, hour], B)  # [B] int32, sorted

A profile is a heavy-tailed base rate per agent (log-normal, `sigma`) times a diurnal curve
peaking at the agent's own hour (`peak_hour` + normal jitter of `peak_spread` hours), scaled
so the most active agent-hour is 1.

Shapes are static inside jit, so exactly `B = agents.active_per_tick` agents act every tick (OASIS's
count varies with the hour): who acts is drawn without replacement with probability
proportional to the hour's weights (Gumbel top-k = sequential weighted sampling). An agent with
weight 0 never acts while `B` others have a positive weight; so a profile must give at least `B`
agents a positive weight in every hour the run's ticks reach (`hours_used`), else zero-weight
agents would fill the remaining places. `check_profile` refuses such a profile, and one that is
negative, all zeros or not finite in float32, in one line naming the key.
"""
from __future__ import annotations

import json
import math
import os
from typing import Iterable, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsocial.social.state import SocialParams

HOURS = 24


def make_profile(key: jax.Array, num_agents: int, *, sigma: float = 1.0,
                 diurnal_amplitude: float = 0.8, peak_hour: float = 20.0,
                 peak_spread: float = 3.0) -> jax.Array:
    """Hourly activity weights [A, 24] float32 in (0, 1].

    weight[i, h] = base_i * (1 + amplitude * cos(2 pi (h - peak_i) / 24)), base_i log-normal
    with log-std `sigma` (heavy-tailed across agents), peak_i ~ N(peak_hour, peak_spread).
    """
    if num_agents < 1:
        raise ValueError(f"num_agents must be >= 1, got {num_agents}")
    if sigma < 0:
        raise ValueError(f"agents.activation.sigma={sigma} must be >= 0")
    if not 0.0 <= diurnal_amplitude < 1.0:
        raise ValueError(f"agents.activation.diurnal_amplitude={diurnal_amplitude} must be in "
                         f"[0, 1): the weight of the quietest hour stays positive")
    if peak_spread < 0:
        raise ValueError(f"agents.activation.peak_spread={peak_spread} must be >= 0")
    k_base, k_peak = jax.random.split(key)
    base = jnp.exp(sigma * jax.random.normal(k_base, (num_agents,)))
    peak = peak_hour + peak_spread * jax.random.normal(k_peak, (num_agents,))
    hours = jnp.arange(HOURS, dtype=jnp.float32)
    curve = 1.0 + diurnal_amplitude * jnp.cos(2 * jnp.pi * (hours[None, :] - peak[:, None]) / HOURS)
    w = base[:, None] * curve
    return (w / jnp.max(w)).astype(jnp.float32)


def load_profile(path: str, num_agents: int) -> np.ndarray:
    """A measured profile from disk: `.npy` or `.json`, shape [n, 24] of non-negative weights,
    cycled over the agents (agent i gets row i % n). -> [A, 24] float32, finite after the cast
    (ValueError naming the file otherwise; `check_profile` checks the rest)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"agents.activation.profile_path={path!r} does not exist")
    if path.endswith(".npy"):
        rows = np.load(path)
    else:
        with open(path, encoding="utf-8") as f:
            rows = np.asarray(json.load(f), dtype=np.float64)
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[1] != HOURS or not len(rows):
        raise ValueError(f"agents.activation.profile_path={path!r}: expected shape [n, 24], "
                         f"got {list(rows.shape)}")
    if not np.isfinite(rows).all() or (rows < 0).any():
        raise ValueError(f"agents.activation.profile_path={path!r}: weights must be finite and "
                         f">= 0")
    with np.errstate(over="ignore"):
        out = rows[np.arange(num_agents) % len(rows)].astype(np.float32)
    check_profile(out, source=f"agents.activation.profile_path={path!r}")
    return out


def check_profile(weights, active_per_tick: Optional[int] = None,
                  hours: Optional[Iterable[int]] = None,
                  source: str = "agents.activation") -> np.ndarray:
    """Refuse, in one ValueError line that starts with `source` (the config key, e.g.
    `agents.activation.profile_path='x.npy'`), a profile [A, 24] that is not finite once cast
    to float32 (1e300 becomes inf), has a negative weight, is all zeros, or, when
    `active_per_tick` is given, has fewer than `active_per_tick` agents with a positive weight
    in one of `hours` (default: every hour of the day). -> the float32 profile."""
    w = np.asarray(weights)
    if w.ndim != 2 or w.shape[1] != HOURS or w.shape[0] < 1:
        raise ValueError(f"{source}: expected weights of shape [agents, 24], got "
                         f"{list(w.shape)}")
    with np.errstate(over="ignore", invalid="ignore"):
        w = w.astype(np.float32)
    bad = ~np.isfinite(w)
    if bad.any():
        a, h = (int(i[0]) for i in np.nonzero(bad))
        raise ValueError(f"{source}: weights must be finite in float32 (agent {a}, hour {h} "
                         f"is {w[a, h]}; float32 holds up to 3.4e38)")
    if (w < 0).any():
        a, h = (int(i[0]) for i in np.nonzero(w < 0))
        raise ValueError(f"{source}: weights must be >= 0 (agent {a}, hour {h} is {w[a, h]})")
    if not (w > 0).any():
        raise ValueError(f"{source}: every weight is 0 (in float32): no agent could act")
    if active_per_tick is not None:
        every = hours is None
        hours = range(HOURS) if every else sorted(set(int(h) for h in hours))
        positive = (w > 0).sum(axis=0)
        for h in hours:
            if positive[h] < active_per_tick:
                where = ("every hour of the day" if every else
                         f"every hour the run's ticks reach ({_hour_list(hours)})")
                raise ValueError(
                    f"{source}: hour {h} has {int(positive[h])} agents with a positive weight, "
                    f"fewer than agents.active_per_tick={int(active_per_tick)}; {where} needs "
                    f"at least that many (zero-weight agents would act in their place)")
    return w


def _hour_list(hours: Sequence[int]) -> str:
    hours = list(hours)
    return ", ".join(map(str, hours)) if len(hours) < HOURS else "all 24"


def hours_used(start_seconds: int, seconds_per_tick: int, ticks_per_epoch: int, epochs: int,
               settle: int = 0) -> Tuple[int, ...]:
    """The hours of day (sorted) at which agents act in a run: epoch e's agent ticks are
    e * (ticks_per_epoch + settle) + [0, ticks_per_epoch) on the society's clock (tick 0 at
    reset; `settle` crowd-only ticks end each epoch), each at `hour_of_tick`. Exact, in
    O(min(epochs, clock period)) work: the clock repeats every 86400 / gcd(seconds_per_tick,
    86400) ticks."""
    day = 24 * 3600
    if ticks_per_epoch < 1 or epochs < 1:
        return ()
    spt = int(seconds_per_tick) % day
    period = day // math.gcd(spt, day)  # spt = 0: one tick, the clock stands still
    stride = int(ticks_per_epoch) + max(int(settle), 0)
    if ticks_per_epoch >= period:
        ticks = np.arange(period, dtype=np.int64)
    else:
        # epoch starts repeat (mod period) after period / gcd(stride, period) epochs
        n = min(int(epochs), period // math.gcd(stride % period or period, period))
        starts = (np.arange(n, dtype=np.int64) * stride) % period
        cover = np.zeros(period + 1, np.int64)  # difference array of the [start, start + T)
        ends = starts + ticks_per_epoch
        np.add.at(cover, starts, 1)
        np.add.at(cover, np.minimum(ends, period), -1)
        wrap = ends > period
        np.add.at(cover, np.zeros(int(wrap.sum()), np.int64), 1)
        np.add.at(cover, ends[wrap] - period, -1)
        ticks = np.nonzero(np.cumsum(cover[:period]) > 0)[0]
    seconds = (int(start_seconds) % day + (ticks * spt) % day) % day
    return tuple(int(h) for h in np.unique(seconds // 3600))


def hours_of_run(config) -> Tuple[int, ...]:
    """`hours_used` for a Social-RL run config: its society clock (`society.start_seconds`,
    `society.seconds_per_tick`, SocialParams' defaults when unset), `rollout.ticks_per_epoch`,
    `train.epochs` and the settle ticks (`reward.horizon` - 1 when `reward.settle`)."""
    defaults = SocialParams()
    soc = config.get("society", None) or {}
    reward = config.get("reward", None) or {}
    settle = int(reward.get("horizon", 1)) - 1 if reward.get("settle", False) else 0
    return hours_used(int(soc.get("start_seconds", defaults.start_seconds)),
                      int(soc.get("seconds_per_tick", defaults.seconds_per_tick)),
                      int(config.rollout.ticks_per_epoch), int(config.train.epochs), settle)


def hour_of_tick(tick: jax.Array, params: SocialParams) -> jax.Array:
    """Hour of day (UTC) [] int32 of a society tick, by its clock (`start_seconds`,
    `seconds_per_tick`)."""
    day = 24 * 3600
    # (start + tick * seconds_per_tick) mod day in int32: each factor reduced mod day (< 2^17)
    # and the product split so no partial result passes 2^31 (start_seconds is ~1.7e9).
    a = jnp.asarray(tick, jnp.int32) % day
    b = params.seconds_per_tick % day
    prod = ((((a // 512) * b) % day) * 512 + (a % 512) * b) % day
    s = (params.start_seconds % day + prod) % day
    return (s // 3600).astype(jnp.int32)


def sample_active(key: jax.Array, weights: jax.Array, num_active: int) -> jax.Array:
    """`num_active` distinct agents [B] int32 (sorted), drawn without replacement with
    probability proportional to `weights` [A] (Gumbel top-k)."""
    a = weights.shape[0]
    if not 1 <= num_active <= a:
        raise ValueError(f"num_active={num_active} must be in [1, {a}]")
    g = jax.random.gumbel(key, (a,))
    logw = jnp.where(weights > 0, jnp.log(jnp.maximum(weights, 1e-30)), -jnp.inf)
    _, idx = jax.lax.top_k(logw + g, num_active)
    return jnp.sort(idx).astype(jnp.int32)


def from_config(cfg, num_agents: int, seed: int, *, active_per_tick: Optional[int] = None,
                hours: Optional[Iterable[int]] = None) -> Optional[np.ndarray]:
    """The run's profile [A, 24] from `agents.activation` (None when not enabled): the file at
    `profile_path`, or `make_profile` keyed by the run's seed. Checked by `check_profile`
    (finite in float32, >= 0, not all zero; with `active_per_tick`, that many agents of
    positive weight in each of `hours`, every hour of the day when `hours` is None)."""
    if cfg is None or not bool(cfg.get("enabled", False)):
        return None
    path = str(cfg.get("profile_path", "") or "")
    if path:
        w = load_profile(path, num_agents)
        source = f"agents.activation.profile_path={path!r}"
    else:
        w = np.asarray(make_profile(
            jax.random.key(int(seed) + 24), num_agents, sigma=float(cfg.sigma),
            diurnal_amplitude=float(cfg.diurnal_amplitude), peak_hour=float(cfg.peak_hour),
            peak_spread=float(cfg.peak_spread)))
        source = "agents.activation"
    return check_profile(w, active_per_tick, hours, source)


def check_config(config) -> None:
    """For a Social-RL run config with `agents.activation.enabled`: build the profile as the
    run will (`from_config`) and check it against `agents.active_per_tick` over the hours the
    run's ticks reach (`hours_of_run`). ValueError in one line naming the key; nothing when
    activation is off. Cheap (reads the profile file; no model)."""
    agents = config.agents
    cfg = agents.get("activation", None)
    if cfg is None or not bool(cfg.get("enabled", False)):
        return
    a = int(agents.num_agents)
    active = int(agents.get("active_per_tick", 0)) or a
    from_config(cfg, a, int(config.get("seed", 0)), active_per_tick=active,
                hours=hours_of_run(config))
