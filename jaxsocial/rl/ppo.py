"""Token-level PPO for an LLM policy, as pure JAX functions with Optax.

Pieces (all [B, T] float32 over the response tokens unless stated; mask 1 on valid tokens):
  kl_penalty         k1 / k2 / k3 per-token KL estimate to the reference policy
  token_rewards      r_t = -beta * kl_t (+ episode score at the last valid token)
  compute_gae        GAE as a reverse lax.scan; returns = advantages + values
  masked_whiten      (x - mean) / std over valid tokens
  policy_loss        clipped surrogate, symmetric or asymmetric eps
  value_loss         clipped value loss
  adaptive_kl_update Ziegler et al. (2019) proportional controller
  make_update        the jitted update: epochs x shuffled minibatches (x grad accumulation)
                     as lax.scan, optax.chain(clip_by_global_norm, adamw(schedule)), with a
                     NaN/inf guard that skips the step and bumps a counter.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import chex
import jax
import jax.numpy as jnp
import optax

from jaxsocial.rl import common
from jaxsocial.rl import state as state_lib
from jaxsocial.rl.buffer import Trajectory, check_trajectory

Array = jax.Array

KL_ESTIMATORS = common.KL_ESTIMATORS
LR_SCHEDULES = common.LR_SCHEDULES
REWARD_NORMS = ("none", "running")


# ----------------------------------------------------------------------------------------------
# Config


@dataclasses.dataclass(frozen=True)
class PPOConfig(common.OptimConfig):
    """PPO knobs; defaults from spec/ppo.md (TRL-style token-level PPO). The optimizer, update
    structure, surrogate, KL and sampling fields come from `common.OptimConfig`."""

    # value loss
    value_clip: float = 0.2
    vf_coef: float = 0.1
    # advantages
    gamma: float = 1.0
    lam: float = 0.95
    whiten_advantages: bool = True
    whiten_rewards: bool = False
    reward_norm: str = "none"            # "running": divide scores by a running std
    reward_clip: Optional[float] = None  # clip (normalised) scores to [-c, c]
    # adaptive KL controller (Ziegler et al. 2019); it starts from kl_coef
    adaptive_kl: bool = False
    adaptive_kl_init: Optional[float] = None  # None: start from kl_coef (an explicit start)
    kl_target: float = 6.0
    kl_horizon: float = 10_000.0

    def __post_init__(self):
        super().__post_init__()
        if self.reward_norm not in REWARD_NORMS:
            raise ValueError(f"reward_norm={self.reward_norm!r}; choose one of {REWARD_NORMS}")
        if self.value_clip <= 0:
            raise ValueError(f"value_clip must be > 0, got {self.value_clip}")
        if not 0.0 <= self.lam <= 1.0 or not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma and lam must be in [0, 1], got {self.gamma}, {self.lam}")
        if self.adaptive_kl and self.kl_coef <= 0 and self.adaptive_kl_init is None:
            raise ValueError(f"adaptive_kl starts from kl_coef, which must be > 0 "
                             f"(a multiplicative controller cannot leave 0), got {self.kl_coef}")

    @property
    def initial_kl_coef(self) -> float:
        if self.adaptive_kl and self.adaptive_kl_init is not None:
            return self.adaptive_kl_init
        return self.kl_coef


def _check_common(cfg) -> None:
    """Kept for callers of the old helper: the checks now live in OptimConfig.__post_init__."""
    common.OptimConfig.__post_init__(cfg)


def sampling_config(cfg, max_new_tokens: int):
    """The generation SamplingConfig matching the RL config's sampling distribution."""
    from jaxsocial.rl.policy import _sampling
    return _sampling(cfg, max_new_tokens)


def make_schedule(cfg) -> optax.Schedule:
    """Linear warmup 0 -> lr over warmup_steps, then constant or cosine to end_lr_ratio * lr."""
    lr = cfg.learning_rate
    if cfg.lr_schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            0.0, lr, max(cfg.warmup_steps, 0), max(cfg.warmup_steps + cfg.decay_steps, 1),
            end_value=lr * cfg.end_lr_ratio)
    if cfg.warmup_steps > 0:
        return optax.join_schedules(
            [optax.linear_schedule(0.0, lr, cfg.warmup_steps), optax.constant_schedule(lr)],
            [cfg.warmup_steps])
    return optax.constant_schedule(lr)


def make_optimizer(cfg) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """optax.chain(clip_by_global_norm(max_grad_norm), adamw(schedule)) and the schedule."""
    schedule = make_schedule(cfg)
    tx = optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.adamw(schedule, b1=cfg.adam_b1, b2=cfg.adam_b2, eps=cfg.adam_eps,
                    weight_decay=cfg.weight_decay),
    )
    return tx, schedule


# ----------------------------------------------------------------------------------------------
# Masked statistics


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


