"""Batched generation: one jitted prefill, then a jitted `lax.while_loop` decode.

Shapes: B batch, P prompt bucket, N = max_new_tokens, S = P + N cache slots, V vocab, H hidden.

    generate(model, input_ids [B, T], attention_mask [B, T], key, config, grammar=None)
      1. left-pad the prompt to P = bucket(T) (so calls with nearby lengths share programs);
      2. prefill (jit): allocate the KV cache [L, B, S, K, D] once, in the compute dtype, run the
         prompt through it in chunks (`SamplingConfig.prefill_chunk`; each chunk attends to
         the slots filled so far only), return (cache, logits of the last prompt slot [B, V]);
         with `SamplingConfig.prompt_group` g > 1, only every g-th row is prefilled and its
         cache and logits are repeated for its group;
      3. decode (jit, cache donated): while t < N and some row is live: mask logits with the
         grammar state, draw token t from `sampling.sample(fold_in(key, t), ...)`, advance the
         FSM, stop rows that emitted a stop id (or reached a grammar state allowing nothing),
         write the token into the cache and compute the next logits. With
         `SamplingConfig.decode_buckets` m > 1 the loop runs in m segments: the prefill
         allocates P + the first segment's steps, and the cache grows (one copy) before each
         later segment, so the attention reads at most one segment of empty slots.

After a row stops its tokens are `pad_token_id`, its mask is False and its log-probs 0. The
log-probs are those of the sampling distribution (`sampling.token_logprobs`), so
`scoring.recompute_logprobs` (one full forward over prompt + response with the same grammar
masks, the path training uses) reproduces them: the PPO ratio of a fresh batch is 1.

Compiled programs are held by a `ProgramCache` (`PROGRAMS`, the process's own), keyed by
(graphdef, prompt bucket, batch, config, return_hidden, grammar or not, step_hidden); its
`trace_counts` count traces so tests can prove a call did not recompile.
"""

from __future__ import annotations

import collections
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxsocial.generation import grammar as grammar_lib
from jaxsocial.generation import sampling
from jaxsocial.generation.sampling import SamplingConfig
from jaxsocial.models import llama

Array = jax.Array

@flax.struct.dataclass
class GenerationOutput:
    """tokens [B, N] int32 (pad after a stop); logprobs [B, N] float32 under the sampling
    distribution (0 where masked); mask [B, N] bool (stop token included); lengths [B] int32 =
    mask.sum(1); hidden [B, H] float32 final-normed hidden state of each response's last valid
    token (None unless return_hidden); step_hidden [B, N, H] float32 the final-normed hidden
    state whose logits sampled each token (0 where masked; None unless step_hidden): what a
    full forward over prompt + response gives at the response positions, so a value head
    needs no second forward."""

    tokens: Array
    logprobs: Array
    mask: Array
    lengths: Array
    hidden: Optional[Array] = None
    step_hidden: Optional[Array] = None


