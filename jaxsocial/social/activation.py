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
weight 0 never acts while `B` others have a positive weight.
"""
from __future__ import annotations

import json
import os
from typing import Optional

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
    cycled over the agents (agent i gets row i % n). -> [A, 24] float32."""
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
    return rows[np.arange(num_agents) % len(rows)].astype(np.float32)


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


def from_config(cfg, num_agents: int, seed: int) -> Optional[np.ndarray]:
    """The run's profile [A, 24] from `agents.activation` (None when not enabled): the file at
    `profile_path`, or `make_profile` keyed by the run's seed."""
    if cfg is None or not bool(cfg.get("enabled", False)):
        return None
    path = str(cfg.get("profile_path", "") or "")
    if path:
        return load_profile(path, num_agents)
    return np.asarray(make_profile(
        jax.random.key(int(seed) + 24), num_agents, sigma=float(cfg.sigma),
        diurnal_amplitude=float(cfg.diurnal_amplitude), peak_hour=float(cfg.peak_hour),
        peak_spread=float(cfg.peak_spread)))
