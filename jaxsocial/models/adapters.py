"""A projection kernel with low-rank adapters that stay unmerged: `x @ Adapted` is
x @ W + scale * (x @ A_k) @ B_k, with k the adapter of each row of x.

The decoder's layers compute `x @ kernel[...].astype(dtype)`; an `Adapted` stands in for the
kernel array there (in the weights tree handed to `nnx.merge`), so the same compiled prefill,
decode and scoring serve several LoRA adapters over one frozen base, one adapter per batch
row, with no change to the layers and no merged copy of W. It is the multi-LoRA of S-LoRA and
Punica's BGMV, written as two small dense products over all K adapters with a one-hot row
selector: the [B, T, K * r] intermediates are tiny next to W's product, and no adapter is
gathered per row.

Shapes: w [in, out]; a [K, in, r]; b [K, r, out] (float32); rows [B] int32, the adapter of
each row (-1: the base alone), or None: adapter 0 for every row (K = 1, the unmerged form of
one LoRA). Stacked over layers (`Llama.scan_layers`) every field gains a leading [L] axis and
the scan slices it off again.
"""
from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Adapted:
    """A kernel W [in, out] with per-row LoRA adapters (see the module docstring)."""

    w: jax.Array
    a: jax.Array
    b: jax.Array
    rows: Optional[jax.Array] = None
    scale: float = struct.field(pytree_node=False, default=1.0)

    @property
    def shape(self):
        return self.w.shape

    @property
    def dtype(self):
        return self.w.dtype

    @property
    def ndim(self) -> int:
        return self.w.ndim

    def __getitem__(self, index):
        if index is not Ellipsis:
            raise TypeError("an Adapted kernel is read whole (kernel[...])")
        return self

    def astype(self, dtype) -> "Adapted":
        """The base cast to the compute dtype; the adapters stay float32."""
        return self.replace(w=self.w.astype(dtype))

    def map_base(self, fn: Callable) -> "Adapted":
        """fn applied to W alone (e.g. a sharding constraint with W's own layout)."""
        return self.replace(w=fn(self.w))

    def __rmatmul__(self, x: jax.Array) -> jax.Array:
        """x [B, T, in] -> [B, T, out] in x's dtype."""
        k, n_in, r = self.a.shape
        dt = x.dtype
        base = x @ self.w.astype(dt)
        xa = jnp.matmul(x, jnp.moveaxis(self.a, 0, 1).reshape(n_in, k * r).astype(dt),
                        preferred_element_type=jnp.float32)          # [B, T, K * r]
        if self.rows is None and k != 1:
            raise ValueError(f"an Adapted kernel with {k} adapters needs rows (the adapter of "
                             f"each batch row)")
        if self.rows is not None:
            if self.rows.shape[0] != x.shape[0]:
                raise ValueError(f"Adapted kernel has rows for {self.rows.shape[0]} batch "
                                 f"rows, the input has {x.shape[0]}")
            pick = jax.nn.one_hot(self.rows, k, dtype=jnp.float32)    # [B, K]; -1 -> zeros
            xa = (xa.reshape(x.shape[:-1] + (k, r))
                  * pick.reshape((x.shape[0],) + (1,) * (x.ndim - 2) + (k, 1))
                  ).reshape(x.shape[:-1] + (k * r,))
        delta = xa @ self.b.reshape(k * r, -1)
        return base + (self.scale * delta).astype(dt)


def is_adapted(x) -> bool:
    return isinstance(x, Adapted)
