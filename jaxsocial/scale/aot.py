"""Ahead-of-time proof of memory: compile an epoch's programs for an abstract model.

    run = aot.abstract_run(config, mesh)      # a train.run.Run of ShapeDtypeStruct weights
    report = aot.compile_epoch(run)           # lower + compile rollout, scoring, update
    print(aot.format_report(report))

No weight is materialised: the policy, reference and Adam state are `jax.ShapeDtypeStruct`s
(from `jax.eval_shape` of their initialisers) carrying the shardings the loop would give them,
so an 8B model's programs compile on a laptop against a fake mesh of CPU devices
(`XLA_FLAGS=--xla_force_host_platform_device_count=N`, set before jax is imported). For each
program XLA's `compiled.memory_analysis()` gives the bytes *per device* of its arguments,
outputs, temporaries and the outputs aliased to donated arguments; `total = argument + output
+ temp - alias`. Buffers alive during a program that are not its arguments (the optimizer
state during the rollout, the rollout and the new society during the update) are added as
`other` from their shardings, so `peak = total + other` is the epoch's per-device high-water
mark as the loop (`Run.run_epoch`) holds its buffers.

Caveat: this is XLA's CPU backend. The SPMD partitioning, buffer sizes and argument/output
accounting are the target's; the temporaries depend on the backend's fusion and scheduling
decisions (GPU/TPU fuse more, so CPU temporaries are usually an upper bound; CPU also widens
some bf16 arithmetic to f32). The CPU's default concurrency-optimised scheduler also issues
independent work (e.g. every layer's weight all-gathers) as early as it can, far from what a
memory-bounded TPU/GPU schedule keeps live: `benchmarks/aot_memory.py` compiles with
`--xla_cpu_enable_concurrency_optimized_scheduler=false` unless told otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxsocial.models import llama, loading
from jaxsocial.rl import buffer as buffer_lib
from jaxsocial.rl import optim
from jaxsocial.rl import policy as policy_lib
from jaxsocial.rl import ppo as ppo_lib
from jaxsocial.train import config as run_config
from jaxsocial.train import run as run_lib
from jaxsocial.train import setup as setup_lib
from jaxsocial.train import sharding
from jaxsocial.train.setup import RunState

GiB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
    """Per-device bytes of one compiled program (XLA's memory_analysis) + live non-arguments."""

    name: str
    argument: int
    output: int
    temp: int
    alias: int
    other: int        # buffers alive during the program that are not its arguments
    compile_s: float

    @property
    def total(self) -> int:
        return self.argument + self.output + self.temp - self.alias

    @property
    def peak(self) -> int:
        return self.total + self.other


def per_device_bytes(tree: Any) -> int:
    """Bytes one device holds of a pytree of sharded ShapeDtypeStructs / arrays (the largest
    shard; unsharded leaves count whole)."""
    total = 0
    for x in jax.tree.leaves(tree):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            continue
        shape = tuple(x.shape)
        sh = getattr(x, "sharding", None)
        if sh is not None:
            shape = tuple(sh.shard_shape(shape))
        total += math.prod(shape) * _itemsize(x.dtype)
    return total


def _itemsize(dtype) -> int:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return 8  # threefry key data: 2 x uint32
    return np.dtype(dtype).itemsize


def _abstract(x, s):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)


def _with_shardings(tree, shardings):
    return jax.tree.map(_abstract, tree, shardings)


def abstract_run(config, mesh=None, model_overrides: Optional[Dict[str, Any]] = None,
                 checked: bool = False) -> run_lib.Run:
    """`train.run.abstract_run`: the run of `config` with ShapeDtypeStruct weights and text
    (no checkpoint is read and no weight allocated; the tokenizer is config.tokenizer or the
    tiny one). model_overrides: LlamaConfig fields replacing the preset's (e.g. fewer
    layers); checked: the caller has run `checks.check`."""
    model_config = None
    if model_overrides:
        args = dict(run_config.model_args(config), path_or_preset=config.model.preset)
        model_config = loading.load_config(**args).replace(**model_overrides)
    return run_lib.abstract_run(config, mesh, model_config=model_config, checked=checked)


def abstract_state(run: run_lib.Run) -> RunState:
    """The RunState `run.init_state()` would build, as ShapeDtypeStructs with the run's
    shardings."""
    return setup_lib.abstract_state(run.setup, run.weights, run.text)


def _compile(name, fn, args, other, **kwargs) -> tuple:
    t0 = time.perf_counter()
    compiled = fn.lower(*args, **kwargs).compile()
    dt = time.perf_counter() - t0
    ma = compiled.memory_analysis()
    mem = ProgramMemory(name=name, argument=int(ma.argument_size_in_bytes),
                        output=int(ma.output_size_in_bytes), temp=int(ma.temp_size_in_bytes),
                        alias=int(ma.alias_size_in_bytes), other=int(other), compile_s=dt)
    out = jax.eval_shape(functools.partial(fn, **kwargs), *args)
    out = _with_shardings(out, compiled.output_shardings)
    return mem, out


