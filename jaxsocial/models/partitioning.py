"""Partitioning of the model's arrays: the logical-axis rules (one table for the whole project)
and the two in-jit hints the Llama layers give the compiler (`constrain_rows`,
`gather_in_place`). Mesh construction, placement and train-state shardings build on these in
`jaxsocial.train.sharding`, which re-exports them.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = ("data", "fsdp", "tensor")

# logical name -> mesh axis, tuple of mesh axes, or None (replicated).
LOGICAL_AXIS_RULES: Dict[str, Union[None, str, Tuple[str, ...]]] = {
    "vocab": "tensor",
    "embed": "fsdp",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "norm": None,
    "lora_rank": None,
    "batch": ("data", "fsdp"),
    "agents": ("data", "fsdp"),
    "seq": None,
}


def logical_to_spec(names: Optional[Sequence[Optional[str]]], shape: Sequence[int], mesh: Mesh,
                    rules: Dict[str, Any] = LOGICAL_AXIS_RULES) -> P:
    """Logical names of one array -> PartitionSpec, replicating non-divisible dimensions."""
    if not names:
        return P()
    if len(names) != len(shape):
        raise ValueError(f"logical names {tuple(names)} do not match shape {tuple(shape)}")
    used, out = set(), []
    for name, size in zip(names, shape):
        axes = rules.get(name) if name is not None else None
        if name is not None and name not in rules:
            raise ValueError(f"no sharding rule for logical axis {name!r}; "
                             f"known: {sorted(rules)}")
        axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
        axes = tuple(a for a in axes if a not in used and mesh.shape[a] > 1)
        if axes and size % math.prod(mesh.shape[a] for a in axes) == 0:
            used.update(axes)
            out.append(axes[0] if len(axes) == 1 else axes)
        else:
            out.append(None)
    return P(*out)


def _variable_names(var: nnx.Variable) -> Optional[Sequence[str]]:
    meta = var.get_metadata()
    return meta.get("out_sharding") or meta.get("sharding_names")


def row_axes(mesh: Union[Mesh, Mapping[str, int]], logical: str,
             size: Optional[int] = None) -> Tuple[str, ...]:
    """The mesh axes a leading (row) dim of `size` is split along: of the `logical` rule's axes
    (those > 1), the sub-tuple with the largest product that divides `size` (all of them when
    size is None). 96 rows on (data, fsdp) = (4, 16): 96 % 64 != 0, so `fsdp` (6 rows per
    device) rather than every device holding all 96. `mesh`: a Mesh, or its axis sizes."""
    sizes = mesh if isinstance(mesh, Mapping) else mesh.shape
    axes = LOGICAL_AXIS_RULES[logical]
    axes = tuple(a for a in ((axes,) if isinstance(axes, str) else axes) if sizes[a] > 1)
    if size is None:
        return axes
    best, best_n = (), 1
    for mask in range(1, 2 ** len(axes)):
        sub = tuple(a for j, a in enumerate(axes) if mask >> j & 1)
        n = math.prod(sizes[a] for a in sub)
        if size % n == 0 and n > best_n:
            best, best_n = sub, n
    return best


def _traced_mesh(x: Any):
    """The (data, fsdp, tensor) mesh a value traced under jit carries (from its inputs'
    shardings), or None (one device, no mesh)."""
    mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
    if mesh is None or mesh.empty or not set(AXES) <= set(mesh.axis_names):
        return None
    return mesh


def constrain_rows(x: Any, logical: str = "batch") -> Any:
    """Inside jit: keep an activation's leading (row) dim split along the data axes that divide
    it (`row_axes`), every other dim left to the compiler; a no-op without a mesh.

    Why: rows on (data, fsdp) and the weights' `embed` dim on fsdp meet in every projection;
    unconstrained, XLA may all-gather the rows (contracting over the fsdp-split hidden dim)
    instead of the layer's weights, so every device computes the whole batch (the v5e-64
    rollout: [96, 1472, 14336] float32 MLP activations on each chip, docs/scaling.md)."""
    mesh = _traced_mesh(x)
    axes = row_axes(mesh, logical, x.shape[0]) if mesh is not None and x.ndim else ()
    if not axes:
        return x
    spec = P(axes[0] if len(axes) == 1 else axes, *([P.UNCONSTRAINED] * (x.ndim - 1)))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def adapter_axis(spec_dim: Any, size: int, mesh: Mesh) -> Any:
    """The mesh axis of a LoRA adapter's long dim (A's `in`, B's `out`): W's own axis for that
    dim, or fsdp where W leaves it whole and fsdp divides it (None: replicated)."""
    if spec_dim is not None:
        return spec_dim
    f = int(dict(mesh.shape).get("fsdp", 1))
    return "fsdp" if f > 1 and size % f == 0 else None


def adapter_specs(w_spec: Any, a_shape: Tuple[int, ...], b_shape: Tuple[int, ...],
                  mesh: Mesh) -> Tuple[P, P]:
    """PartitionSpecs of adapters A [..., in, r] and B [..., r, out] of a kernel W [in, out]
    laid out as `w_spec` (its last two entries are W's in and out): the long dims by
    `adapter_axis`, the rank and the leading dims (layers, cohorts) replicated."""
    spec = (None, None) + tuple(w_spec)
    lead_a, lead_b = (None,) * (len(a_shape) - 2), (None,) * (len(b_shape) - 2)
    return (P(*lead_a, adapter_axis(spec[-2], a_shape[-2], mesh), None),
            P(*lead_b, None, adapter_axis(spec[-1], b_shape[-1], mesh)))


def gather_in_place(x: Any, kernels: Sequence[Any]) -> Tuple[Any, Tuple[Any, ...]]:
    """Inside jit, on a mesh: (x, the kernels' values) through one `optimization_barrier`,
    each kernel pinned to its own sharding (its logical names, `logical_to_spec`) on the way
    in, so its fsdp all-gather comes after the barrier: it depends on this layer's input and
    stays where the layer runs. Without it XLA hoists the loop-invariant gathers out of the
    rollout's tick loop and the scoring chunk loop: every layer's weights gathered at once,
    for each use (v5e-64: ~2.5 GiB per layer, docs/scaling.md). kernels: nnx Variables (or
    arrays, not pinned). A no-op without a mesh."""
    values = tuple(k[...] for k in kernels)
    mesh = _traced_mesh(x)
    if mesh is None:
        return x, values
    specs = [logical_to_spec(_variable_names(k), v.shape, mesh)
             if isinstance(k, nnx.Variable) and _variable_names(k) else None
             for k, v in zip(kernels, values)]

    def pin_one(v, s):
        if s is None:
            return v
        pin_to = lambda w, sp: jax.lax.with_sharding_constraint(w, NamedSharding(mesh, sp))  # noqa
        if hasattr(v, "map_base"):
            # an `adapters.Adapted` kernel: W and its adapters each on their own sharded layout
            # (`adapter_specs`, as the train state stores them), so the adapters' gathers too
            # come after the barrier; unpinned, XLA gathers every layer's adapters of every
            # cohort at once outside the loops
            sa, sb = adapter_specs(s, v.a.shape, v.b.shape, mesh)
            return v.replace(w=pin_to(v.w, s), a=pin_to(v.a, sa), b=pin_to(v.b, sb))
        return pin_to(v, s)

    def pin(vs):  # each kernel on its own (sharded) layout
        return tuple(pin_one(v, s) for v, s in zip(vs, specs))
    x, values = jax.lax.optimization_barrier((x, pin(values)))
    return x, pin(values)