# ----------------------------------------------------------------------------------------------
# KL, rewards, advantages


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


def token_rewards(scores: Array, kl: Array, mask: Array, kl_coef) -> Array:
    """r_t = -kl_coef * kl_t on valid tokens, plus scores[b] at the last valid token. [B, T]."""
    chex.assert_equal_shape([kl, mask])
    m = mask.astype(jnp.float32)
    rewards = -jnp.asarray(kl_coef, jnp.float32) * kl.astype(jnp.float32) * m
    last = last_valid_index(mask)
    at_last = jax.nn.one_hot(last, mask.shape[-1], dtype=jnp.float32) * m
    return rewards + scores.astype(jnp.float32)[:, None] * at_last


def compute_gae(rewards: Array, values: Array, mask: Array, gamma: float,
                lam: float) -> tuple[Array, Array]:
    """Generalised advantage estimation over the response tokens, as a reverse lax.scan.

    rewards, values, mask: [B, T]; returns (advantages, returns), both [B, T] float32.
      delta_t = r_t + gamma * V_next - V_t
      A_t     = delta_t + gamma * lam * A_next
    where (V_next, A_next) belong to the next *valid* token (0 after the last one): a masked
    position carries them through unchanged and gets A = 0, return = 0.
    returns_t = A_t + V_t on valid tokens.
    """
    chex.assert_equal_shape([rewards, values, mask])
    r = rewards.astype(jnp.float32)
    v = values.astype(jnp.float32)
    m = mask.astype(jnp.float32)

    def step(carry, xs):
        next_value, next_adv = carry
        r_t, v_t, m_t = xs
        delta = r_t + gamma * next_value - v_t
        adv = delta + gamma * lam * next_adv
        carry = (m_t * v_t + (1.0 - m_t) * next_value, m_t * adv + (1.0 - m_t) * next_adv)
        return carry, adv * m_t

    zeros = jnp.zeros(r.shape[0], jnp.float32)
    _, adv = jax.lax.scan(step, (zeros, zeros), (r.T, v.T, m.T), reverse=True)
    adv = adv.T
    return adv, (adv + v) * m


# ----------------------------------------------------------------------------------------------
# Losses


