"""One mesh (data, fsdp, tensor) and the shardings built from the logical-axis rules (one table,
`jaxsocial.models.partitioning.LOGICAL_AXIS_RULES`, re-exported here).

The same compiled step runs on 1 CPU device, on 8 fake CPU devices in tests, and on a
multi-host TPU pod / GPU cluster: jit with NamedShardings over this mesh (JAX's own SPMD).

Logical names are the ones the Llama parameters carry (`sharding_names`), plus names for
data: `batch` (prompts / trajectories) and `agents` (society rows). A dimension whose size is not
divisible by its mesh axes is replicated instead (tiny test models on 8 devices).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Dict, Optional, Sequence, Tuple

import jax
import numpy as np
import optax
from absl import logging
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxsocial.models.partitioning import (  # noqa: F401 (re-exported: the rules live there)
    AXES,
    LOGICAL_AXIS_RULES,
    _variable_names,
    adapter_specs,
    constrain_rows,
    gather_in_place,
    logical_to_spec,
    row_axes,
)
from jaxsocial.train import peers


def resolve_mesh_shape(shape: Sequence[int], num_devices: int) -> Tuple[int, ...]:
    """(data, fsdp, tensor) with at most one -1 ("the rest") -> concrete sizes."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != len(AXES):
        raise ValueError(f"mesh shape {shape} must have {len(AXES)} entries {AXES}")
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"mesh shape {shape}: use positive sizes and at most one -1")
    known = math.prod(s for s in shape if s != -1)
    if num_devices % known:
        raise ValueError(f"mesh shape {shape} does not divide the {num_devices} devices")
    shape = tuple(num_devices // known if s == -1 else s for s in shape)
    if math.prod(shape) != num_devices:
        raise ValueError(f"mesh shape {shape} uses {math.prod(shape)} devices, "
                         f"but {num_devices} are available")
    return shape


def make_mesh(shape: Sequence[int] = (-1, 1, 1), devices: Optional[Sequence[Any]] = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all devices of all processes).

    Axis types are Auto on purpose: the compiler propagates shardings from the annotated
    inputs/outputs; we do not use explicit-sharding mode.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = resolve_mesh_shape(shape, len(devices))
    if devices == list(jax.devices()):
        return jax.make_mesh(sizes, AXES, axis_types=(AxisType.Auto,) * len(AXES))
    return Mesh(np.asarray(devices).reshape(sizes), AXES,
                axis_types=(AxisType.Auto,) * len(AXES))


def state_shardings(state: Any, mesh: Mesh, rules: Dict[str, Any] = LOGICAL_AXIS_RULES) -> Any:
    """NamedShardings for an nnx.State (parameters, or optimizer state mirroring them).

    Variables without logical names (counters, scalars) are replicated.
    """
    def one(leaf):
        if isinstance(leaf, nnx.Variable):
            shape = jax.tree.leaves(leaf)[0].shape  # works for arrays and abstract values
            spec = logical_to_spec(_variable_names(leaf), shape, mesh, rules)
            return leaf.replace(NamedSharding(mesh, spec))
        return NamedSharding(mesh, P())
    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def train_state_shardings(train: Any, weight_shardings: Dict[str, Any], mesh: Mesh,
                          tx: Any, lora: bool = False) -> Any:
    """Shardings of an RL TrainState, read off its structure, not guessed from key sets:
    the reference (and the policy's weights, unless `lora`: then the policy holds adapters,
    sharded like the kernels they adapt, `adapter_shardings`) and a critic trunk get
    `weight_shardings` (the model's NNX metadata through
    `state_shardings`, as a pure dict); the value head is replicated; the optimizer state's
    parameter-shaped leaves get their parameter's sharding through `optax.tree_map_params(tx,
    ...)`, its counters are replicated; scalars and keys are replicated."""
    rep = replicated(mesh)
    reps = lambda t: jax.tree.map(lambda _: rep, t)  # noqa: E731
    weights = lambda t: jax.tree.map(lambda s, _: s, weight_shardings, t)  # noqa: E731
    value = train.params.get("value")
    params = {"policy": (adapter_shardings(train.params["policy"], weight_shardings) if lora
                         else weights(train.params["policy"])),
              "value": None if value is None else {
                  k: weights(v) if k == "trunk" else reps(v) for k, v in value.items()}}
    opt = optax.tree_map_params(tx, lambda _, s: s, train.opt_state, params,
                                transform_non_params=lambda _: rep)
    return train.replace(params=params, ref_params=weights(train.ref_params), opt_state=opt,
                         **{f.name: reps(getattr(train, f.name)) for f in dataclasses.fields(train)
                            if f.name not in ("params", "ref_params", "opt_state")
                            and f.metadata.get("pytree_node", True)})


def adapter_shardings(adapters: Any, weight_shardings: Dict[str, Any]) -> Any:
    """LoRA adapters ({"a" [..., in, r], "b" [..., r, out]} at each adapted kernel's path)
    sharded along their long axis: A's `in` and B's `out` as W [in, out] shards that axis, or
    along fsdp where W leaves it whole (e.g. the MLP's axis with no tensor parallelism) and fsdp
    divides it; the rank and any leading axes (the cohorts' [K]) replicated. Replicated adapters
    and their Adam moments would cost every device the whole of them: 0.5 GiB per cohort for
    Llama-3-8B at rank 16."""
    def walk(ad, ws):
        out = {}
        for k, v in ad.items():
            w = ws[k]
            if isinstance(w, NamedSharding):
                sa, sb = adapter_specs(w.spec, v["a"].shape, v["b"].shape, w.mesh)
                out[k] = {"a": NamedSharding(w.mesh, sa), "b": NamedSharding(w.mesh, sb)}
            else:
                out[k] = walk(v, w)
        return out
    return walk(adapters, weight_shardings)


def data_sharding(mesh: Mesh, ndim: int, logical: str = "batch",
                  size: Optional[int] = None) -> NamedSharding:
    """Shard the leading dimension of an [B, ...] array along the data axes (with `size` = B:
    the largest sub-product of them that divides B, `row_axes`)."""
    axes = row_axes(mesh, logical, size)
    lead = None if not axes else (axes[0] if len(axes) == 1 else axes)
    return NamedSharding(mesh, P(lead, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def tree_data_shardings(tree: Any, mesh: Mesh, logical: str = "batch") -> Any:
    """Data-parallel shardings for every array leaf: its leading dim split along the largest
    sub-product of the data axes that divides it (`row_axes`); scalars and dims no data axis
    divides replicated."""
    def one(x):
        shape = np.shape(x)
        if not shape or not row_axes(mesh, logical, shape[0]):
            return replicated(mesh)
        return data_sharding(mesh, len(shape), logical, shape[0])
    return jax.tree.map(one, tree)


def society_shardings(soc: Any, mesh: Mesh) -> Any:
    """Shardings of a SocialState: when the mesh's data axis is > 1, every per-user array
    (users, follow graph, mutes, reaction and seen records: leading dim N) is split along the
    `agents` rule where its axes divide N; posts, the agents' inbox, the clock and the text
    banks stay replicated (every user's feed reads any post)."""
    rep = replicated(mesh)
    if mesh.shape["data"] <= 1:
        return jax.tree.map(lambda _: rep, soc)
    per_user = lambda t: tree_data_shardings(t, mesh, "agents")  # noqa: E731
    out = jax.tree.map(lambda _: rep, soc)
    return out.replace(users=per_user(soc.users), graph=per_user(soc.graph),
                       memory=per_user(soc.memory))


def maybe_initialize_distributed(enabled: Optional[bool] = None, **kwargs) -> bool:
    """Call `jax.distributed.initialize()` when asked or when the environment says so.

    Asked: `enabled=True` (the config's `distributed.enabled`; kwargs such as
    coordinator_address, num_processes, process_id, local_device_ids are passed through, None
    or empty values left to JAX's auto-detection on TPU pods / SLURM / Open MPI).
    Environment: a coordinator address in JAX_COORDINATOR_ADDRESS.
    Unless given, the heartbeat timeout is `peers.heartbeat_timeout_s()` (30 s; JAX's own is
    100 s): a process whose heartbeats stop that long is declared dead and every other process
    stops (launch/train.py turns that into one `error:` line, `peers`).
    Returns whether JAX now runs multi-process.
    """
    if enabled is None:
        enabled = bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))
    if not enabled:
        return False
    if jax.distributed.is_initialized():
        return jax.process_count() > 1
    kwargs = {k: v for k, v in kwargs.items() if v not in (None, "", -1)}
    kwargs.setdefault("heartbeat_timeout_seconds", peers.heartbeat_timeout_s())
    jax.distributed.initialize(**kwargs)
    logging.info("jax.distributed: process %d of %d, %d local / %d global devices, heartbeat "
                 "timeout %d s", jax.process_index(), jax.process_count(),
                 jax.local_device_count(), jax.device_count(),
                 kwargs["heartbeat_timeout_seconds"])
    return jax.process_count() > 1


def to_host(tree: Any) -> Any:
    """Numpy copies of (possibly multi-process, sharded) arrays: every process gets the full
    global value (an all-gather across processes when needed)."""
    if jax.process_count() == 1:
        return jax.device_get(tree)

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(jax.device_get(x))
    return jax.tree.map(one, tree)


def put_global(tree: Any, shardings: Any) -> Any:
    """Place a tree on (possibly multi-process) shardings. Values must be identical on every
    process (same seed, same computation): each process fills its addressable shards."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)

    def one(x, s):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return jax.device_put(x, s)
        host = np.asarray(jax.device_get(x))
        return jax.make_array_from_callback(host.shape, s, lambda idx: host[idx])
    return jax.tree.map(one, tree, shardings)
