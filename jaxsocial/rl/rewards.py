"""Social reward: what a post earned from the society within a horizon of H ticks.

The rollout records, for every tick t, the per-slot engagement deltas of the post ring buffer
(`deltas [T, P, E]`: likes, reposts, comments, ... gained during tick t by the post that holds the
slot after the tick) and which post id holds each slot after the tick (`slot_ids [T, P]`).
A post with global id c created at tick t0 earns

    score(c) = sum_e w_e * sum_{t0 <= t < t0 + H} [slot_ids[t, c % P] == c] * deltas[t, c % P, e]

so engagement keeps counting only while the post is alive: a post evicted from the ring buffer
keeps what it earned before eviction, and the post that takes its slot earns nothing for it.
New followers of the post's author within the horizon can be added with their own weight.
"""

from __future__ import annotations

from typing import Optional

import chex
import jax
import jax.numpy as jnp

Array = jax.Array

# How an answer that created no post is scored (`reward.non_post_mode`): "constant" =
# `reward.non_post`; "mean" = the epoch's mean post score; "skip" = left out of the update.
NON_POST_MODES = ("constant", "mean", "skip")


def engagement_within_horizon(created_id: Array, created_tick: Array, deltas: Array,
                              slot_ids: Array, horizon: int, first_tick: Array = 0) -> Array:
    """Per-post engagement within the horizon.

    created_id [M] int32 global post ids (-1 = no post: returns 0), created_tick [M] int32,
    deltas [T, P, E] engagement gained during each recorded tick, slot_ids [T, P] int32 post id
    in each slot after the tick; recorded tick i is society tick `first_tick + i`.
    Returns [M, E] float32.
    """
    chex.assert_rank([created_id, created_tick, deltas, slot_ids], [1, 1, 3, 2])
    t, p, _ = deltas.shape
    slot = jnp.maximum(created_id, 0) % p
    ticks = first_tick + jnp.arange(t)
    window = ((ticks[:, None] >= created_tick[None, :])
              & (ticks[:, None] < created_tick[None, :] + horizon))            # [T, M]
    alive = slot_ids[:, slot] == created_id[None, :]                           # [T, M]
    use = window & alive & (created_id[None, :] >= 0)
    per_tick = deltas[:, slot, :].astype(jnp.float32)                          # [T, M, E]
    return jnp.sum(jnp.where(use[..., None], per_tick, 0.0), axis=0)


def followers_within_horizon(author: Array, created_tick: Array, follower_delta: Array,
                             horizon: int, first_tick: Array = 0,
                             valid: Optional[Array] = None) -> Array:
    """New followers of each post's author within the horizon: [M] float32.

    author [M] int32 (index into follower_delta's user axis), follower_delta [T, U] followers
    gained per tick by each tracked user."""
    t = follower_delta.shape[0]
    ticks = first_tick + jnp.arange(t)
    window = ((ticks[:, None] >= created_tick[None, :])
              & (ticks[:, None] < created_tick[None, :] + horizon))
    gained = follower_delta[:, jnp.maximum(author, 0)].astype(jnp.float32)      # [T, M]
    out = jnp.sum(jnp.where(window, gained, 0.0), axis=0)
    return out if valid is None else jnp.where(valid, out, 0.0)


NORMALIZE_MODES = ("none", "center", "whiten", "running")


def normalize_scores(scores: Array, mode: str, eps: float = 1e-6) -> Array:
    """Per-epoch score normalisation of scores [M]: 'none' | 'center' | 'whiten' (zero mean,
    unit std over the batch) | 'running'.

    'running' keeps statistics across epochs, so it is not done here (scores pass through):
    the PPO update divides them by the running std of all scores so far
    (`PPOConfig.reward_norm="running"`, the statistics in `TrainState.reward_stats`, saved in
    every checkpoint)."""
    if mode in ("none", "running"):
        return scores
    if mode == "center":
        return scores - scores.mean()
    if mode == "whiten":
        return (scores - scores.mean()) / (scores.std() + eps)
    raise ValueError(f"unknown reward normalisation {mode!r}; use "
                     f"{', '.join(NORMALIZE_MODES)}")
