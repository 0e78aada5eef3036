"""One decoder in Flax NNX for Llama-3, Qwen2/Qwen2.5, Qwen3 and Mistral: RMSNorm, RoPE
(+ llama3 / linear scaling), GQA, SwiGLU, explicit KV cache, and a few switches read from the HF
config (`LlamaConfig.qkv_bias`, `o_bias`, `qk_norm`, `sliding_window`, `layer_types`).

Shapes: B batch, T new tokens, S cache slots, H hidden, N query heads, K kv heads, D head dim,
G = N // K query heads per kv head, V vocab, L layers.

The forward pass takes left-padded batches. Positions come from the attention mask
(`cumsum(mask) - 1`, continued from the cache), so a padded row gives the same logits as the
same sequence alone. Every parameter carries logical axis names (`out_sharding`) that
`jaxsocial.train.sharding` maps onto a mesh.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence, Union

import chex
import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from jaxsocial.models import partitioning

Array = jax.Array

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear")
# The HF model_types this decoder covers; `model_type` only picks the HF class on export.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
LAYER_TYPES = ("full_attention", "sliding_attention")
_ROPE_REQUIRED_KEYS = {"default": (), "linear": ("factor",),
                       "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                  "original_max_position_embeddings")}


def _weights_move(x: Array) -> bool:
    """Whether a [B, T, H] layer input is larger than its layer's weights' contraction side
    (B * T tokens > H): then the fsdp-sharded weights should be gathered to the rows
    (prefill, scoring, training), not the rows to the weights (one-token decode steps, tiny
    batches: XLA's own choice is kept there)."""
    return x.ndim == 3 and x.shape[0] * x.shape[1] > x.shape[2]


def _rows(x: Array, on: bool) -> Array:
    """When `on`: the rows (batch dim) stay split along the mesh's data axes inside jit
    (`partitioning.constrain_rows`; a no-op without a mesh)."""
    return partitioning.constrain_rows(x) if on else x


def _gather_here(x: Array, *kernels):
    """(x, kernel arrays) tied by an optimization barrier on a mesh, so each layer's weight
    all-gathers stay inside the layer (`partitioning.gather_in_place`)."""
    return partitioning.gather_in_place(x, kernels)


def as_dtype(name: Union[str, Any]) -> Any:
    """'bfloat16' | jnp.bfloat16 -> jnp dtype, with a clear error for anything else."""
    if isinstance(name, str):
        if name not in _DTYPES:
            raise ValueError(f"unsupported dtype {name!r}; expected one of {sorted(_DTYPES)}")
        return _DTYPES[name]
    return jnp.dtype(name).type


def dtype_name(dtype: Any) -> str:
    return jnp.dtype(dtype).name


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Architecture + numerics of one decoder (field names follow HF's configs).

    `rope_scaling` is stored as a sorted tuple of (key, value) pairs so the config stays
    hashable (it is a static argument under jit); pass a dict, read `rope_scaling_dict`.

    Family switches (defaults are Llama's; `checkpoint_hf.config_from_hf` sets them from an HF
    config, never from a model name):
    - qkv_bias: q/k/v projections have biases (Qwen2 always; Qwen3 when attention_bias).
    - o_bias: the output projection has a bias (Qwen3 with attention_bias).
    - qk_norm: per-head RMSNorm (weight [D]) on q and k before RoPE (Qwen3).
    - sliding_window: a query attends only to keys fewer than this many cache slots back
      (Mistral; Qwen2/3 with use_sliding_window). Slots are counted as transformers counts
      cache positions; for a left-padded row (real tokens contiguous) that equals tokens.
    - layer_types: per-layer "full_attention" | "sliding_attention" (Qwen2/3); None means every
      layer uses `sliding_window` (full attention when that is None).
    - model_type: which HF family `checkpoint_hf.save_pretrained` writes; it selects nothing in
      the forward pass.
    """

    vocab_size: int = 128256
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: Optional[int] = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: Any = None
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    bos_token_id: Optional[int] = 128000
    eos_token_id: Any = 128001
    pad_token_id: Optional[int] = None
    dtype: str = "float32"
    param_dtype: str = "float32"
    # Rematerialise each decoder layer in the backward pass (full-sequence forwards only):
    # activation memory drops from all layers' intermediates to their inputs.
    remat: bool = False
    # Queries per attention block (0 = all at once): a forward over T tokens then holds
    # [B, heads, chunk, S] float32 scores instead of [B, heads, T, S] (long prefills and
    # scoring passes). The same numbers: each query's softmax still spans every key.
    attention_chunk: int = 0
    # Run the decoder layers as one `lax.scan` over their stacked weights (stacked inside the
    # program; the parameter tree keeps one entry per layer): one layer's body is compiled,
    # and each layer's fsdp weight gathers happen inside its iteration under any scheduler.
    scan_layers: bool = False
    model_type: str = "llama"
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    sliding_window: Optional[int] = None
    layer_types: Optional[tuple] = None

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"hidden_size={self.hidden_size} is not divisible by "
                    f"num_attention_heads={self.num_attention_heads}; set head_dim explicitly")
            set_("head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if isinstance(self.rope_scaling, Mapping):
            set_("rope_scaling", tuple(sorted(
                (k, tuple(v) if isinstance(v, list) else v) for k, v in self.rope_scaling.items())))
        if isinstance(self.eos_token_id, list):
            set_("eos_token_id", tuple(self.eos_token_id))
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"unsupported model_type {self.model_type!r}; supported: "
                             f"{SUPPORTED_MODEL_TYPES}")
        if self.sliding_window is not None and (
                isinstance(self.sliding_window, bool) or int(self.sliding_window) < 1):
            raise ValueError(f"sliding_window must be a positive int or None, got "
                             f"{self.sliding_window!r}")
        if self.layer_types is not None:
            set_("layer_types", tuple(self.layer_types))
            if len(self.layer_types) != self.num_hidden_layers:
                raise ValueError(f"layer_types has {len(self.layer_types)} entries for "
                                 f"num_hidden_layers={self.num_hidden_layers}")
            bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
            if bad:
                raise ValueError(f"unsupported layer_types {bad}; supported: {LAYER_TYPES}")
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise ValueError("layer_types has 'sliding_attention' layers but "
                                 "sliding_window is None")
        for name in ("dtype", "param_dtype"):
            value = getattr(self, name)
            if not isinstance(value, str):
                set_(name, dtype_name(value))
            as_dtype(getattr(self, name))  # validates
        rope_type = self.rope_type
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"unsupported rope type {rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}")
        missing = [k for k in _ROPE_REQUIRED_KEYS[rope_type] if k not in self.rope_scaling_dict]
        if missing:
            raise ValueError(f"{rope_type} rope_scaling is missing {missing}: "
                             f"{self.rope_scaling_dict}")

    @property
    def rope_scaling_dict(self) -> Optional[dict]:
        return None if self.rope_scaling is None else dict(self.rope_scaling)

    @property
    def rope_type(self) -> str:
        rs = self.rope_scaling_dict
        if not rs:
            return "default"
        return rs.get("rope_type", rs.get("type", "default"))

    @property
    def eos_token_ids(self) -> tuple:
        eos = self.eos_token_id
        if eos is None:
            return ()
        return tuple(eos) if isinstance(eos, (tuple, list)) else (int(eos),)

    @property
    def layer_windows(self) -> tuple:
        """Per layer: the sliding window (int) or None for full causal attention."""
        if self.layer_types is None:
            return (self.sliding_window,) * self.num_hidden_layers
        return tuple(self.sliding_window if t == "sliding_attention" else None
                     for t in self.layer_types)

    def replace(self, **kw) -> "LlamaConfig":
        return dataclasses.replace(self, **kw)

    def num_params(self) -> int:
        h, i, v, d = self.hidden_size, self.intermediate_size, self.vocab_size, self.head_dim
        n, k = self.num_attention_heads, self.num_key_value_heads
        attn = h * d * (n * 2 + k * 2)
        attn += (n + 2 * k) * d * self.qkv_bias + h * self.o_bias + 2 * d * self.qk_norm
        layer = attn + 3 * h * i + 2 * h
        return v * h * (1 if self.tie_word_embeddings else 2) + self.num_hidden_layers * layer + h


_LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

PRESETS = {
    # Meta-Llama-3-8B(-Instruct).
    "llama3_8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      rope_theta=500000.0, max_position_embeddings=8192,
                      bos_token_id=128000, eos_token_id=(128001, 128009)),
    # Llama-3.2-1B(-Instruct): llama3 rope scaling factor 32, tied embeddings.
    "llama3_2_1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                        head_dim=64, rope_theta=500000.0, max_position_embeddings=131072,
                        tie_word_embeddings=True, bos_token_id=128000,
                        eos_token_id=(128001, 128008, 128009),
                        rope_scaling=dict(_LLAMA3_SCALING, factor=32.0)),
    # ~20M parameters: the CPU benchmark size (vocab of the tiny tokenizer family, padded).
    "small_20m": dict(vocab_size=8192, hidden_size=384, intermediate_size=1024,
                      num_hidden_layers=8, num_attention_heads=6, num_key_value_heads=2,
                      rope_theta=500000.0, max_position_embeddings=2048,
                      bos_token_id=1, eos_token_id=(2, 5), pad_token_id=0),
    # A few hundred K parameters: CPU tests and the demo. Vocab and special ids match
    # `jaxsocial.models.tokenizer.tiny_tokenizer()`: pad 0, <|begin_of_text|> 1,
    # eos = (<|end_of_text|> 2, <|eot_id|> 5).
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=176,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 rope_theta=500000.0, max_position_embeddings=1024,
                 rope_scaling=dict(_LLAMA3_SCALING, original_max_position_embeddings=256),
                 bos_token_id=1, eos_token_id=(2, 5), pad_token_id=0),
}


def preset(name: str, **overrides) -> LlamaConfig:
    """A named architecture ('tiny', 'small_20m', 'llama3_2_1b', 'llama3_8b') with overrides."""
    if name not in PRESETS:
        raise ValueError(f"unknown Llama preset {name!r}; choose one of {sorted(PRESETS)}")
    return LlamaConfig(**{**PRESETS[name], **overrides})


# ----------------------------------------------------------------------------------------------
# RoPE


def rope_inv_freq(config: LlamaConfig) -> jnp.ndarray:
    """Inverse frequencies [D/2] float32, with the config's rope scaling (HF semantics)."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    rs = config.rope_scaling_dict or {}
    kind = config.rope_type
    if kind == "linear":
        inv_freq = inv_freq / float(rs["factor"])
    elif kind == "llama3":
        try:
            factor = float(rs["factor"])
            low = float(rs["low_freq_factor"])
            high = float(rs["high_freq_factor"])
            old_ctx = float(rs["original_max_position_embeddings"])
        except KeyError as e:
            raise ValueError(f"llama3 rope_scaling is missing {e.args[0]!r}: {rs}") from None
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = jnp.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = jnp.where(medium, smoothed, scaled)
    return inv_freq


def apply_rope(x: Array, positions: Array, inv_freq: Array) -> Array:
    """Rotate-half RoPE (HF layout). x [B, T, heads, D], positions [B, T] int32."""
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(emb), jnp.sin(emb)
    xf = x.astype(jnp.float32)
    x1, x2 = jnp.split(xf, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (xf * cos + rotated * sin).astype(x.dtype)


# ----------------------------------------------------------------------------------------------
# Cache


@flax.struct.dataclass
class KVCache:
    """Explicit KV cache. k, v: tuples of L arrays [B, S, K, D] (one buffer per layer, so a
    decode step of the unrolled layers updates each in place), or, for `scan_layers` models,
    one [L, B, S, K, D] array each (the scan's carry, updated in place); mask [B, S] bool
    (slot holds a real token); index int32 scalar (next slot to write, same for every row:
    batches are left-padded); lengths [B] int32 (real tokens so far = position of the next
    token)."""

    k: tuple
    v: tuple
    mask: Array
    index: Array
    lengths: Array

    def map_rows(self, fn) -> "KVCache":
        """The cache with `fn` (acting on a leading row axis) applied to every per-row array,
        e.g. `lambda x: jnp.repeat(x, g, axis=0)`; `index` is kept."""
        per_layer = (lambda kv: tuple(map(fn, kv))) if isinstance(self.k, tuple) else jax.vmap(fn)
        return KVCache(k=per_layer(self.k), v=per_layer(self.v), mask=fn(self.mask),
                       index=self.index, lengths=fn(self.lengths))

    def grow(self, max_len: int) -> "KVCache":
        """The cache with `max_len` slots: the current ones, then empty ones (one copy)."""
        slots = self.mask.shape[1]
        if max_len < slots:
            raise ValueError(f"cannot grow a cache of {slots} slots to {max_len}")

        def pad_slots(x):  # axis 1 (after the rows) holds the slots of k, v and mask; not lengths
            widths = [(0, 0)] * x.ndim
            if x.ndim > 1:
                widths[1] = (0, max_len - slots)
            return jnp.pad(x, widths)

        return self.map_rows(pad_slots)


def init_cache(config: LlamaConfig, batch: int, max_len: int, dtype: Any = None) -> KVCache:
    """An empty cache for `batch` rows and `max_len` slots, in the compute dtype by default
    (stacked [L, ...] arrays for a `scan_layers` config, else one array per layer)."""
    dt = as_dtype(dtype or config.dtype)
    shape = (batch, max_len, config.num_key_value_heads, config.head_dim)
    if config.scan_layers:
        k = jnp.zeros((config.num_hidden_layers,) + shape, dt)
        kv = (k, jnp.zeros_like(k))
    else:
        kv = tuple(tuple(jnp.zeros(shape, dt) for _ in range(config.num_hidden_layers))
                   for _ in "kv")
    return KVCache(k=kv[0], v=kv[1],
                   mask=jnp.zeros((batch, max_len), bool), index=jnp.zeros((), jnp.int32),
                   lengths=jnp.zeros((batch,), jnp.int32))


@flax.struct.dataclass
class LlamaOutput:
    """logits [B, T, V] float32; hidden [B, T, H] final-normed hidden states; cache or None."""

    logits: Array
    hidden: Array
    cache: Optional[KVCache] = None


# ----------------------------------------------------------------------------------------------
# Modules


def _param(rngs: nnx.Rngs, shape: Sequence[int], names: tuple, dtype, init: str = "normal"):
    if init == "ones":
        value = jnp.ones(shape, dtype)
    elif init == "zeros":
        value = jnp.zeros(shape, dtype)
    else:
        value = (0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
    return nnx.Param(value, out_sharding=names, eager_sharding=False)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, param_dtype, rngs: nnx.Rngs):
        self.weight = _param(rngs, (dim,), ("norm",), param_dtype, init="ones")
        self.eps = eps

    def __call__(self, x: Array) -> Array:
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * xf.astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs):
        pd = as_dtype(cfg.param_dtype)
        h, n, k, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = _param(rngs, (h, n * d), ("embed", "q_heads"), pd)
        self.k_proj = _param(rngs, (h, k * d), ("embed", "kv_heads"), pd)
        self.v_proj = _param(rngs, (h, k * d), ("embed", "kv_heads"), pd)
        self.o_proj = _param(rngs, (n * d, h), ("q_heads", "embed"), pd)
        # Biases (HF initialises them to zero): q_bias [N*D], k_bias / v_bias [K*D], o_bias [H].
        bias = lambda size, names: _param(rngs, (size,), names, pd, init="zeros")  # noqa: E731
        self.q_bias = bias(n * d, ("q_heads",)) if cfg.qkv_bias else None
        self.k_bias = bias(k * d, ("kv_heads",)) if cfg.qkv_bias else None
        self.v_bias = bias(k * d, ("kv_heads",)) if cfg.qkv_bias else None
        self.o_bias = bias(h, ("embed",)) if cfg.o_bias else None
        # QK-norm: one RMSNorm weight [D] shared by all heads (Qwen3).
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps, pd, rngs) if cfg.qk_norm else None
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps, pd, rngs) if cfg.qk_norm else None
        self.n, self.k, self.d = n, k, d

    @staticmethod
    def _linear(x, kernel, bias):
        dt = x.dtype
        y = x @ kernel[...].astype(dt)
        return y if bias is None else y + bias[...].astype(dt)

    def __call__(self, x, positions, inv_freq, bias, kv_fn, chunk: int = 0):
        """x [B, T, H]; bias [B, T, S] additive mask over the S cache slots attended; kv_fn
        stores new k/v and returns the full keys/values [B, S_max, K, D] (sliced to S here);
        chunk: queries per attention block (`LlamaConfig.attention_chunk`)."""
        b, t, _ = x.shape
        dt = x.dtype
        on = _weights_move(x)
        x, (wq, wk, wv, wo) = _gather_here(x, self.q_proj, self.k_proj, self.v_proj, self.o_proj)
        q = _rows(self._linear(x, wq, self.q_bias), on).reshape(b, t, self.n, self.d)
        k = _rows(self._linear(x, wk, self.k_bias), on).reshape(b, t, self.k, self.d)
        v = _rows(self._linear(x, wv, self.v_bias), on).reshape(b, t, self.k, self.d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q, positions, inv_freq)
        k = apply_rope(k, positions, inv_freq)
        keys, values = kv_fn(k, v)
        live = bias.shape[-1]  # the live prefix of the cache (Llama.forward's kv_limit)
        keys, values = keys[:, :live].astype(dt), values[:, :live].astype(dt)
        # GQA without repeating K/V: group the query heads under their kv head.
        q = q.reshape(b, t, self.k, self.n // self.k, self.d)

        def attend(q, bias):  # q [B, C, K, G, D], bias [B, C, S] -> [B, C, K, G, D]
            scores = jnp.einsum("btkgd,bskd->bkgts", q, keys,
                                preferred_element_type=jnp.float32) * (self.d ** -0.5)
            scores = scores + bias[:, None, None, :, :]
            probs = jax.nn.softmax(scores, axis=-1).astype(dt)
            return jnp.einsum("bkgts,bskd->btkgd", probs, values)

        c = int(chunk)
        if 0 < c < t:
            # Query blocks in a loop: one block's scores are live at a time. Padded query
            # rows (bias 0: never an all-masked softmax) are dropped after.
            n_blk = -(-t // c)
            pad = n_blk * c - t
            qp = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0), (0, 0)))
            bp = jnp.pad(bias, ((0, 0), (0, pad), (0, 0)))
            blocks = lambda x: jnp.moveaxis(  # noqa: E731
                x.reshape((b, n_blk, c) + x.shape[2:]), 1, 0)
            # Checkpointed: the backward recomputes a block's scores instead of the loop
            # saving every block's probabilities (which would be [B, heads, T, S] again).
            blk = jax.checkpoint(attend)
            out = jax.lax.map(lambda a: blk(*a), (blocks(qp), blocks(bp)))
            out = jnp.moveaxis(out, 0, 1).reshape((b, n_blk * c) + out.shape[3:])[:, :t]
        else:
            out = attend(q, bias)
        return _rows(self._linear(out.reshape(b, t, self.n * self.d), wo, self.o_bias), on)


