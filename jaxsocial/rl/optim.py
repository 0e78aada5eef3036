"""The optimisation engine PPO and GRPO run on: the optimizer and its learning-rate
schedule (its shape in the optimizer, its peak in the train state), the epochs x shuffled
minibatches x accumulated micro-batches scan with its NaN/inf guard, the compiled-update
wrapper, and a fresh TrainState.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from jaxsocial.rl import config as rl_config
from jaxsocial.rl import state as state_lib

Array = jax.Array


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
    """optax.chain(clip_by_global_norm(max_grad_norm), adamw(shape)) and the shape: the
    schedule at peak 1 (`make_schedule` with learning_rate=1). `run_epochs` multiplies each
    update by the train state's `learning_rate` (`cfg.learning_rate` at `init_train_state`), so
    the peak is an input of the compiled update, not a constant in it."""
    schedule = make_schedule(dataclasses.replace(cfg, learning_rate=1.0))
    tx = optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.adamw(schedule, b1=cfg.adam_b1, b2=cfg.adam_b2, eps=cfg.adam_eps,
                    weight_decay=cfg.weight_decay),
    )
    return tx, schedule


def _tree_where(ok, new, old):
    return jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)


def run_epochs(loss_fn: Callable, tx: optax.GradientTransformation, schedule: optax.Schedule,
               state: state_lib.TrainState, rows: Any, *, epochs: int, num_minibatches: int,
               grad_accum_steps: int, key: Array, micro_batch: int = 0, group: int = 0):
    """epochs x shuffled minibatches (x gradient-accumulation micro-batches) as lax.scan.

    micro_batch > 0 fixes the rows per micro-batch (grad_accum_steps is then minibatch rows /
    micro_batch); otherwise each minibatch is split into grad_accum_steps micro-batches. Only
    one micro-batch's activations are live at a time.

    rows: pytree whose leaves are [B, ...] (one row per sequence), must contain "mask" [B, T].
    loss_fn(params, ref_params, micro_rows, denom) -> (loss, metrics dict), where every term is
    a *sum* over the micro-batch divided by denom = {"tokens": valid tokens in the minibatch,
    "rows": rows in the minibatch}; so summing micro-batch gradients gives exactly the
    minibatch-mean gradient.

    group > 1 (`prompt_group`: contiguous groups of rows that share a prompt): when it
    divides the micro-batch, whole groups are shuffled (rows of a group stay contiguous, so
    the policy forward can share the group's prompt); otherwise rows are shuffled.

    The step's learning rate is `schedule(step) * state.learning_rate` (`make_optimizer`: tx and
    schedule at peak 1, the peak in the state). Each optimizer step is guarded: a non-finite
    loss or gradient norm keeps params and optimizer state, and bumps state.nonfinite_skips.
    Returns (state, metrics averaged over the steps).
    """
    b = jax.tree.leaves(rows)[0].shape[0]
    grad_accum_steps, micro = rl_config.OptimConfig(
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
        updates = jax.tree.map(lambda u: state.learning_rate.astype(u.dtype) * u, updates)
        new_params = optax.apply_updates(params, updates)
        lr = schedule(step) * state.learning_rate
        params = _tree_where(ok, new_params, params)
        opt_state = _tree_where(ok, new_opt_state, opt_state)
        metrics = dict(metrics, loss=loss, grad_norm=grad_norm, learning_rate=lr,
                       skipped=(~ok).astype(jnp.float32))
        carry = (params, opt_state, step + ok.astype(jnp.int32), skips + (~ok).astype(jnp.int32))
        return carry, metrics

    whole_groups = group > 1 and micro % group == 0

    def epoch(carry, epoch_key):
        if whole_groups:
            gperm = jax.random.permutation(epoch_key, b // group)
            perm = (gperm[:, None] * group + jnp.arange(group)[None, :]).reshape(b)
        else:
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


def init_train_state(cfg, pdef, params, ref_params, key) -> state_lib.TrainState:
    """TrainState with the optimizer of `cfg` (PPOConfig or GRPOConfig)."""
    tx, _ = make_optimizer(cfg)
    return state_lib.create_train_state(params, ref_params, tx, key, cfg.initial_kl_coef,
                                        cfg.learning_rate)
