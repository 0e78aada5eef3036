"""Bytes per device before a run starts: parameters, gradients, optimizer, reference, KV cache,
activations — for a Llama config, a (data, fsdp, tensor) mesh and the rollout/update shapes.

Sharding follows `jaxsocial.train.sharding.LOGICAL_AXIS_RULES` (fsdp shards the embed axis,
tensor shards heads/mlp/vocab, data x fsdp shard the batch). Activation memory uses the
per-layer count of Korthikanti et al. (2022), 34*T*B*H + 5*heads*T^2*B bytes at 16-bit,
scaled to the compute dtype; with rematerialisation only the layer inputs are kept.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional, Sequence

import numpy as np
from absl import logging

from jaxsocial.models.llama import LlamaConfig, as_dtype
from jaxsocial.train.sharding import AXES

GiB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device, by component."""

    params: int
    grads: int
    optimizer: int
    reference: int
    kv_cache: int
    activations: int

    @property
    def total(self) -> int:
        return sum(dataclasses.asdict(self).values())

    def table(self) -> str:
        rows = [(k, v) for k, v in dataclasses.asdict(self).items()] + [("total", self.total)]
        return "\n".join(f"{k:>12s}  {v / GiB:10.3f} GiB" for k, v in rows)


def _param_shapes(cfg: LlamaConfig) -> Dict[str, tuple]:
    """(shape, logical names) of every parameter, summed over layers."""
    h, i, v, d = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    n, k, L = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers
    out = {
        "embed_tokens": ((v, h), ("vocab", "embed"), 1),
        "q_proj": ((h, n * d), ("embed", "q_heads"), L),
        "k_proj": ((h, k * d), ("embed", "kv_heads"), L),
        "v_proj": ((h, k * d), ("embed", "kv_heads"), L),
        "o_proj": ((n * d, h), ("q_heads", "embed"), L),
        "gate_proj": ((h, i), ("embed", "mlp"), L),
        "up_proj": ((h, i), ("embed", "mlp"), L),
        "down_proj": ((i, h), ("mlp", "embed"), L),
        "norms": ((h,), ("norm",), 2 * L + 1),
    }
    if not cfg.tie_word_embeddings:
        out["lm_head"] = ((h, v), ("embed", "vocab"), 1)
    return out


def _shard_factor(shape, names, mesh: Dict[str, int]) -> int:
    from jaxsocial.train.sharding import LOGICAL_AXIS_RULES
    used, factor = set(), 1
    for name, size in zip(names, shape):
        axes = LOGICAL_AXIS_RULES.get(name)
        axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
        axes = tuple(a for a in axes if a not in used and mesh[a] > 1)
        f = math.prod(mesh[a] for a in axes) if axes else 1
        if axes and size % f == 0:
            used.update(axes)
            factor *= f
    return factor


def params_per_device(cfg: LlamaConfig, mesh: Dict[str, int]) -> int:
    """Parameter *count* held by one device under the sharding rules."""
    total = 0
    for shape, names, count in _param_shapes(cfg).values():
        total += count * math.prod(shape) // _shard_factor(shape, names, mesh)
    return total


def estimate(cfg: LlamaConfig, mesh_shape: Sequence[int] = (1, 1, 1), *, batch: int,
             prompt_len: int, response_len: int, train_micro_batch: Optional[int] = None,
             with_reference: bool = True, optimizer_slots: int = 2, lora_rank: int = 0,
             remat: bool = False) -> MemoryEstimate:
    """Per-device bytes for rollout (KV cache) + PPO update (params, grads, adam, activations).

    batch: prompts generated at once (global); train_micro_batch: sequences per update step
    (global, default batch); optimizer_slots: 2 for Adam(W) (mu, nu in float32).
    """
    mesh = dict(zip(AXES, (int(s) for s in mesh_shape)))
    pbytes = np.dtype(as_dtype(cfg.param_dtype)).itemsize
    cbytes = np.dtype(as_dtype(cfg.dtype)).itemsize
    n_local = params_per_device(cfg, mesh)
    params = n_local * pbytes
    reference = params if with_reference else 0
    if lora_rank:
        # Adapters on q/k/v/o/gate/up/down; base weights frozen (and double as the reference).
        h, i = cfg.hidden_size, cfg.intermediate_size
        nd, kd = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        per_layer = (h + nd) + 2 * (h + kd) + (nd + h) + 3 * (h + i)
        trainable = cfg.num_hidden_layers * lora_rank * per_layer
        trainable //= max(1, mesh["tensor"])
        reference = 0
    else:
        trainable = n_local
    grads = trainable * 4
    optimizer = trainable * 4 * optimizer_slots
    data = mesh["data"] * mesh["fsdp"]
    b_local = max(1, math.ceil(batch / data))
    seq = prompt_len + response_len
    kv_heads_local = cfg.num_key_value_heads // (mesh["tensor"] if cfg.num_key_value_heads
                                                  % mesh["tensor"] == 0 else 1)
    kv_cache = 2 * cfg.num_hidden_layers * b_local * seq * kv_heads_local * cfg.head_dim * cbytes
    mb_local = max(1, math.ceil((train_micro_batch or batch) / data))
    heads_local = cfg.num_attention_heads // (mesh["tensor"] if cfg.num_attention_heads
                                              % mesh["tensor"] == 0 else 1)
    h = cfg.hidden_size
    if remat:
        per_layer = seq * mb_local * h * cbytes
    else:
        per_layer = (34 * seq * mb_local * h // max(1, mesh["tensor"])
                     + 5 * heads_local * seq * seq * mb_local) * cbytes // 2
    logits = mb_local * seq * cfg.vocab_size * 4 * 2  # float32 logits + their gradient
    activations = cfg.num_hidden_layers * per_layer + logits
    return MemoryEstimate(params=params, grads=grads, optimizer=optimizer, reference=reference,
                          kv_cache=kv_cache, activations=activations)


def check_fits(est: MemoryEstimate, device_bytes: int, headroom: float = 0.9) -> bool:
    """Log a warning (and return False) when the estimate exceeds headroom x device memory."""
    if est.total > headroom * device_bytes:
        logging.warning("estimated %.2f GiB per device exceeds %.0f%% of the %.2f GiB available;"
                        " shard more (mesh.fsdp/tensor), use LoRA, remat, or smaller batches.\n%s",
                        est.total / GiB, headroom * 100, device_bytes / GiB, est.table())
        return False
    return True


def device_memory_bytes() -> Optional[int]:
    """Memory of the first local device, when the backend reports it (GPU/TPU)."""
    import jax
    stats = getattr(jax.local_devices()[0], "memory_stats", lambda: None)()
    return None if not stats else stats.get("bytes_limit")
