"""GRPO (Shao et al. 2024, DeepSeekMath): PPO without a critic.

Each prompt is sampled `group_size` times (the rows of a group are contiguous in the batch);
a row's advantage is its score normalised within its group,
    A_i = (r_i - mean(r_group)) / (std(r_group) + eps),
broadcast to every valid token of the response. The loss is the clipped surrogate plus an
optional beta * k3 KL(pi || pi_ref) term per token (beta = 0 by default).
"""
from __future__ import annotations

from typing import Optional

import chex
import jax
import jax.numpy as jnp

from jaxsocial.rl import losses, optim
from jaxsocial.rl import policy as policy_lib
from jaxsocial.rl import state as state_lib
from jaxsocial.rl.buffer import Trajectory, check_trajectory
from jaxsocial.rl.config import LOSS_AGGREGATIONS, GRPOConfig  # noqa: F401 (grpo.GRPOConfig)


def group_advantages(scores: jax.Array, group_size: int, eps: float = 1e-4,
                     scale: bool = True, ddof: int = 1) -> jax.Array:
    """scores [B] (B = groups x group_size, groups contiguous) -> advantages [B] float32.

    A = (r - group mean) / (group std + eps) (std with `ddof`); scale=False: A = r - mean.
    """
    scores = jnp.asarray(scores, jnp.float32)
    chex.assert_rank(scores, 1)
    b = scores.shape[0]
    if b % group_size:
        raise ValueError(f"batch size {b} is not a multiple of group_size {group_size}")
    g = scores.reshape(b // group_size, group_size)
    centred = g - jnp.mean(g, axis=1, keepdims=True)
    if scale:
        std = jnp.sqrt(jnp.sum(jnp.square(centred), axis=1, keepdims=True)
                       / (group_size - ddof))
        centred = centred / (std + eps)
    return centred.reshape(b)


def grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, cfg: GRPOConfig,
              denom: Optional[dict] = None):
    """Per-token clipped surrogate + kl_coef * KL(pi || ref), aggregated by cfg.

    logprobs, old_logprobs, ref_logprobs, mask: [B, T]; advantages [B] (one per sequence).
    token_mean: sum over valid tokens / denom["tokens"];
    seq_mean: sum_b (sum_t loss_bt / n_b) / denom["rows"].
    """
    m = mask.astype(jnp.float32)
    if denom is None:
        denom = {"tokens": jnp.maximum(jnp.sum(m), 1.0), "rows": jnp.float32(m.shape[0])}
    pg, surrogate_stats = losses.clipped_surrogate(logprobs, old_logprobs, advantages[:, None],
                                                   mask, cfg.clip_eps, cfg.clip_eps_high,
                                                   denom["tokens"])
    kl = losses.kl_penalty(logprobs, ref_logprobs, cfg.kl_estimator)
    per_token = pg + cfg.kl_coef * kl

    if cfg.loss_aggregation == "token_mean":
        def agg(x):
            return jnp.sum(x * m) / denom["tokens"]
    else:
        def agg(x):
            return jnp.sum(jnp.sum(x * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)) \
                / denom["rows"]
    loss = agg(per_token)
    return loss, dict(surrogate_stats, policy_loss=agg(pg), kl_loss=agg(kl))


def make_update(cfg: GRPOConfig, pdef, donate: bool = False,
                grammar=None) -> optim.CompiledUpdate:
    """The jitted GRPO update(state, batch, grammar=None) -> (state, metrics); batch rows in
    groups of cfg.group_size; grammar: the rollout's when batch.fsm_states is set. Metrics:
    loss, policy_loss, kl_loss, entropy, approx_kl, clip_frac, ratio, kl_ref, score_mean,
    score_std_in_group, adv_abs_mean, grad_norm, learning_rate, skipped_steps,
    nonfinite_skips."""
    tx, schedule = optim.make_optimizer(cfg)

    def loss_fn(params, ref_params, rows, denom, grammar):
        b = rows["batch"]
        out = policy_lib.evaluate(pdef, params, ref_params, b, cfg, with_values=False,
                                  with_entropy=True, entropy_grad=cfg.ent_coef != 0,
                                  grammar=grammar)
        loss, stats = grpo_loss(out.logprobs, b.old_logprobs, b.ref_logprobs, rows["adv"],
                                rows["mask"], cfg, denom)
        ent = losses.masked_sum(out.entropy, rows["mask"]) / denom["tokens"]
        loss = loss - cfg.ent_coef * ent
        return loss, dict(stats, entropy=ent)

    def update(train_state: state_lib.TrainState, batch: Trajectory, grammar=None):
        check_trajectory(batch)
        mask = batch.response_mask
        scores = losses.stop_penalized(batch.scores, batch.response_tokens, mask,
                                       cfg.stop_token_ids, cfg.missing_stop_penalty)
        adv = group_advantages(scores, cfg.group_size, cfg.std_eps, cfg.scale_rewards,
                               cfg.std_ddof)
        next_key, key = jax.random.split(train_state.key)
        rows = {"batch": batch, "adv": adv, "mask": mask}
        new_state, metrics = optim.run_epochs(
            lambda *a: loss_fn(*a, grammar), tx, schedule, train_state, rows,
            epochs=cfg.ppo_epochs, num_minibatches=cfg.num_minibatches,
            grad_accum_steps=cfg.grad_accum_steps, micro_batch=cfg.micro_batch, key=key,
            group=cfg.prompt_group)
        g = scores.reshape(-1, cfg.group_size)
        if policy_lib.uses_reference(cfg):  # else no reference forward ran: nothing to report
            metrics["kl_ref"] = losses.sequence_kl(batch.old_logprobs, batch.ref_logprobs, mask)
        metrics.update(
            kl_coef=train_state.kl.coef,
            score_mean=jnp.mean(batch.scores),
            score_std_in_group=jnp.mean(jnp.std(g, axis=1)),
            adv_abs_mean=jnp.mean(jnp.abs(adv)),
            nonfinite_skips=new_state.nonfinite_skips.astype(jnp.float32),
        )
        return new_state.replace(key=next_key), metrics

    return optim.CompiledUpdate(update, donate=donate, grammar=grammar)
