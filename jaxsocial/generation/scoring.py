"""Re-scoring responses under the sampling distribution: the one path both
`recompute_logprobs` (model level) and the RL policy (`rl.policy.evaluate`, training) run.

A row is prompt [P] (left-padded) + response [R] (right-padded); the hidden state at position
P - 1 + t predicts response token t. Log-probs (and entropy) are those of the sampling
distribution (`sampling.log_probs`: grammar mask, temperature, top-k, top-p), computed in
chunks of response positions inside a `lax.scan` with remat (`token_stats`), so no
[B, R, V] logits array exists.
"""
from __future__ import annotations

from typing import Optional

import chex
import jax
import jax.numpy as jnp

from jaxsocial.generation import grammar as grammar_lib
from jaxsocial.generation import sampling as sampling_lib

Array = jax.Array


def response_hidden(model, ids: Array, mask: Array, p: int, r: int) -> tuple[Array, Array]:
    """model: an nnx Llama; ids, mask [B, P + R]. -> (final-normed hidden states [B, R, H] of
    positions P - 1 .. P + R - 2, the ones that predict response tokens 0 .. R - 1;
    unembedding matrix [H, V]).

    No logits here: the forward's full-length logits are unused (XLA drops them) and the LM
    head is applied chunk by chunk in `token_stats`.
    """
    hidden = jax.lax.slice_in_dim(model.forward(ids, mask).hidden, p - 1, p - 1 + r, axis=1)
    w = model.embed_tokens[...].T if model.lm_head is None else model.lm_head[...]
    return hidden, w


# The auto chunk keeps one [rows, chunk, V] float32 logits block near this size.
AUTO_CHUNK_BYTES = 64 * 2 ** 20


def resolve_chunk(chunk: int, rows: int, length: int, vocab: int) -> int:
    """Positions per chunk: `chunk` (capped at `length`) or, for chunk <= 0, the largest that
    keeps a [rows, chunk, vocab] float32 block within AUTO_CHUNK_BYTES, balanced so the last
    chunk is (nearly) full."""
    if chunk and chunk > 0:
        c = min(int(chunk), length)
    else:
        c = max(1, min(length, AUTO_CHUNK_BYTES // max(rows * vocab * 4, 1)))
    n = -(-length // c)
    return -(-length // n)


def token_stats(hidden: jax.Array, unembed: jax.Array, tokens: jax.Array, scfg, *,
                grammar=None, states: Optional[jax.Array] = None, chunk: int = 0,
                with_entropy: bool = False, entropy_grad: bool = False):
    """Sampled-token log-probs (and entropy) of the sampling distribution, in sequence chunks.

    hidden [B, R, H] (final-normed), unembed [H, V], tokens [B, R] int32; grammar + states
    [B, R] int32: the FSM whose `allowed[states[b, t]]` masks step t. Returns (logprobs
    [B, R] float32, entropy [B, R] float32 or None).

    A `lax.scan` over chunks of `chunk` positions (`resolve_chunk`) projects each chunk to the
    vocabulary, rebuilds its grammar masks from the FSM table and reduces to [B, chunk]; the
    body is rematerialised (`jax.checkpoint`), so neither pass keeps more than one
    [B, chunk, V] block alive. Same values as `sampling.token_logprobs` on the full logits.
    Entropy is differentiable only with entropy_grad=True.
    """
    b, r, _ = hidden.shape
    v = unembed.shape[-1]
    if (grammar is None) != (states is None):
        raise ValueError("token_stats needs both grammar and states, or neither")
    c = resolve_chunk(chunk, b, r, v)
    n = -(-r // c)
    pad = n * c - r

    def split(x):  # [B, R, ...] -> [n, B, c, ...]
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return jnp.moveaxis(x.reshape((b, n, c) + x.shape[2:]), 1, 0)

    xs = {"h": split(hidden), "tok": split(tokens.astype(jnp.int32))}
    if states is not None:
        xs["state"] = split(states.astype(jnp.int32))
    table = None if grammar is None else grammar.allowed

    def body(w, table, x):
        logits = jnp.matmul(x["h"], w.astype(x["h"].dtype), preferred_element_type=jnp.float32)
        allowed = None if table is None else table[x["state"]]
        lp_all = sampling_lib.log_probs(logits, scfg, allowed)
        lp = jnp.take_along_axis(lp_all, x["tok"][..., None], axis=-1)[..., 0]
        ent = None
        if with_entropy:
            e = lp_all if entropy_grad else jax.lax.stop_gradient(lp_all)
            ent = -jnp.sum(jnp.exp(e) * e, axis=-1)
        return lp, ent

    step = jax.checkpoint(body, prevent_cse=False)
    _, (lp, ent) = jax.lax.scan(lambda carry, x: (carry, step(unembed, table, x)), None, xs)

    def join(y):  # [n, B, c] -> [B, R]
        return jnp.moveaxis(y, 0, 1).reshape(b, n * c)[:, :r]

    return join(lp), None if ent is None else join(ent)


def recompute_logprobs(model, prompt_ids: Array, prompt_mask: Array, response_ids: Array,
                       response_mask: Array, config: sampling_lib.SamplingConfig,
                       grammar: Optional[grammar_lib.Grammar] = None, chunk: int = 0) -> Array:
    """Re-score responses with one full forward: [B, N] float32 (0 where response_mask is 0).

    Log-probs under the sampling distribution `config`, with the grammar masks replayed from
    the response tokens (`grammar.step_states`). Differentiable in the model's parameters:
    this is the computation behind the PPO log-prob (`rl.policy.evaluate`). chunk: response
    positions per log-prob chunk (0 = auto, `resolve_chunk`).
    """
    chex.assert_rank([prompt_ids, response_ids], 2)
    chex.assert_equal_shape([prompt_ids, prompt_mask])
    chex.assert_equal_shape([response_ids, response_mask])
    p, n = prompt_ids.shape[1], response_ids.shape[1]
    if p < 1:
        raise ValueError("the prompt must have at least one slot (the token before the response)")
    ids = jnp.concatenate([prompt_ids, response_ids], axis=1).astype(jnp.int32)
    mask = jnp.concatenate([prompt_mask.astype(bool), response_mask.astype(bool)], axis=1)
    hidden, w = response_hidden(model, ids, mask, p, n)
    states = None
    if grammar is not None:
        states = grammar_lib.step_states(grammar, response_ids, response_mask)
    lp, _ = token_stats(hidden, w, response_ids, config, grammar=grammar, states=states,
                        chunk=chunk)
    return jnp.where(response_mask.astype(bool), lp, 0.0)
