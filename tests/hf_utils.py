"""Shared test helpers: tiny random transformers Llamas and their PyTorch reference logits.

Typical use in a test that compares against transformers:

    import hf_utils   # tests/ is on sys.path under pytest
    hf_model = hf_utils.save_random_hf_model(tmp_path, num_key_value_heads=2)  # HF dir
    ours = checkpoint_hf.from_pretrained(tmp_path)                                      # real path
    ref = hf_utils.hf_logits(hf_model, ids, mask)                               # [B, T, V]

or, starting from one of our models: `checkpoint_hf.save_pretrained(model, d)` then
`hf_utils.load_hf_model(d)`. `our_logits(model, ids, mask)` is our forward, jitted (one
compile per model structure and shape: on CPU much cheaper than eager op-by-op dispatch).

Everything here is float32 PyTorch on CPU, deterministic for a given seed, and small (the
default config has ~25K parameters) so that tests stay fast.
"""

from __future__ import annotations

import functools
import os
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx

# A tiny multi-head config. rms_norm_eps is explicit: transformers' default is 1e-6, ours 1e-5.
# initializer_range 0.2 (transformers: 0.02) makes attention sharp at this width, so a wrong
# RoPE (theta, scaling, layout) or mask moves the logits far beyond the parity tolerance.
TINY_HF_CONFIG = dict(
    vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
    bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.2,
)

LLAMA3_ROPE_SCALING = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                           high_freq_factor=4.0, original_max_position_embeddings=16)


def hf_config(**overrides) -> transformers.LlamaConfig:
    """`transformers.LlamaConfig` from TINY_HF_CONFIG with overrides (e.g. head_dim=16,
    num_key_value_heads=2, rope_scaling=LLAMA3_ROPE_SCALING, tie_word_embeddings=True)."""
    # Copy dict values: transformers edits a rope_scaling dict in place (adds rope_theta).
    kw = {k: dict(v) if isinstance(v, dict) else v for k, v in overrides.items()}
    return transformers.LlamaConfig(**{**TINY_HF_CONFIG, **kw})


def random_hf_model(seed: int = 0, **overrides) -> transformers.LlamaForCausalLM:
    """A float32 `LlamaForCausalLM` in eval mode with seeded random weights.

    transformers initialises norm weights to 1; they are perturbed here so that a loader that
    drops or swaps a norm weight cannot pass a parity test.
    """
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(hf_config(**overrides)).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
    return model


def save_random_hf_model(path: os.PathLike, seed: int = 0, max_shard_size: Optional[str] = None,
                         **overrides) -> transformers.LlamaForCausalLM:
    """`random_hf_model(seed, **overrides)` written to `path` with transformers'
    `save_pretrained` (safetensors; sharded with an index when `max_shard_size` is small,
    e.g. "20KB"). Returns the in-memory model."""
    model = random_hf_model(seed, **overrides)
    kw = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(os.fspath(path), safe_serialization=True, **kw)
    return model


def load_hf_model(path: os.PathLike) -> transformers.LlamaForCausalLM:
    """`LlamaForCausalLM.from_pretrained(path)` in float32, eval mode (local files only)."""
    return transformers.LlamaForCausalLM.from_pretrained(
        os.fspath(path), dtype=torch.float32, local_files_only=True).eval()


def positions_from_mask(attention_mask: np.ndarray) -> np.ndarray:
    """[B, T] mask -> [B, T] int64 positions max(cumsum(mask) - 1, 0), as in our forward.

    transformers' forward defaults positions to arange(T) whatever the mask (only `generate`
    derives them from the mask), so left-padded comparisons must pass them explicitly.
    """
    mask = np.asarray(attention_mask).astype(np.int64)
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0)


def hf_logits(model: transformers.LlamaForCausalLM, input_ids,
              attention_mask=None) -> np.ndarray:
    """Reference logits [B, T, V] float32 from the PyTorch model (positions from the mask)."""
    ids = torch.as_tensor(np.asarray(input_ids), dtype=torch.long)
    kw = {}
    if attention_mask is not None:
        mask = np.asarray(attention_mask).astype(np.int64)
        kw = dict(attention_mask=torch.as_tensor(mask),
                  position_ids=torch.as_tensor(positions_from_mask(mask)))
    with torch.no_grad():
        return model(input_ids=ids, **kw).logits.float().numpy()


@functools.partial(jax.jit, static_argnums=0)
def _our_forward(graphdef, state, input_ids, attention_mask):
    return nnx.merge(graphdef, state)(input_ids, attention_mask)


def our_logits(model, input_ids, attention_mask=None) -> np.ndarray:
    """Our `model(input_ids, attention_mask)` under jit -> numpy logits [B, T, V] float32."""
    ids = jnp.asarray(np.asarray(input_ids), jnp.int32)
    mask = jnp.ones(ids.shape, bool) if attention_mask is None else jnp.asarray(
        np.asarray(attention_mask), bool)
    graphdef, state = nnx.split(model)
    return np.asarray(_our_forward(graphdef, state, ids, mask))