def policy_loss(logprobs: Array, old_logprobs: Array, advantages: Array, mask: Array,
                clip_eps: float = 0.2, clip_eps_high: Optional[float] = None,
                denom: Optional[Array] = None) -> tuple[Array, dict]:
    """Clipped surrogate, averaged over valid tokens (sum / denom, default the token count).

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
    loss = jnp.sum(jnp.maximum(unclipped, clipped) * m) / denom
    stats = {
        "clip_frac": jnp.sum((clipped > unclipped).astype(jnp.float32) * m) / denom,
        "approx_kl": jnp.sum((ratio - 1.0 - log_ratio) * m) / denom,
        "ratio": jnp.sum(ratio * m) / denom,
    }
    return loss, stats


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


# ----------------------------------------------------------------------------------------------
# KL controller


def adaptive_kl_update(coef: Array, current_kl: Array, n_steps, target: float,
                       horizon: float) -> Array:
    """Ziegler et al. (2019): e = clip(KL / target - 1, -0.2, 0.2); beta *= 1 + e * n / horizon.

    current_kl is the batch mean of the per-sequence summed KL; n_steps the number of
    sequences in the batch. A non-finite KL leaves beta unchanged.
    """
    err = jnp.clip(current_kl / target - 1.0, -0.2, 0.2)
    new = coef * (1.0 + err * n_steps / horizon)
    return jnp.where(jnp.isfinite(new), new, coef).astype(jnp.float32)


def update_kl_state(cfg, kl: state_lib.KLState, current_kl: Array, n_steps) -> state_lib.KLState:
    if not cfg.adaptive_kl:
        return kl
    return state_lib.KLState(coef=adaptive_kl_update(kl.coef, current_kl, n_steps,
                                                     cfg.kl_target, cfg.kl_horizon))


# ----------------------------------------------------------------------------------------------
# The optimisation loop shared by PPO and GRPO


def _tree_where(ok, new, old):
    return jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)


def run_epochs(loss_fn: Callable, tx: optax.GradientTransformation, schedule: optax.Schedule,
               state: state_lib.TrainState, rows: Any, *, epochs: int, num_minibatches: int,
               grad_accum_steps: int, key: Array, micro_batch: int = 0):
    """epochs x shuffled minibatches (x gradient-accumulation micro-batches) as lax.scan.

    micro_batch > 0 fixes the rows per micro-batch (grad_accum_steps is then minibatch rows /
    micro_batch); otherwise each minibatch is split into grad_accum_steps micro-batches. Only
    one micro-batch's activations are live at a time.

    rows: pytree whose leaves are [B, ...] (one row per sequence), must contain "mask" [B, T].
    loss_fn(params, ref_params, micro_rows, denom) -> (loss, metrics dict), where every term is
    a *sum* over the micro-batch divided by denom = {"tokens": valid tokens in the minibatch,
    "rows": rows in the minibatch}; so summing micro-batch gradients gives exactly the
    minibatch-mean gradient.

    Each optimizer step is guarded: a non-finite loss or gradient norm keeps params and
    optimizer state, and bumps state.nonfinite_skips. Returns (state, metrics averaged over
    the steps).
    """
    b = jax.tree.leaves(rows)[0].shape[0]
    grad_accum_steps, micro = common.OptimConfig(
        num_minibatches=num_minibatches, grad_accum_steps=1 if micro_batch else grad_accum_steps,
        micro_batch=micro_batch).accumulation(b)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def minibatch_step(carry, mb):
        params, opt_state, step, skips = carry
        denom = {"tokens": jnp.maximum(jnp.sum(mb["mask"].astype(jnp.float32)), 1.0),
                 "rows": jnp.float32(micro * grad_accum_steps)}

        def micro_step(acc, micro_rows):
            (loss, metrics), grads = grad_fn(params, state.ref_params, micro_rows, denom)
            acc = jax.tree.map(jnp.add, acc, (grads, loss, metrics))
            return acc, None

        zero_metrics = jax.eval_shape(lambda: loss_fn(params, state.ref_params,
                                                       jax.tree.map(lambda x: x[0], mb),
                                                       denom)[1])
        init = (jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32),
                jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zero_metrics))
        (grads, loss, metrics), _ = jax.lax.scan(micro_step, init, mb)
        grad_norm = optax.tree.norm(grads)
        ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, new_opt_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        lr = schedule(step)
        params = _tree_where(ok, new_params, params)
        opt_state = _tree_where(ok, new_opt_state, opt_state)
        metrics = dict(metrics, loss=loss, grad_norm=grad_norm, learning_rate=lr,
                       skipped=(~ok).astype(jnp.float32))
        carry = (params, opt_state, step + ok.astype(jnp.int32), skips + (~ok).astype(jnp.int32))
        return carry, metrics

    def epoch(carry, epoch_key):
        perm = jax.random.permutation(epoch_key, b)
        shuffled = jax.tree.map(
            lambda x: x[perm].reshape((num_minibatches, grad_accum_steps, micro) + x.shape[1:]),
            rows)
        return jax.lax.scan(minibatch_step, carry, shuffled)

    keys = jax.random.split(key, epochs)
    carry = (state.params, state.opt_state, state.step, state.nonfinite_skips)
    (params, opt_state, step, skips), metrics = jax.lax.scan(epoch, carry, keys)
    # Averages over the steps that were applied (all steps when none applied).
    ok = 1.0 - metrics["skipped"]
    w = jnp.where(jnp.sum(ok) > 0, ok, jnp.ones_like(ok))
    mean = {k: jnp.sum(jnp.where(w > 0, v, 0.0) * w) / jnp.sum(w) for k, v in metrics.items()
            if k != "skipped"}
    mean["skipped_steps"] = jnp.sum(metrics["skipped"])
    state = state.replace(params=params, opt_state=opt_state, step=step, nonfinite_skips=skips)
    return state, mean


class CompiledUpdate:
    """A jitted `update(state, batch, grammar=None) -> (state, metrics)` that counts its
    traces. `grammar` (default: the one given at construction) is a traced argument: its FSM
    tables are never baked into the program as constants."""

    def __init__(self, fn: Callable, donate: bool = False, grammar=None):
        self.trace_count = 0
        self.grammar = grammar

        def counted(*args):
            self.trace_count += 1
            return fn(*args)

        self._jitted = jax.jit(counted, donate_argnums=(0,) if donate else ())
        self.fn = fn

    def __call__(self, state, batch, grammar=None):
        """grammar: the rollout's `Grammar` when batch.fsm_states is set."""
        return self._jitted(state, batch, self.grammar if grammar is None else grammar)

    def lower(self, state, batch, grammar=None):
        return self._jitted.lower(state, batch, self.grammar if grammar is None else grammar)


# ----------------------------------------------------------------------------------------------
# PPO update


