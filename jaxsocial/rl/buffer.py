"""The trajectory batch that a rollout hands to the PPO / GRPO update.

One row = one prompt and one sampled response. Prompts are left-padded, responses are
right-padded (a response ends at its first stop token; later slots are masked out).
"""
from __future__ import annotations

from typing import Optional

import chex
import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Trajectory:
    """A batch of B rollouts with P prompt slots and R response slots.

    prompt_tokens    [B, P] int32   left-padded prompt ids
    prompt_mask      [B, P] bool    1 on real prompt tokens
    response_tokens  [B, R] int32   sampled ids, right-padded
    response_mask    [B, R] bool    1 on valid response tokens (up to and incl. the stop token)
    old_logprobs     [B, R] float32 log pi_old(token) under the *sampling* distribution
    ref_logprobs     [B, R] float32 log pi_ref(token), same temperature / masks
    values           [B, R] float32 V(state before token t) from the rollout critic (0 for GRPO)
    scores           [B]    float32 episode score (e.g. the post's social reward)
    fsm_states       [B, R] int32 or None: grammar FSM state before each response token (None =
                     no grammar). The step's allowed set is `grammar.allowed[fsm_states]`,
                     rebuilt per chunk inside the loss from the grammar tables (passed to the
                     update as an argument), so no [B, R, V] mask is ever stored.
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    response_tokens: jax.Array
    response_mask: jax.Array
    old_logprobs: jax.Array
    ref_logprobs: jax.Array
    values: jax.Array
    scores: jax.Array
    fsm_states: Optional[jax.Array] = None

    @property
    def batch_size(self) -> int:
        return self.response_tokens.shape[0]

    @property
    def prompt_len(self) -> int:
        return self.prompt_tokens.shape[1]

    @property
    def response_len(self) -> int:
        return self.response_tokens.shape[1]


def make_trajectory(prompt_tokens, prompt_mask, response_tokens, response_mask, *,
                    scores, old_logprobs=None, ref_logprobs=None, values=None,
                    fsm_states=None) -> Trajectory:
    """Build a Trajectory with explicit dtypes (ids int32, masks bool, floats float32).

    Missing log-probs / values default to zeros [B, R] (fill them with `policy.score_batch`).
    fsm_states [B, R] int32: `generation.grammar.step_states(grammar, response, mask)`.
    Raises ValueError naming the offending field on a shape mismatch.
    """
    prompt_tokens = jnp.asarray(prompt_tokens, jnp.int32)
    response_tokens = jnp.asarray(response_tokens, jnp.int32)
    if prompt_tokens.ndim != 2 or response_tokens.ndim != 2:
        raise ValueError(f"prompt_tokens and response_tokens must be [B, T]; got "
                         f"{prompt_tokens.shape} and {response_tokens.shape}")
    b, p = prompt_tokens.shape
    r = response_tokens.shape[1]
    if response_tokens.shape[0] != b:
        raise ValueError(f"response_tokens batch {response_tokens.shape[0]} != prompt batch {b}")
    zeros = jnp.zeros((b, r), jnp.float32)

    def cast(name, x, shape, dtype):
        x = jnp.asarray(x, dtype)
        if x.shape != shape:
            raise ValueError(f"{name} has shape {x.shape}, expected {shape}")
        return x

    return Trajectory(
        prompt_tokens=prompt_tokens,
        prompt_mask=cast("prompt_mask", prompt_mask, (b, p), bool),
        response_tokens=response_tokens,
        response_mask=cast("response_mask", response_mask, (b, r), bool),
        old_logprobs=cast("old_logprobs", zeros if old_logprobs is None else old_logprobs,
                          (b, r), jnp.float32),
        ref_logprobs=cast("ref_logprobs", zeros if ref_logprobs is None else ref_logprobs,
                          (b, r), jnp.float32),
        values=cast("values", zeros if values is None else values, (b, r), jnp.float32),
        scores=cast("scores", scores, (b,), jnp.float32),
        fsm_states=None if fsm_states is None else cast("fsm_states", fsm_states, (b, r),
                                                        jnp.int32),
    )


def check_trajectory(batch: Trajectory) -> None:
    """chex boundary checks: shapes agree and floats are float32."""
    b, r = batch.response_tokens.shape
    chex.assert_shape([batch.response_mask, batch.old_logprobs, batch.ref_logprobs,
                       batch.values], (b, r))
    chex.assert_shape(batch.scores, (b,))
    chex.assert_equal_shape([batch.prompt_tokens, batch.prompt_mask])
    chex.assert_type([batch.old_logprobs, batch.ref_logprobs, batch.values, batch.scores],
                     jnp.float32)
    chex.assert_type([batch.prompt_tokens, batch.response_tokens], jnp.int32)
    if batch.fsm_states is not None:
        chex.assert_shape(batch.fsm_states, (b, r))
        chex.assert_type(batch.fsm_states, jnp.int32)
