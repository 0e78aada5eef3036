"""The sampling distribution: grammar mask, temperature, top-k, top-p; and its log-probs.

`sampling_logits` defines the distribution a token is drawn from; `sample` draws from it and
`token_logprobs` scores given tokens under it. The generator and the PPO update both call these
functions, so a freshly generated batch has a PPO ratio of exactly 1.

Excluded tokens get a large finite negative logit (not -inf) so gradients stay finite when a
token falls outside the kept set of an updated policy.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import jax
import jax.numpy as jnp

Array = jax.Array

NEG_INF = -1e30
MAX_PREFILL_CHUNKS = 8  # forwards per prefill (each one a copy of the model in the program)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How to decode. Hashable: it is a static argument of the compiled generate step.

    max_new_tokens: response length N (the output arrays are [B, N]).
    temperature: 0.0 means greedy (argmax); log-probs are then reported at temperature 1.
    top_k: keep the k most likely tokens (0 = off). top_p: nucleus mass (1.0 = off).
    stop_token_ids: a row stops after emitting any of these (the stop token is kept, masked 1).
    prompt_bucket: prompts are left-padded up to a multiple of this (power of two if 0).
    prefill_chunk: the prompt runs through the model in chunks of this many tokens, each
      attending only to the cache slots filled so far (causal blocks are skipped, and the
      attention scores are [B, heads, chunk, filled], not [B, heads, P, S]); at most
      `MAX_PREFILL_CHUNKS` chunks per prompt (longer prompts use longer chunks); 0 = the whole
      prompt in one forward.
    prompt_group: > 1: the rows come in contiguous groups of this many sharing one prompt
      (GRPO's samples per prompt): the prefill runs once per group and its cache is repeated
      for the group's rows, which then sample independently (generate checks the groups on
      concrete inputs; under an outer jit each group gets its first row's prompt). 0 or 1:
      every row its own.
    decode_buckets: the decode runs in this many segments of about N / decode_buckets steps,
      each with a cache just long enough for it (P + the tokens written by its last step),
      grown between segments: a step attends to at most one segment of empty slots instead of
      all N decode slots, at the cost of one cache copy per segment and one copy of the decode
      loop per segment in the program. 1 = one loop over a P + N slot cache.
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    stop_token_ids: Tuple[int, ...] = ()
    prompt_bucket: int = 64
    prefill_chunk: int = 64
    prompt_group: int = 0
    decode_buckets: int = 1

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.prompt_bucket < 0:
            raise ValueError(f"prompt_bucket must be >= 0, got {self.prompt_bucket}")
        if self.prefill_chunk < 0:
            raise ValueError(f"prefill_chunk must be >= 0, got {self.prefill_chunk}")
        if self.prompt_group < 0:
            raise ValueError(f"prompt_group must be >= 0, got {self.prompt_group}")
        if not 1 <= self.decode_buckets <= self.max_new_tokens:
            raise ValueError(f"decode_buckets must be in [1, max_new_tokens="
                             f"{self.max_new_tokens}], got {self.decode_buckets}")
        stops = self.stop_token_ids
        if isinstance(stops, int):
            stops = (stops,)
        object.__setattr__(self, "stop_token_ids", tuple(int(s) for s in stops))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def prefill_chunks(self, prompt_len: int) -> Tuple[Tuple[int, int], ...]:
        """The [start, end) token ranges the prefill of a `prompt_len`-token (bucketed) prompt
        runs in: `prefill_chunk` tokens each, longer if that would take more than
        `MAX_PREFILL_CHUNKS` forwards (each chunk is its own copy of the model in the program)."""
        if self.prefill_chunk == 0 or self.prefill_chunk >= prompt_len:
            return ((0, prompt_len),)
        size = max(self.prefill_chunk, -(-prompt_len // MAX_PREFILL_CHUNKS))
        return tuple((s, min(s + size, prompt_len)) for s in range(0, prompt_len, size))

    def decode_segments(self) -> Tuple[int, ...]:
        """The decode steps at which each segment ends (`decode_buckets` near-equal segments of
        the `max_new_tokens` steps; the last ends at N). Segment j's cache holds P + its end."""
        n, m = self.max_new_tokens, self.decode_buckets
        return tuple(-(-n * (j + 1) // m) for j in range(m))


def sampling_logits(logits: Array, config: SamplingConfig,
                    allowed: Optional[Array] = None) -> Array:
    """logits [..., V] -> float32 logits whose softmax is the sampling distribution.

    Order: grammar mask (`allowed [..., V]` bool) -> divide by temperature -> top-k -> top-p.
    """
    x = logits.astype(jnp.float32)
    if allowed is not None:
        x = jnp.where(allowed, x, NEG_INF)
    if not config.greedy:
        x = x / config.temperature
    vocab = x.shape[-1]
    top = None
    if 0 < config.top_k < vocab:
        top = jax.lax.top_k(x, config.top_k)[0]  # [..., k] descending
        x = jnp.where(x >= top[..., -1:], x, NEG_INF)
    if config.top_p < 1.0:
        # Keep the smallest descending prefix whose mass reaches top_p: an entry is kept while
        # the mass before it is still < top_p (the first token is always kept). With top-k on,
        # the nucleus lies inside the k candidates (the rest have zero mass): no full-vocab sort.
        ranked = top if top is not None else jnp.sort(x, axis=-1)[..., ::-1]
        x = jnp.where(x >= _nucleus(ranked, config.top_p), x, NEG_INF)
    return x


def log_probs(logits: Array, config: SamplingConfig, allowed: Optional[Array] = None) -> Array:
    """Log of the sampling distribution [..., V] float32."""
    return jax.nn.log_softmax(sampling_logits(logits, config, allowed), axis=-1)


def token_logprobs(logits: Array, tokens: Array, config: SamplingConfig,
                   allowed: Optional[Array] = None) -> Array:
    """Log-prob of `tokens [B, T]` under the sampling distribution of `logits [B, T, V]`.

    Returns [B, T] float32. `allowed [B, T, V]` is the grammar mask in force at each step.
    """
    lp = log_probs(logits, config, allowed)
    return jnp.take_along_axis(lp, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _nucleus(sorted_x: Array, top_p: float) -> Array:
    """Smallest kept logit [..., 1] of the top-p nucleus of descending-sorted logits [..., K]."""
    probs = jax.nn.softmax(sorted_x, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = mass_before < top_p
    return jnp.min(jnp.where(keep, sorted_x, jnp.inf), axis=-1, keepdims=True)


def sample(key: Array, logits: Array, config: SamplingConfig,
           allowed: Optional[Array] = None) -> Tuple[Array, Array]:
    """Draw one token per row. logits [B, V] -> (tokens [B] int32, logprobs [B] float32).

    The log-prob is that of `token_logprobs` (same distribution). With top_k on, the draw and
    the normaliser only touch the k candidates from `lax.top_k` (then top-p on those), which is
    the same distribution without sorting or drawing noise over the whole vocabulary; ties at
    the k-th logit (kept by `sampling_logits`, measure zero for real logits) are the exception.
    """
    x = logits.astype(jnp.float32)
    if allowed is not None:
        x = jnp.where(allowed, x, NEG_INF)
    if config.greedy:
        z = sampling_logits(logits, config, allowed)
        tokens = jnp.argmax(z, axis=-1).astype(jnp.int32)
        lp = jax.nn.log_softmax(z, axis=-1)
        return tokens, jnp.take_along_axis(lp, tokens[:, None], axis=-1)[:, 0]
    x = x / config.temperature
    if 0 < config.top_k < x.shape[-1]:
        vals, idx = jax.lax.top_k(x, config.top_k)   # descending
        if config.top_p < 1.0:
            vals = jnp.where(vals >= _nucleus(vals, config.top_p), vals, NEG_INF)
        choice = jax.random.categorical(key, vals, axis=-1)
        tokens = jnp.take_along_axis(idx, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)
        lp = jax.nn.log_softmax(vals, axis=-1)
        return tokens, jnp.take_along_axis(lp, choice[:, None], axis=-1)[:, 0]
    z = sampling_logits(logits, config, allowed)
    lp = jax.nn.log_softmax(z, axis=-1)
    tokens = _inverse_cdf(key, lp)
    return tokens, jnp.take_along_axis(lp, tokens[:, None], axis=-1)[:, 0]


def _inverse_cdf(key: Array, lp: Array) -> Array:
    """One draw per row from log-probs lp [B, V] with one uniform per row (inverse CDF), not
    V Gumbel draws (`jax.random.categorical`, measured slower on XLA:CPU at large V;
    `benchmarks/decode_profile.py --top_k 0 --top_p 1` times this draw in its `sampling`
    column). The token is the first index whose cumulative probability exceeds u * total, so a
    zero-probability token is never drawn (its cumulative sum equals its predecessor's) and
    float32 rounding of the total cannot push u past the last token."""
    c = jnp.cumsum(jnp.exp(lp), axis=-1)
    u = jax.random.uniform(key, (lp.shape[0], 1)) * c[:, -1:]
    return jnp.minimum(jnp.sum(c <= u, axis=-1), lp.shape[-1] - 1).astype(jnp.int32)
