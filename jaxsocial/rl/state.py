"""TrainState for PPO / GRPO: one pytree of arrays, saveable with orbax.

Static things (the model's graphdef, the optimizer) are not in the state: they live in the
closure built by `ppo.make_update` / `grpo.make_update`, so every leaf here is an array and
the run's checkpointer (`train.checkpointing.Checkpointer`) saves and restores it whole.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class KLState:
    """KL-controller state: the current coefficient beta (float32 scalar)."""

    coef: jax.Array


@struct.dataclass
class RunningStats:
    """Running mean / variance of episode scores (parallel Welford), float32 scalars."""

    mean: jax.Array
    var: jax.Array
    count: jax.Array


def init_running_stats() -> RunningStats:
    return RunningStats(mean=jnp.zeros((), jnp.float32), var=jnp.ones((), jnp.float32),
                        count=jnp.zeros((), jnp.float32))


def update_running_stats(stats: RunningStats, x: jax.Array) -> RunningStats:
    """Merge a batch x [N] into the running stats (Chan et al. parallel variance).

    n = count + N; delta = mean_x - mean; mean' = mean + delta * N / n;
    var' = (var * count + var_x * N + delta^2 * count * N / n) / n  (population variance).
    A batch with a non-finite value is ignored (the stats would be corrupted for good).
    """
    x = jnp.asarray(x, jnp.float32).reshape(-1)
    n_b = jnp.float32(x.shape[0])
    mean_b = jnp.mean(x)
    var_b = jnp.var(x)
    n = stats.count + n_b
    delta = mean_b - stats.mean
    mean = stats.mean + delta * n_b / n
    var = (stats.var * stats.count + var_b * n_b + delta ** 2 * stats.count * n_b / n) / n
    new = RunningStats(mean=mean, var=var, count=n)
    ok = jnp.all(jnp.isfinite(x))
    return jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, stats)


@struct.dataclass
class TrainState:
    """Everything that changes during RL training.

    params          trainable tree {"policy": weights or LoRA adapters, "value": value head
                    {"kernel" [H], "bias" []} (+ "trunk": separate critic weights) or None}
    ref_params      frozen reference policy weights (the initial weights; with LoRA these are
                    also the frozen base the adapters sit on)
    opt_state       optax state of `optax.chain(clip_by_global_norm, adamw(schedule at peak 1))`
    kl              KLState (fixed or adaptive beta)
    reward_stats    RunningStats of episode scores (used when reward normalisation is on)
    step            int32: optimizer steps applied (skipped steps are not counted)
    key             uint32 [2] PRNG key (raw, so orbax saves it as a plain array)
    nonfinite_skips int32: optimizer steps skipped by the NaN/inf guard
    learning_rate   float32: the schedule's peak (`learning_rate` of the config), which scales
                    every update (`optim.run_epochs`). A value in the state, not a constant in
                    the program: runs that differ only in it (a study's frozen control at 0)
                    share one compiled program.
    """

    params: Any
    ref_params: Any
    opt_state: Any
    kl: KLState
    reward_stats: RunningStats
    step: jax.Array
    key: jax.Array
    nonfinite_skips: jax.Array
    learning_rate: jax.Array


def create_train_state(params, ref_params, tx, key, kl_coef: float,
                       learning_rate: float) -> TrainState:
    """A fresh TrainState: opt state from `tx.init(params)`, counters at zero.

    `key` is a raw uint32 [2] key (`jax.random.PRNGKey(seed)`); typed keys are converted.
    """
    if jnp.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return TrainState(
        params=params,
        ref_params=ref_params,
        opt_state=tx.init(params),
        kl=KLState(coef=jnp.asarray(kl_coef, jnp.float32)),
        reward_stats=init_running_stats(),
        step=jnp.zeros((), jnp.int32),
        key=jnp.asarray(key, jnp.uint32),
        nonfinite_skips=jnp.zeros((), jnp.int32),
        learning_rate=jnp.asarray(learning_rate, jnp.float32),
    )