def rollout_advantages(cfg: PPOConfig, batch: Trajectory, kl_coef: Array,
                       reward_stats: state_lib.RunningStats):
    """Token rewards, GAE advantages and returns from a rollout batch (no gradients).

    Returns (advantages [B, R], returns [B, R], rewards [B, R], kl [B, R], new reward_stats).
    """
    mask = batch.response_mask
    scores = batch.scores.astype(jnp.float32)
    if cfg.missing_stop_penalty and cfg.stop_token_ids:
        stopped = has_stop_token(batch.response_tokens, mask, cfg.stop_token_ids)
        scores = scores - jnp.where(stopped, 0.0, cfg.missing_stop_penalty)
    if cfg.reward_norm == "running":
        reward_stats = state_lib.update_running_stats(reward_stats, scores)
        scores = scores * jax.lax.rsqrt(reward_stats.var + 1e-8)
    if cfg.reward_clip is not None:
        scores = jnp.clip(scores, -cfg.reward_clip, cfg.reward_clip)
    kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, cfg.kl_estimator) * mask
    rewards = token_rewards(scores, kl, mask, kl_coef)
    if cfg.whiten_rewards:
        rewards = masked_whiten(rewards, mask, shift_mean=False)
    values = batch.values * mask
    adv, returns = compute_gae(rewards, values, mask, cfg.gamma, cfg.lam)
    if cfg.whiten_advantages:
        adv = masked_whiten(adv, mask)
    return adv, returns, rewards, kl, reward_stats


def make_update(cfg: PPOConfig, pdef, donate: bool = False, grammar=None) -> CompiledUpdate:
    """Build the jitted PPO update for the policy described by `pdef` (policy.PolicyDef).

    update(state: TrainState, batch: Trajectory, grammar=None) -> (state, metrics); grammar is
    the rollout's `Grammar` when batch.fsm_states is set (default: `grammar`, bound here as a
    default *argument*). metrics is a dict
    of float32 scalars: policy_loss, value_loss, loss, entropy, approx_kl, clip_frac,
    vf_clip_frac, value_error, explained_variance, kl_ref (mean per-sequence k1 to the
    reference), kl_coef, score_mean, reward_mean (token rewards summed per sequence),
    grad_norm, learning_rate, skipped_steps, nonfinite_skips.
    """
    from jaxsocial.rl import policy as policy_lib

    if pdef.value_mode == "none":
        raise ValueError("PPO needs a critic: build the policy with value_mode='head' or "
                         "'critic' (GRPO is the critic-free variant)")
    tx, schedule = make_optimizer(cfg)

    def loss_fn(params, ref_params, rows, denom, grammar):
        out = policy_lib.evaluate(pdef, params, ref_params, rows["batch"], cfg,
                                  with_values=True, with_entropy=True,
                                  entropy_grad=cfg.ent_coef != 0, grammar=grammar)
        mask = rows["mask"]
        pg, pg_stats = policy_loss(out.logprobs, rows["batch"].old_logprobs, rows["adv"], mask,
                                   cfg.clip_eps, cfg.clip_eps_high, denom["tokens"])
        vl, v_stats = value_loss(out.values, rows["batch"].values, rows["returns"], mask,
                                 cfg.value_clip, denom["tokens"])
        ent = masked_sum(out.entropy, mask) / denom["tokens"]
        loss = pg + cfg.vf_coef * vl - cfg.ent_coef * ent
        return loss, dict(pg_stats, **v_stats, policy_loss=pg, value_loss=vl, entropy=ent)

    def update(train_state: state_lib.TrainState, batch: Trajectory, grammar=None):
        check_trajectory(batch)
        mask = batch.response_mask
        adv, returns, rewards, kl, reward_stats = rollout_advantages(
            cfg, batch, train_state.kl.coef, train_state.reward_stats)
        rng, key = jax.random.split(train_state.rng)
        rows = {"batch": batch, "adv": adv, "returns": returns, "mask": mask}
        new_state, metrics = run_epochs(
            lambda *a: loss_fn(*a, grammar), tx, schedule, train_state, rows,
            epochs=cfg.ppo_epochs, num_minibatches=cfg.num_minibatches,
            grad_accum_steps=cfg.grad_accum_steps, micro_batch=cfg.micro_batch, key=key)
        kl_seq = jnp.mean(jnp.sum(kl_penalty(batch.old_logprobs, batch.ref_logprobs, "k1")
                                  * mask, axis=-1))
        kl_state = update_kl_state(cfg, train_state.kl, kl_seq, batch.batch_size)
        metrics.update(
            kl_ref=kl_seq, kl_coef=train_state.kl.coef,
            score_mean=jnp.mean(batch.scores),
            reward_mean=jnp.mean(jnp.sum(rewards, axis=-1)),
            explained_variance=explained_variance(batch.values, returns, mask),
            nonfinite_skips=new_state.nonfinite_skips.astype(jnp.float32),
        )
        new_state = new_state.replace(rng=rng, kl=kl_state, reward_stats=reward_stats)
        return new_state, metrics

    return CompiledUpdate(update, donate=donate, grammar=grammar)


def init_train_state(cfg, pdef, params, ref_params, key) -> state_lib.TrainState:
    """TrainState with the optimizer of `cfg` (PPOConfig or GRPOConfig)."""
    tx, _ = make_optimizer(cfg)
    return state_lib.create_train_state(params, ref_params, tx, key, cfg.initial_kl_coef)