def compile_epoch(run: run_lib.Run, state: Optional[RunState] = None,
                  programs=("rollout", "score", "update")) -> List[ProgramMemory]:
    """Lower and compile the epoch's programs as `run.run_epoch` calls them, on abstract
    arguments; returns one ProgramMemory per program (per-device bytes). programs: any of
    rollout / score / update (the three-program path), or "epoch": the one-program epoch
    (`Run.epoch`, state donated: its outputs alias the state's buffers)."""
    state = abstract_state(run) if state is None else state
    rep = sharding.replicated(run.mesh)
    # The frozen inputs as abstract values on the run's mesh: the set-up's grammar is a host
    # array, which a target's devices (another platform, other memory kinds) do not hold.
    grammar = _with_shardings(run.setup.grammar, jax.tree.map(lambda _: rep,
                                                                run.setup.grammar))
    encoder = jax.tree.map(lambda x: _abstract(x, getattr(x, "sharding", None) or rep),
                           run.encoder)
    if "epoch" in programs:
        mem, _ = _compile("epoch", run.epoch, (state, grammar, encoder), 0)
        return [mem]
    key = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype, sharding=rep)
    train = state.train
    res = []
    # Rollout: the rest of the run state (optimizer, society copy) stays alive.
    args = (train.params, train.ref_params, state.society, key)
    other = per_device_bytes(train) - per_device_bytes((train.params, train.ref_params))
    mem, (soc, ro) = _compile("rollout", run.rollout.jitted, args, other, grammar=grammar,
                              encoder=encoder)
    res.append(mem)
    if "score" not in programs and "update" not in programs:
        return res
    bonus = jax.ShapeDtypeStruct(ro.created_id.shape, jnp.float32, sharding=rep)
    # Scoring: the old society (held by the caller's state) and the new one stay alive.
    mem, (batch, score, eng, gap) = _compile(
        "score", run.score.jitted, (train, ro, bonus),
        per_device_bytes((state.society, soc)), grammar=grammar)
    res.append(mem)
    if "update" not in programs:
        return res
    batch = _with_shardings(batch, sharding.tree_data_shardings(batch, run.mesh))
    # Update: the rollout, both societies and the scores stay alive in run_epoch.
    mem, _ = _compile("update", run.setup.update, (train, batch),
                      per_device_bytes((state.society, soc, ro, score, eng, gap)),
                      grammar=grammar)
    res.append(mem)
    return res


def program_memory(name: str, fn, args, other: int = 0):
    """Lower + compile `fn(*args)` (a jitted function, ShapeDtypeStruct args with shardings)
    -> (ProgramMemory, abstract outputs with their compiled shardings)."""
    return _compile(name, fn, args, other)


def abstract_update(model_config: llama.LlamaConfig, rl_config, mesh, *, rows: int,
                    prompt_len: int, response_len: int, lora=None, donate: bool = False):
    """The PPO update alone, for an abstract policy of `model_config` on `mesh`:
    -> (update fn, (train state, batch) as sharded ShapeDtypeStructs). No grammar; the batch
    along the data axes, the weights by the logical-axis rules (as the loop places them)."""

    box = {}

    def init(key):
        model = llama.Llama(model_config, rngs=nnx.Rngs(0))
        pdef, params, ref = policy_lib.init_policy(model, key, lora=lora)
        box["pdef"] = pdef
        return optim.init_train_state(rl_config, pdef, params, ref, key)
    train = jax.eval_shape(init, jax.random.key(0))
    pdef = box["pdef"]
    _, model_state = nnx.split(nnx.eval_shape(lambda: llama.Llama(model_config,
                                                                   rngs=nnx.Rngs(0))))
    weight_sh = nnx.to_pure_dict(sharding.state_shardings(model_state, mesh))
    train = _with_shardings(train, sharding.train_state_shardings(
        train, weight_sh, mesh, optim.make_optimizer(rl_config)[0], lora=lora is not None))
    batch = jax.eval_shape(lambda: buffer_lib.make_trajectory(
        jnp.zeros((rows, prompt_len), jnp.int32), jnp.ones((rows, prompt_len), bool),
        jnp.zeros((rows, response_len), jnp.int32), jnp.ones((rows, response_len), bool),
        scores=jnp.zeros((rows,), jnp.float32)))
    batch = _with_shardings(batch, sharding.tree_data_shardings(batch, mesh))
    update = ppo_lib.make_update(rl_config, pdef, donate=donate)
    return update, (train, batch)


def format_report(progs: List[ProgramMemory], prefix: str = "") -> str:
    """One line per program: argument / output / temp / alias / total / other / peak GiB."""
    lines = []
    for p in progs:
        lines.append(f"{prefix}program={p.name} arg={p.argument / GiB:.3f} "
                     f"out={p.output / GiB:.3f} temp={p.temp / GiB:.3f} "
                     f"alias={p.alias / GiB:.3f} total={p.total / GiB:.3f} "
                     f"other={p.other / GiB:.3f} peak={p.peak / GiB:.3f} GiB "
                     f"compile_s={p.compile_s:.1f}")
    return "\n".join(lines)


def epoch_peak(progs: List[ProgramMemory]) -> int:
    """Per-device high-water mark of the epoch: the largest program peak."""
    return max(p.peak for p in progs)


def summary(progs: List[ProgramMemory]) -> Dict[str, Any]:
    return {p.name: dict(dataclasses.asdict(p), total=p.total, peak=p.peak) for p in progs}