class MLP(nnx.Module):
    def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs):
        pd = as_dtype(cfg.param_dtype)
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = _param(rngs, (h, i), ("embed", "mlp"), pd)
        self.up_proj = _param(rngs, (h, i), ("embed", "mlp"), pd)
        self.down_proj = _param(rngs, (i, h), ("mlp", "embed"), pd)

    def __call__(self, x):
        dt = x.dtype
        on = _weights_move(x)
        x, (wg, wu, wd) = _gather_here(x, self.gate_proj, self.up_proj, self.down_proj)
        g = _rows(x @ wg.astype(dt), on)
        u = _rows(x @ wu.astype(dt), on)
        return _rows((jax.nn.silu(g) * u) @ wd.astype(dt), on)


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs):
        pd = as_dtype(cfg.param_dtype)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs)
        self.self_attn = Attention(cfg, rngs)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x, positions, inv_freq, bias, kv_fn, chunk: int = 0):
        x = x + self.self_attn(self.input_layernorm(x), positions, inv_freq, bias, kv_fn, chunk)
        return x + self.mlp(self.post_attention_layernorm(x))


_MASK_VALUE = float(jnp.finfo(jnp.float32).min)


def _positions(start: Array, mask: Array) -> Array:
    """[B, T] int32 RoPE positions of the real tokens, continuing from `start` [B] (the
    tokens already in a cache); left padding sits at position 0."""
    return jnp.maximum(start[:, None] + jnp.cumsum(mask, axis=1, dtype=jnp.int32) - 1, 0)


