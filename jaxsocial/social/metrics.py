"""Society metrics, jittable: engagement of posts, action mix, invalid actions, inequality.

"Posts" below are the originals in the buffer -- kind POST or QUOTE (not reposts, not comments)
-- counted over the alive ring buffer; "mature" ones are at least `reward_horizon` ticks old, so
`mature_avg_likes` is the average likes-within-horizon per post, the Social-RL reward statistic.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxsocial.social.actions import CREATING_TYPES, INVALID_REASONS, ActionType, Reason
from jaxsocial.social.society import StepInfo
from jaxsocial.social.state import PostKind, SocialParams, SocialState


def gini(x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Gini coefficient of the non-negative values `x[mask]` (0 for empty or all-zero):

      G = sum_i (2 i - n - 1) x_(i) / (n sum_i x_(i)),  x_(1) <= ... <= x_(n).
    """
    x = jnp.asarray(x, jnp.float32).reshape(-1)
    mask = jnp.ones(x.shape, bool) if mask is None else jnp.asarray(mask).reshape(-1)
    n = jnp.sum(mask)
    xs = jnp.sort(jnp.where(mask, x, -1.0))  # masked-out entries sort first
    i = jnp.arange(1, x.shape[0] + 1, dtype=jnp.float32) - (x.shape[0] - n)  # rank among kept
    keep = xs >= 0
    num = jnp.sum(jnp.where(keep, (2.0 * i - n - 1.0) * xs, 0.0))
    den = n * jnp.sum(jnp.where(keep, xs, 0.0))
    return jnp.where(den > 0, num / jnp.maximum(den, 1e-30), 0.0)


def compute(state: SocialState, info: StepInfo, params: SocialParams) -> dict[str, jax.Array]:
    """Scalars (and two small vectors) describing the society after a step.  Cost O(P log P + N).

    Keys: posts_created (this tick, agents + crowd), total_posts (ever), alive_posts,
    avg_likes_per_post, zero_like_share, positive_engagement_share (likes + reposts + quotes +
    comments > 0), mature_avg_likes, mature_zero_like_share, likes_gini, followers_{mean,max,gini},
    following_mean, active_crowd, crowd_overflow, action_counts [NUM_TYPES] (applied, agents +
    crowd), agent_invalid [NUM_REASONS], crowd_invalid [NUM_REASONS], agent_invalid_total,
    agent_actions (non-padding rows).
    """
    posts, users = state.posts, state.users
    original = (posts.id >= 0) & ((posts.kind == PostKind.POST) | (posts.kind == PostKind.QUOTE))
    n_orig = jnp.sum(original)
    denom = jnp.maximum(n_orig, 1).astype(jnp.float32)
    likes = posts.likes.astype(jnp.float32)
    engaged = (posts.likes + posts.reposts + posts.quotes + posts.comments) > 0
    mature = original & (state.tick - posts.created_at >= params.reward_horizon)
    n_mature = jnp.maximum(jnp.sum(mature), 1).astype(jnp.float32)
    counts = info.agent.type_counts + info.crowd.apply.type_counts
    created = sum(counts[int(t)] for t in CREATING_TYPES)
    invalid = jnp.asarray([int(r) for r in INVALID_REASONS])
    agent_inv = info.agent.invalid_counts
    return {
        "tick": info.tick,
        "posts_created": created,
        "total_posts": posts.next_id,
        "alive_posts": n_orig,
        "avg_likes_per_post": jnp.sum(jnp.where(original, likes, 0.0)) / denom,
        "zero_like_share": jnp.sum(original & (posts.likes == 0)) / denom,
        "positive_engagement_share": jnp.sum(original & engaged) / denom,
        "mature_avg_likes": jnp.sum(jnp.where(mature, posts.likes_h, 0)) / n_mature,
        "mature_zero_like_share": jnp.sum(mature & (posts.likes_h == 0)) / n_mature,
        "likes_gini": gini(jnp.maximum(posts.likes, 0), original),
        "followers_mean": jnp.mean(users.num_followers.astype(jnp.float32)),
        "followers_max": jnp.max(users.num_followers),
        "followers_gini": gini(users.num_followers),
        "following_mean": jnp.mean(users.num_following.astype(jnp.float32)),
        "active_crowd": info.crowd.num_active,
        "crowd_overflow": info.crowd.active_overflow + info.crowd.event_overflow,
        "action_counts": counts,
        "agent_invalid": agent_inv,
        "crowd_invalid": info.crowd.apply.invalid_counts,
        "agent_invalid_total": jnp.sum(agent_inv[invalid]),
        "agent_actions": jnp.sum(agent_inv) - agent_inv[Reason.PADDING],
    }


def to_json(metrics: dict) -> dict:
    """Host-side: metric arrays -> a flat JSON-able dict; vectors become {name: value} maps
    (action_mix has the applied counts and shares per action type)."""
    m = jax.device_get(metrics)
    out = {}
    for key, value in m.items():
        v = np.asarray(value)
        if key == "action_counts":
            total = max(int(v.sum()), 1)
            out["action_counts"] = {a.name.lower(): int(v[a]) for a in ActionType if v[a]}
            out["action_mix"] = {a.name.lower(): float(v[a]) / total for a in ActionType if v[a]}
        elif key in ("agent_invalid", "crowd_invalid"):
            out[key] = {Reason(r).name.lower(): int(v[r]) for r in INVALID_REASONS if v[r]}
        elif v.dtype.kind in "iu":
            out[key] = int(v)
        else:
            out[key] = float(v)
    return out
