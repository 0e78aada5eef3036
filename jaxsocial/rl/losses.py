"""The loss terms PPO and GRPO share, as pure functions ([B, T] float32 over the response
tokens unless stated; mask 1 on valid tokens).

  masked_sum / _mean / _var / _whiten   statistics over the valid tokens
  kl_penalty / sequence_kl              k1 / k2 / k3 per-token KL estimate to the reference
  has_stop_token / stop_penalized       the missing-stop-token penalty on the scores
  clipped_surrogate / policy_loss       the clipped surrogate (symmetric or asymmetric eps)
  value_loss / explained_variance       the clipped value loss (PPO's critic)
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxsocial.rl.config import KL_ESTIMATORS

Array = jax.Array


def masked_sum(x: Array, mask: Array, axis=None) -> Array:
    return jnp.sum(x * mask.astype(x.dtype), axis=axis)


def masked_mean(x: Array, mask: Array, axis=None) -> Array:
    """sum(x * m) / max(sum(m), 1)."""
    m = mask.astype(jnp.float32)
    return jnp.sum(x * m, axis=axis) / jnp.maximum(jnp.sum(m, axis=axis), 1.0)


def masked_var(x: Array, mask: Array, unbiased: bool = True) -> Array:
    """Variance over valid entries; unbiased (n / (n - 1)) by default, as TRL's whiten."""
    m = mask.astype(jnp.float32)
    mean = masked_mean(x, m)
    n = jnp.sum(m)
    var = jnp.sum(jnp.square(x - mean) * m) / jnp.maximum(n, 1.0)
    if unbiased:
        var = var * n / jnp.maximum(n - 1.0, 1.0)
    return var


def masked_whiten(x: Array, mask: Array, shift_mean: bool = True, eps: float = 1e-8) -> Array:
    """(x - mean) / sqrt(var + eps) over the valid entries; masked entries become 0.

    shift_mean=False adds the mean back (scale only), as done for rewards.
    """
    m = mask.astype(jnp.float32)
    mean = masked_mean(x, m)
    w = (x - mean) * jax.lax.rsqrt(masked_var(x, m) + eps)
    if not shift_mean:
        w = w + mean
    return w * m


def kl_penalty(logprobs: Array, ref_logprobs: Array, estimator: str = "k1") -> Array:
    """Per-token KL(pi || pi_ref) estimate from sampled-token log-probs, [B, T].

    k1 = lp - ref;  k2 = 0.5 * (lp - ref)^2;  k3 = exp(ref - lp) - (ref - lp) - 1 (>= 0).
    """
    d = logprobs.astype(jnp.float32) - ref_logprobs.astype(jnp.float32)
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * jnp.square(d)
    if estimator == "k3":
        return jnp.expm1(-d) + d
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}")


def last_valid_index(mask: Array) -> Array:
    """Index of the last 1 in each row of mask [B, T] (0 for an empty row), int32 [B]."""
    t = mask.shape[-1]
    idx = jnp.arange(t, dtype=jnp.int32)
    return jnp.max(jnp.where(mask.astype(bool), idx, 0), axis=-1)


def has_stop_token(tokens: Array, mask: Array, stop_token_ids) -> Array:
    """True where a valid token of the row is one of stop_token_ids, bool [B]."""
    stop = jnp.asarray(tuple(stop_token_ids), jnp.int32).reshape(1, 1, -1)
    is_stop = jnp.any(tokens[..., None] == stop, axis=-1) & mask.astype(bool)
    return jnp.any(is_stop, axis=-1)


def stop_penalized(scores: Array, tokens: Array, mask: Array, stop_token_ids,
                   penalty: float) -> Array:
    """scores [B] as float32, minus `penalty` where the response tokens [B, T] hold no stop
    token (a truncated answer); unchanged when the penalty or the stop set is empty."""
    scores = scores.astype(jnp.float32)
    if not penalty or not stop_token_ids:
        return scores
    stopped = has_stop_token(tokens, mask, stop_token_ids)
    return scores - jnp.where(stopped, 0.0, penalty)


def sequence_kl(logprobs: Array, ref_logprobs: Array, mask: Array) -> Array:
    """Mean over rows of the per-sequence summed k1 KL to the reference (a scalar)."""
    return jnp.mean(jnp.sum(kl_penalty(logprobs, ref_logprobs, "k1") * mask, axis=-1))


def clipped_surrogate(logprobs: Array, old_logprobs: Array, advantages: Array, mask: Array,
                      clip_eps: float = 0.2, clip_eps_high: Optional[float] = None,
                      denom: Optional[Array] = None) -> tuple[Array, dict]:
    """Per-token clipped surrogate [B, T] (not masked) and its statistics (sums over valid
    tokens / denom, default the token count). advantages: [B, T] or [B, 1].

    ratio = exp(lp - lp_old); loss_t = max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps_high)).
    Stats: clip_frac (tokens where the clipped branch is strictly larger), approx_kl
    (mean of (ratio - 1) - log ratio), ratio mean.
    """
    m = mask.astype(jnp.float32)
    denom = jnp.maximum(jnp.sum(m), 1.0) if denom is None else denom
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    log_ratio = logprobs - old_logprobs
    ratio = jnp.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - clip_eps, 1.0 + eps_high)
    stats = {
        "clip_frac": jnp.sum((clipped > unclipped).astype(jnp.float32) * m) / denom,
        "approx_kl": jnp.sum((ratio - 1.0 - log_ratio) * m) / denom,
        "ratio": jnp.sum(ratio * m) / denom,
    }
    return jnp.maximum(unclipped, clipped), stats


def policy_loss(logprobs: Array, old_logprobs: Array, advantages: Array, mask: Array,
                clip_eps: float = 0.2, clip_eps_high: Optional[float] = None,
                denom: Optional[Array] = None) -> tuple[Array, dict]:
    """The clipped surrogate averaged over valid tokens (sum / denom, default the token
    count), with `clipped_surrogate`'s statistics."""
    m = mask.astype(jnp.float32)
    denom = jnp.maximum(jnp.sum(m), 1.0) if denom is None else denom
    per_token, stats = clipped_surrogate(logprobs, old_logprobs, advantages, mask, clip_eps,
                                         clip_eps_high, denom)
    return jnp.sum(per_token * m) / denom, stats


def value_loss(values: Array, old_values: Array, returns: Array, mask: Array,
               value_clip: float = 0.2, denom: Optional[Array] = None) -> tuple[Array, dict]:
    """0.5 * max((v - R)^2, (v_old + clip(v - v_old, -c, c) - R)^2), averaged over valid
    tokens (sum / denom). Stats: vf_clip_frac, value_error (mean (v - R)^2)."""
    m = mask.astype(jnp.float32)
    denom = jnp.maximum(jnp.sum(m), 1.0) if denom is None else denom
    v_clipped = old_values + jnp.clip(values - old_values, -value_clip, value_clip)
    l1 = jnp.square(values - returns)
    l2 = jnp.square(v_clipped - returns)
    loss = 0.5 * jnp.sum(jnp.maximum(l1, l2) * m) / denom
    stats = {
        "vf_clip_frac": jnp.sum((l2 > l1).astype(jnp.float32) * m) / denom,
        "value_error": jnp.sum(l1 * m) / denom,
    }
    return loss, stats


def explained_variance(values: Array, returns: Array, mask: Array) -> Array:
    """1 - Var[R - V] / Var[R] over valid tokens."""
    var_r = masked_var(returns, mask, unbiased=False)
    var_d = masked_var(returns - values, mask, unbiased=False)
    return 1.0 - var_d / jnp.maximum(var_r, 1e-8)
