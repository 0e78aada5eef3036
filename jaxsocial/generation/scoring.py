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
from jaxsocial.models import llama

Array = jax.Array


def response_hidden(model, ids: Array, mask: Array, p: int, r: int) -> tuple[Array, Array]:
    """model: an nnx Llama; ids, mask [B, P + R]. -> (final-normed hidden states [B, R, H] of
    positions P - 1 .. P + R - 2, the ones that predict response tokens 0 .. R - 1;
    unembedding matrix [H, V]).

    No logits here: the forward's full-length logits are unused (XLA drops them) and the LM
    head is applied chunk by chunk in `token_stats`.
    """
    hidden = jax.lax.slice_in_dim(model.forward(ids, mask).hidden, p - 1, p - 1 + r, axis=1)
    return hidden, model.unembedding()


def prompts_shared(prompt_ids: Array, prompt_mask: Array, group: int) -> Array:
    """True (bool scalar) when the rows [B, P] come in contiguous groups of `group` rows with
    one prompt each (same ids and mask). B must be a multiple of `group`."""
    b = prompt_ids.shape[0]

    def same(x):
        x = x.reshape((b // group, group) + x.shape[1:])
        return jnp.all(x == x[:, :1])

    return same(prompt_ids.astype(jnp.int32)) & same(prompt_mask.astype(bool))


def response_hidden_grouped(model, prompt_ids: Array, prompt_mask: Array,
                            response_ids: Array, response_mask: Array,
                            group: int) -> tuple[Array, Array]:
    """`response_hidden` for rows in contiguous groups of `group` that share one prompt.

    prompt_ids, prompt_mask [B, P] (left-padded; row i*group is the group's prompt, the others
    are assumed equal: check with `prompts_shared`); response_ids, response_mask [B, R].
    Returns (hidden [B, R, H] of positions P - 1 .. P + R - 2, unembedding [H, V]) — the same
    values as `response_hidden` on the concatenated rows, with the prompt's forward run once
    per group: the G = B / group prompts fill a KV cache ([G, P + R - 1] slots), each cache
    row is repeated `group` times, and the B responses (tokens 0 .. R - 2) run as one cached
    forward of R - 1 tokens. The repeat's transpose sums the group's cotangents, so the
    gradient is the full forward's too. Work: G * P + B * (R - 1) token-forwards instead of
    B * (P + R - 1).
    """
    b, p = prompt_ids.shape
    r = response_ids.shape[1]
    if b % group:
        raise ValueError(f"{b} rows are not a multiple of the prompt group {group}")
    cache = llama.init_cache(model.config, b // group, p + r - 1)
    pre = model.forward(prompt_ids[::group].astype(jnp.int32), prompt_mask[::group].astype(bool),
                        cache=cache)

    def rep(x):
        return jnp.repeat(x, group, axis=0)

    c = pre.cache
    hidden = rep(pre.hidden[:, p - 1:p])
    if r > 1:
        cache = c.map_rows(rep)
        out = model.forward(response_ids[:, :r - 1].astype(jnp.int32),
                            response_mask[:, :r - 1].astype(bool), cache=cache)
        hidden = jnp.concatenate([hidden, out.hidden], axis=1)
    return hidden, model.unembedding()


def response_hidden_auto(model, prompt_ids: Array, prompt_mask: Array, response_ids: Array,
                         response_mask: Array, group: int = 0) -> tuple[Array, Array]:
    """`response_hidden` of prompt + response rows ([B, P], [B, R]), through
    `response_hidden_grouped` when group > 1 divides B and the rows do share their prompts
    (a `lax.cond` on `prompts_shared`: a run-time check, so a batch whose groups differ takes
    the full forward and gets the same values). -> (hidden [B, R, H], unembedding [H, V])."""
    b, p = prompt_ids.shape
    r = response_ids.shape[1]
    ids = jnp.concatenate([prompt_ids, response_ids], axis=1).astype(jnp.int32)
    mask = jnp.concatenate([prompt_mask.astype(bool), response_mask.astype(bool)], axis=1)
    if group <= 1 or b % group:
        return response_hidden(model, ids, mask, p, r)
    return jax.lax.cond(
        prompts_shared(prompt_ids, prompt_mask, group),
        lambda: response_hidden_grouped(model, prompt_ids, prompt_mask, response_ids,
                                        response_mask, group),
        lambda: response_hidden(model, ids, mask, p, r))


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
        # log p(token) = z[token] - logsumexp(z): one exp pass, no [B, c, V] log-softmax
        # materialised (faster forward + backward than log_softmax + gather on XLA:CPU:
        # benchmarks/update_profile.py's head rows). The max is a constant for the gradient
        # (logsumexp does not depend on it).
        z = sampling_lib.sampling_logits(logits, scfg, allowed)
        m = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
        e = jnp.exp(z - m)
        total = jnp.sum(e, axis=-1, keepdims=True)
        log_z = (m + jnp.log(total))[..., 0]
        lp = jnp.take_along_axis(z, x["tok"][..., None], axis=-1)[..., 0] - log_z
        ent = None
        if with_entropy:
            # H = log Z - sum_v p_v z_v (excluded tokens: p = 0 at a finite z: no 0 * inf)
            pz = (e / total) * z
            if not entropy_grad:
                pz, lz = jax.lax.stop_gradient(pz), jax.lax.stop_gradient(log_z)
            else:
                lz = log_z
            ent = lz - jnp.sum(pz, axis=-1)
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
