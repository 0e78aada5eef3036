"""LoRA (Hu et al. 2021) for the decoder's projection matrices (every family: the q/k/v/o and
MLP kernels by name; biases and QK-norm weights stay frozen): train adapters only.

For every targeted kernel W [in, out] the policy uses W + (alpha / rank) * A @ B with
A [in, rank] (uniform +-1/sqrt(in), as PEFT's kaiming init) and B [rank, out] (zeros), so the
initial policy equals the base. The base weights stay frozen in `TrainState.ref_params` and are
also the reference policy: no second copy of the model is kept.

The forward keeps the adapters unmerged (`adapt`): every targeted kernel becomes a
`models.adapters.Adapted` (x @ W + scale * (x @ A) @ B), so the backward computes gradients for
A and B only, never W's full gradient, and no merged copy of the weights is made. The same path
serves one policy (K = 1) and several adapters stacked [K, ...] in one batch, one adapter per row
(the agents' cohorts). The Llama module is unchanged. Optimizer state is only over A, B.
`merged_weights_for_export` forms W + scale * A @ B for writing a policy out (Hugging Face
checkpoints hold plain weights); no forward uses it.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxsocial.models.adapters import Adapted

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """rank r, scale alpha / r and the kernel names to adapt (2-D weights only)."""

    rank: int = 8
    alpha: float = 16.0
    targets: tuple = DEFAULT_TARGETS

    def __post_init__(self):
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
        object.__setattr__(self, "targets", tuple(self.targets))

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def _targeted(weights, cfg: LoraConfig, prefix=()):
    """Yield (path, kernel) for every targeted 2-D kernel in a nested dict."""
    for k, v in weights.items():
        if isinstance(v, dict):
            yield from _targeted(v, cfg, prefix + (k,))
        elif k in cfg.targets and getattr(v, "ndim", 0) == 2:
            yield prefix + (k,), v


def _set(tree: dict, path: tuple, value):
    node = tree
    for k in path[:-1]:
        node = node.setdefault(k, {})
    node[path[-1]] = value


def _get(tree: dict, path: tuple):
    for k in path:
        tree = tree[k]
    return tree


def init_adapters(weights, cfg: LoraConfig, key) -> dict:
    """Adapters {path...: {"a": [in, r] float32, "b": [r, out] float32 zeros}} for `weights`
    (a pure dict of the Llama, e.g. `nnx.to_pure_dict(nnx.split(model)[1])`)."""
    found = list(_targeted(weights, cfg))
    if not found:
        raise ValueError(f"no 2-D kernel named one of {cfg.targets} in the weights")
    adapters: dict = {}
    for (path, w), k in zip(found, jax.random.split(key, len(found))):
        n_in, n_out = w.shape
        bound = 1.0 / jnp.sqrt(n_in)
        _set(adapters, path, {
            "a": jax.random.uniform(k, (n_in, cfg.rank), jnp.float32, -bound, bound),
            "b": jnp.zeros((cfg.rank, n_out), jnp.float32),
        })
    return adapters


def merged_weights_for_export(base, adapters, cfg: LoraConfig):
    """Weights with W + scale * A @ B for every adapted kernel (dtype of W kept), for an export;
    the forward uses `adapt`. adapters: one adapter tree (a [in, r], b [r, out])."""
    merged = jax.tree.map(lambda x: x, base)  # a new container tree; leaves shared
    for path, w in _targeted(base, cfg):
        ad = _get(adapters, path)
        delta = (ad["a"] @ ad["b"]) * cfg.scale
        _set(merged, path, (w.astype(jnp.float32) + delta).astype(w.dtype))
    return merged


def adapt(base, adapters, cfg: LoraConfig, rows=None):
    """Weights whose adapted kernels are unmerged `Adapted` kernels (the rest of `base` as is).

    adapters: one adapter tree (leaves a [in, r], b [r, out]; rows None), or K stacked ones
    (a [K, in, r], b [K, r, out]) with rows [B] int32 the adapter of each batch row (-1: the
    base alone)."""
    out = jax.tree.map(lambda x: x, base)
    for path, w in _targeted(base, cfg):
        ad = _get(adapters, path)
        a, b = ad["a"], ad["b"]
        if rows is None:
            a, b = a[None], b[None]
        _set(out, path, Adapted(w=w, a=a, b=b, rows=rows, scale=cfg.scale))
    return out


def stack(adapters_list) -> dict:
    """K adapter trees -> one tree with leaves stacked along a new leading [K] axis."""
    return jax.tree.map(lambda *x: jnp.stack(x), *adapters_list)


def num_params(tree) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(tree))