def _no_cache(k: Array, v: Array):
    """A layer's keys and values as computed (no cache to write them to)."""
    return k, v


def _cache_writer(store: dict, layer: int, index):
    """A layer's kv_fn that writes its new keys / values into `store` ({"k", "v"}: per-layer
    [B, S, K, D] buffers) at slot `index` and returns the whole buffers."""
    def kv_fn(k, v):
        for name, new in (("k", k), ("v", v)):
            buf = store[name][layer]
            store[name][layer] = jax.lax.dynamic_update_slice(
                buf, new.astype(buf.dtype), (0, index, 0, 0))
        return store["k"][layer], store["v"][layer]
    return kv_fn


class Llama(nnx.Module):
    """The causal LM of every supported family (Llama-3, Qwen2/2.5, Qwen3, Mistral; see
    LlamaConfig's switches). `model(ids, attention_mask=mask)` -> logits [B, T, V] float32;
    `model.forward(ids, mask, cache=...)` -> LlamaOutput(logits, hidden, cache)."""

    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs):
        self.config = config
        pd = as_dtype(config.param_dtype)
        self.embed_tokens = _param(rngs, (config.vocab_size, config.hidden_size),
                                   ("vocab", "embed"), pd)
        self.layers = nnx.List([DecoderLayer(config, rngs)
                                for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, pd, rngs)
        self.lm_head = (None if config.tie_word_embeddings else
                        _param(rngs, (config.hidden_size, config.vocab_size), ("embed", "vocab"),
                               pd))

    def __call__(self, input_ids: Array, attention_mask: Optional[Array] = None) -> Array:
        return self.forward(input_ids, attention_mask).logits

    def unembedding(self) -> Array:
        """The LM head as an [H, V] matrix (the embedding's transpose when weights are tied)."""
        return self.embed_tokens[...].T if self.lm_head is None else self.lm_head[...]

    def unembed(self, hidden: Array) -> Array:
        """hidden [..., H] -> logits [..., V] float32."""
        w = self.unembedding().astype(hidden.dtype)
        return jnp.matmul(hidden, w, preferred_element_type=jnp.float32)

    def forward(self, input_ids: Array, attention_mask: Optional[Array] = None, *,
                cache: Optional[KVCache] = None, kv_limit: Optional[int] = None) -> LlamaOutput:
        """input_ids [B, T] int; attention_mask [B, T] (1 = real token, 0 = left padding).

        Without a cache: a full causal forward. With a cache: the T tokens are written at
        slots [cache.index, cache.index + T) and attend to every earlier real slot; their
        positions continue from `cache.lengths`. Outside jit, writing past the cache's
        max_len raises ValueError; under jit it cannot be checked (size the cache).
        kv_limit (static int, with a cache): attend to the first kv_limit slots only, the live
        prefix (the caller promises cache.index + T <= kv_limit; checked outside jit), so the
        attention's work and reads scale with the filled part of the cache, not its size.
        Sliding-window layers attend to the last `sliding_window` slots only (the cache still
        keeps every slot).
        """
        chex.assert_rank(input_ids, 2)
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, bool)
        chex.assert_equal_shape([input_ids, attention_mask])
        mask = attention_mask.astype(bool)
        if cache is None:
            if kv_limit is not None:
                raise ValueError("kv_limit needs a cache (it bounds the cache slots attended)")
            return self._forward_full(input_ids, mask)
        return self._forward_cached(input_ids, mask, cache, kv_limit)

    def _forward_full(self, input_ids: Array, mask: Array) -> LlamaOutput:
        """No cache: causal attention over the T tokens [B, T]; the layers unrolled, each
        recomputed in the backward pass (config.remat), or scanned (config.scan_layers)."""
        cfg = self.config
        b, t = input_ids.shape
        positions = _positions(jnp.zeros((b,), jnp.int32), mask)
        inv_freq = rope_inv_freq(cfg)
        q_slot = kv_slot = jnp.arange(t)
        allowed = (kv_slot[None, :] <= q_slot[:, None])[None] & mask[:, None, :]
        biases = self._window_biases(allowed, q_slot, kv_slot)
        x = self._embed(input_ids)
        if cfg.scan_layers:
            x, _ = self._scan_layers(x, positions, inv_freq, biases, None)
        elif cfg.remat:
            def run_layer(layer, x, positions, bias):
                return layer(x, positions, inv_freq, bias, _no_cache, cfg.attention_chunk)
            run_layer = nnx.remat(run_layer)
            for layer, window in zip(self.layers, cfg.layer_windows):
                x = run_layer(layer, x, positions, biases[window])
        else:
            for layer, window in zip(self.layers, cfg.layer_windows):
                x = layer(x, positions, inv_freq, biases[window], _no_cache, cfg.attention_chunk)
        hidden = self.norm(x)
        return LlamaOutput(logits=self.unembed(hidden), hidden=hidden, cache=None)

    def _forward_cached(self, input_ids: Array, mask: Array, cache: KVCache,
                        kv_limit: Optional[int]) -> LlamaOutput:
        """With a cache: the T tokens [B, T] are written at slots [index, index + T) and attend
        to the earlier real slots below `kv_limit`; returns the updated cache in the layout it
        came in (a per-layer tuple, or stacked [L, ...] arrays)."""
        cfg = self.config
        b, t = input_ids.shape
        s = cache.mask.shape[1]
        if len(cache.k) != cfg.num_hidden_layers:
            raise ValueError(f"cache has {len(cache.k)} layers, model has "
                             f"{cfg.num_hidden_layers}")
        one = (b, s, cfg.num_key_value_heads, cfg.head_dim)
        if isinstance(cache.k, tuple):
            chex.assert_shape(list(cache.k) + list(cache.v), one)
        else:
            chex.assert_shape([cache.k, cache.v], (cfg.num_hidden_layers,) + one)
        idx = cache.index
        if not isinstance(idx, jax.core.Tracer) and int(idx) + t > s:
            # Under jit this cannot be checked; dynamic_update_slice would clamp the write
            # position and silently overwrite earlier slots.
            raise ValueError(f"KV cache overflow: {int(idx)} slots used + {t} new tokens > "
                             f"max_len {s}")
        live = s if kv_limit is None else int(kv_limit)
        if not 0 < live <= s:
            raise ValueError(f"kv_limit must be in [1, {s}] (the cache's slots), got "
                             f"{kv_limit}")
        if not isinstance(idx, jax.core.Tracer) and int(idx) + t > live:
            raise ValueError(f"kv_limit {live} < {int(idx)} slots used + {t} new tokens")
        positions = _positions(cache.lengths, mask)
        inv_freq = rope_inv_freq(cfg)
        slot_mask = jax.lax.dynamic_update_slice(cache.mask, mask, (0, idx))
        # Attention sees slots [0, live): the bias's last axis sets how many keys each
        # layer reads (Attention slices the cache to it).
        q_slot, kv_slot = idx + jnp.arange(t), jnp.arange(live)
        allowed = (kv_slot[None, :] <= q_slot[:, None])[None] & slot_mask[:, None, :live]
        biases = self._window_biases(allowed, q_slot, kv_slot)
        x = self._embed(input_ids)
        if cfg.scan_layers:
            x, store = self._scan_layers(x, positions, inv_freq, biases, cache)
        else:
            store = {"k": list(cache.k), "v": list(cache.v)}
            for i, (layer, window) in enumerate(zip(self.layers, cfg.layer_windows)):
                x = layer(x, positions, inv_freq, biases[window], _cache_writer(store, i, idx),
                          cfg.attention_chunk)
        hidden = self.norm(x)

        def as_in(kv):  # the layout the cache came in: per-layer tuple or stacked array
            if isinstance(cache.k, tuple):
                return tuple(kv)
            return kv if cfg.scan_layers else jnp.stack(kv)
        new_cache = KVCache(k=as_in(store["k"]), v=as_in(store["v"]), mask=slot_mask,
                            index=idx + t,
                            lengths=cache.lengths + mask.sum(axis=1, dtype=jnp.int32))
        return LlamaOutput(logits=self.unembed(hidden), hidden=hidden, cache=new_cache)

    def _window_biases(self, allowed: Array, q_slot: Array, kv_slot: Array) -> dict:
        """{window: additive bias [B, T, S] float32}, one per distinct sliding window of the
        layers. A sliding window counts cache slots (transformers' cache positions: kv_slot >
        q_slot - window), not token positions."""
        biases = {}
        for window in dict.fromkeys(self.config.layer_windows):
            ok = allowed
            if window is not None:
                ok = ok & (kv_slot[None, :] > q_slot[:, None] - window)[None]
            biases[window] = jnp.where(ok, 0.0, _MASK_VALUE).astype(jnp.float32)
        return biases

    def _embed(self, input_ids: Array) -> Array:
        # Gather, then cast: casting the whole [V, H] table every call costs V*H per step.
        return self.embed_tokens[...][input_ids].astype(as_dtype(self.config.dtype))

    def _scan_layers(self, x, positions, inv_freq, biases, cache):
        """The decoder layers as one `lax.scan` over their weights stacked along a new leading
        axis (config.scan_layers): x [B, T, H] -> (x, None) without a cache, else (x,
        {"k", "v"}: the updated [L, B, S, K, D] caches, carried through the scan and written in
        place)."""
        cfg = self.config
        splits = [nnx.split(layer) for layer in self.layers]
        graphdef = splits[0][0]
        stacked = jax.tree.map(lambda *a: jnp.stack(a), *[st for _, st in splits])
        windows = list(dict.fromkeys(cfg.layer_windows))
        bias_stack = jnp.stack([biases[w] for w in windows])
        which = jnp.asarray([windows.index(w) for w in cfg.layer_windows], jnp.int32)
        layer_ids = jnp.arange(cfg.num_hidden_layers, dtype=jnp.int32)

        if cache is None:
            def body(x, xs):
                st, w = xs
                layer = nnx.merge(graphdef, st)
                return layer(x, positions, inv_freq, bias_stack[w], lambda k, v: (k, v),
                             cfg.attention_chunk), None
            if cfg.remat:  # prevent_cse=False: inside a scan CSE cannot undo the remat
                body = jax.checkpoint(body, prevent_cse=False)
            x, _ = jax.lax.scan(body, x, (stacked, which))
            return x, None

        idx = cache.index
        kc, vc = ((jnp.stack(cache.k), jnp.stack(cache.v)) if isinstance(cache.k, tuple)
                  else (cache.k, cache.v))

        def body(carry, xs):
            x, kc, vc = carry
            st, w, i = xs
            layer = nnx.merge(graphdef, st)
            box = {}

            def kv_fn(k, v):
                box["k"] = jax.lax.dynamic_update_slice(kc, k[None].astype(kc.dtype),
                                                        (i, 0, idx, 0, 0))
                box["v"] = jax.lax.dynamic_update_slice(vc, v[None].astype(vc.dtype),
                                                        (i, 0, idx, 0, 0))
                return box["k"][i], box["v"][i]
            x = layer(x, positions, inv_freq, bias_stack[w], kv_fn, cfg.attention_chunk)
            return (x, box["k"], box["v"]), None
        (x, kc, vc), _ = jax.lax.scan(body, (x, kc, vc), (stacked, which, layer_ids))
        return x, {"k": kc, "v": vc}


def init(config: LlamaConfig, seed: int = 0) -> Llama:
    """A randomly initialised model (normal(0.02) kernels, unit norms)."""
    return Llama(config, rngs=nnx.Rngs(seed))