def bucket_length(length: int, bucket: int) -> int:
    """Prompt bucket: round up to a multiple of `bucket`, or to a power of two if bucket == 0."""
    length = max(int(length), 1)
    if bucket > 0:
        return -(-length // bucket) * bucket
    return 1 << (length - 1).bit_length()


def _pad_id(cfg: llama.LlamaConfig) -> int:
    return 0 if cfg.pad_token_id is None else int(cfg.pad_token_id)


class ProgramCache:
    """The jitted (prefill, decode) programs of `generate`, and each graphdef's LlamaConfig.

    `get(graphdef, bucket, batch, config, return_hidden, has_grammar, step_hidden=False)
    -> (prefill, decode)`
    builds a pair once per key; `trace_counts` ("prefill", "decode") grow at trace time only;
    `config_of(graphdef, state)` merges a split model once to read its config; `clear()` drops
    the programs (e.g. after changing the model architecture).
    """

    def __init__(self):
        self.compiled: dict = {}
        self.configs: dict = {}
        self.trace_counts: collections.Counter = collections.Counter()

    def get(self, graphdef, bucket: int, batch: int, config: SamplingConfig,
            return_hidden: bool, has_grammar: bool, step_hidden: bool = False):
        key = (graphdef, bucket, batch, config, return_hidden, has_grammar, step_hidden)
        if key not in self.compiled:
            self.compiled[key] = _build(graphdef, bucket, config, return_hidden, has_grammar,
                                        self.trace_counts, step_hidden)
        return self.compiled[key]

    def config_of(self, graphdef, state) -> llama.LlamaConfig:
        if graphdef not in self.configs:
            self.configs[graphdef] = nnx.merge(graphdef, state).config
        return self.configs[graphdef]

    def clear(self) -> None:
        self.compiled.clear()


PROGRAMS = ProgramCache()


def _build(graphdef, bucket: int, config: SamplingConfig, return_hidden: bool,
           has_grammar: bool, trace_counts: collections.Counter, step_hidden: bool = False):
    """The (prefill, decode) pair. With step_hidden, prefill's logits come paired with the
    hidden state that made them ((logits, hidden) [B, V], [B, H]) and decode records it per
    step (GenerationOutput.step_hidden)."""
    n = config.max_new_tokens
    # numpy, not jnp: no tracer when this is built inside a trace
    stops = np.asarray(config.stop_token_ids or (-1,), np.int32)
    segments = config.decode_segments()

    def prefill(state, input_ids, attention_mask):
        trace_counts["prefill"] += 1
        model = nnx.merge(graphdef, state)
        cfg = model.config
        g = max(config.prompt_group, 1)
        if g > 1:  # one prefill per group of rows sharing a prompt (checked in _validate)
            input_ids, attention_mask = input_ids[::g], attention_mask[::g]
        cache = llama.init_cache(cfg, input_ids.shape[0], bucket + segments[0])
        for start, end in config.prefill_chunks(bucket):
            # Each chunk attends to the slots filled so far only (kv_limit): no work on the
            # causally masked blocks, and scores of [B, heads, chunk, end], not [.., P, S].
            out = model.forward(input_ids[:, start:end], attention_mask[:, start:end],
                                cache=cache, kv_limit=end)
            cache = out.cache
        # Only the last slot's logits are needed; out.logits ([B, chunk, V]) is dead code.
        last = out.hidden[:, -1]
        logits = model.unembed(last)
        if step_hidden:
            logits = (logits, last.astype(jnp.float32))
        if g > 1:
            rows = lambda x: jnp.repeat(x, g, axis=0)  # noqa: E731
            cache, logits = cache.map_rows(rows), jax.tree.map(rows, logits)
        return cache, logits

    def decode(state, cache, logits, key, grammar):
        trace_counts["decode"] += 1
        model = nnx.merge(graphdef, state)
        cfg = model.config
        logits, h0 = logits if step_hidden else (logits, None)
        b, v = logits.shape
        pad = _pad_id(cfg)

        def no_moves(fsm):
            return ~grammar.allowed[fsm].any(axis=-1)

        fsm0 = jnp.full((b,), grammar.start if has_grammar else 0, jnp.int32)
        carry = dict(
            t=jnp.zeros((), jnp.int32), cache=cache, logits=logits, fsm=fsm0,
            done=no_moves(fsm0) if has_grammar else jnp.zeros((b,), bool),
            tokens=jnp.full((b, n), pad, jnp.int32), logprobs=jnp.zeros((b, n), jnp.float32),
            mask=jnp.zeros((b, n), bool),
            hidden=jnp.zeros((b, cfg.hidden_size), jnp.float32))
        if step_hidden:
            carry.update(h=h0, step_hidden=jnp.zeros((b, n, cfg.hidden_size), jnp.float32))

        def cond(end):
            return lambda c: (c["t"] < end) & ~jnp.all(c["done"])

        def body(c):
            t = c["t"]
            allowed = grammar.allowed[c["fsm"]] if has_grammar else None
            tok, lp = sampling.sample(jax.random.fold_in(key, t), c["logits"], config, allowed)
            live = ~c["done"]
            tok = jnp.where(live, tok, pad)
            lp = jnp.where(live, lp, 0.0)
            done = c["done"] | (live & jnp.isin(tok, stops))
            fsm = c["fsm"]
            if has_grammar:
                fsm = grammar_lib.advance(grammar, fsm, tok, live)
                done = done | no_moves(fsm)
            out = model.forward(tok[:, None], live[:, None], cache=c["cache"])
            hidden = c["hidden"]
            if return_hidden:
                hidden = jnp.where(live[:, None], out.hidden[:, 0].astype(jnp.float32), hidden)
            steps = {}
            if step_hidden:  # token t was sampled from the logits of c["h"]
                steps = dict(h=out.hidden[:, 0].astype(jnp.float32),
                             step_hidden=jax.lax.dynamic_update_slice(
                                 c["step_hidden"], jnp.where(live[:, None], c["h"], 0.0)[:, None],
                                 (0, t, 0)))
            return dict(**steps,
                t=t + 1, cache=out.cache, logits=out.logits[:, 0], fsm=fsm, done=done,
                tokens=jax.lax.dynamic_update_slice(c["tokens"], tok[:, None], (0, t)),
                logprobs=jax.lax.dynamic_update_slice(c["logprobs"], lp[:, None], (0, t)),
                mask=jax.lax.dynamic_update_slice(c["mask"], live[:, None], (0, t)),
                hidden=hidden)

        c = carry
        for end in segments:
            # Segment by segment, the cache holds P + `end` slots: the attention of its steps
            # reads at most one segment of empty slots (grown once per segment, not sliced
            # per step: a slice is a copy on every step).
            c = dict(c, cache=c["cache"].grow(bucket + end))
            c = jax.lax.while_loop(cond(end), body, c)
        # The cache is returned (and dropped by the caller) so the donated input buffer aliases
        # it: the loop updates the prefill's allocation in place instead of copying it.
        out = GenerationOutput(tokens=c["tokens"], logprobs=c["logprobs"], mask=c["mask"],
                               lengths=c["mask"].sum(axis=1, dtype=jnp.int32),
                               hidden=c["hidden"] if return_hidden else None,
                               step_hidden=c["step_hidden"] if step_hidden else None)
        return c["cache"], out

    # With more than one segment no output has the donated cache's shape (grown in the
    # program), so there is nothing to donate to.
    return jax.jit(prefill), jax.jit(decode, donate_argnums=(1,) if len(segments) == 1 else ())


def _validate(cfg: llama.LlamaConfig, input_ids, attention_mask, config, grammar) -> None:
    if not isinstance(config, SamplingConfig):
        raise ValueError(f"config must be a SamplingConfig, got {type(config).__name__}")
    if getattr(input_ids, "ndim", None) != 2:
        raise ValueError(f"input_ids must be [batch, seq], got shape {np.shape(input_ids)}")
    if np.shape(attention_mask) != np.shape(input_ids):
        raise ValueError(f"attention_mask shape {np.shape(attention_mask)} != input_ids shape "
                         f"{np.shape(input_ids)}")
    if not jnp.issubdtype(input_ids.dtype, jnp.integer):
        raise ValueError(f"input_ids must be integer token ids, got {input_ids.dtype}")
    for s in config.stop_token_ids:
        if not 0 <= s < cfg.vocab_size:
            raise ValueError(f"stop token id {s} is outside the vocabulary [0, {cfg.vocab_size})")
    if grammar is not None and grammar.vocab_size != cfg.vocab_size:
        raise ValueError(f"grammar vocab size {grammar.vocab_size} != model vocab size "
                         f"{cfg.vocab_size}")
    g = config.prompt_group
    if g > 1 and input_ids.shape[0] % g:
        raise ValueError(f"prompt_group {g} does not divide the batch of {input_ids.shape[0]} "
                         f"rows")
    if isinstance(attention_mask, jax.core.Tracer) or isinstance(input_ids, jax.core.Tracer):
        return
    mask = np.asarray(attention_mask).astype(bool)
    if g > 1:
        ids = np.where(mask, np.asarray(input_ids), 0)
        same = lambda x: (x.reshape((-1, g) + x.shape[1:]) == x[::g][:, None]).all(  # noqa: E731
            axis=tuple(range(1, x.ndim + 1)))
        bad = np.flatnonzero(~(same(ids) & same(mask)))
        if bad.size:
            raise ValueError(f"prompt_group {g}: the rows of group {int(bad[0])} (rows "
                             f"{int(bad[0]) * g}-{int(bad[0]) * g + g - 1}) do not share one "
                             f"prompt")
    empty = np.flatnonzero(~mask.any(axis=1))
    if empty.size:
        raise ValueError(f"prompt row {int(empty[0])} has no tokens (attention_mask all 0)")
    right = np.flatnonzero((np.diff(mask.astype(np.int8), axis=1) < 0).any(axis=1))
    if right.size:
        raise ValueError(f"prompt row {int(right[0])} is not left-padded (a 0 follows a 1 in "
                         f"attention_mask)")
    ids = np.asarray(input_ids)
    bad = (ids < 0) | (ids >= cfg.vocab_size)
    if (bad & mask).any():
        raise ValueError(f"token id {int(ids[bad & mask][0])} is outside the vocabulary "
                         f"[0, {cfg.vocab_size})")


def generate_from_state(graphdef, state, input_ids: Array, attention_mask: Array, key: Array,
                        config: SamplingConfig, grammar: Optional[grammar_lib.Grammar] = None,
                        return_hidden: bool = False, step_hidden: bool = False) -> GenerationOutput:
    """`generate` for a model already split with `nnx.split` (the training loop holds params)."""
    cfg = PROGRAMS.config_of(graphdef, state)
    _validate(cfg, input_ids, attention_mask, config, grammar)
    b, t = input_ids.shape
    bucket = bucket_length(t, config.prompt_bucket)
    ids = jnp.asarray(input_ids, jnp.int32)
    mask = jnp.asarray(attention_mask).astype(bool)
    if bucket > t:
        ids = jnp.pad(ids, ((0, 0), (bucket - t, 0)), constant_values=_pad_id(cfg))
        mask = jnp.pad(mask, ((0, 0), (bucket - t, 0)))
    prefill, decode = PROGRAMS.get(graphdef, bucket, b, config, return_hidden,
                                   grammar is not None, step_hidden)
    cache, logits = prefill(state, ids, mask)
    _, out = decode(state, cache, logits, key, grammar)
    return out


def generate(model: llama.Llama, input_ids: Array, attention_mask: Array, key: Array,
             config: SamplingConfig, grammar: Optional[grammar_lib.Grammar] = None,
             return_hidden: bool = False, step_hidden: bool = False) -> GenerationOutput:
    """Sample up to `config.max_new_tokens` tokens for each left-padded prompt.

    input_ids [B, T] int, attention_mask [B, T] (1 = token, 0 = left padding), key: a
    jax.random key (same key -> same tokens), grammar: optional token FSM
    (`jaxsocial.generation.grammar`). Returns GenerationOutput (tokens/logprobs/mask [B, N],
    lengths [B], hidden [B, H] if return_hidden, step_hidden [B, N, H] if step_hidden). See
    the module docstring for the algorithm.
    """
    if not isinstance(model, llama.Llama):
        raise ValueError(f"model must be a jaxsocial Llama, got {type(model).__name__}")
    graphdef, state = nnx.split(model)
    PROGRAMS.configs[graphdef] = model.config
    return generate_from_state(graphdef, state, input_ids, attention_mask, key, config,
                               grammar, return_hidden, step_hidden)
