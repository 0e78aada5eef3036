"""One chat engine: a loaded model and its tokenizer answering prompts through
`jaxsocial.generation`.

The tournament's LLM agents (`envs.llm_agent.LLMAgent`), skill evolution (`envs.skill_llm.SkillLLM`)
and the lm-eval adapter (`eval.lm_eval_model.JaxSocialLM`) all hold a `ChatModel` and keep only
what is their own (prompts, grammars, parsers; lm-eval's request interface). It owns:

- loading: `ChatModel.load(checkpoint_or_preset)` is the one loader (`models.load`): a
  checkpoint path or a preset ('tiny': random init with the committed tiny tokenizer);
- the token ids: `stop_ids` (`loading.stop_token_ids`: tokenizer eos + the chat template's
  end-of-turn + the config's eos ids), `eot` (what a grammar ends an answer with) and `pad`
  (the left padding of `encode`), both by `loading.chat_token_ids`'s rule;
- `encode`: chat-templated conversations (generation prompt added) -> left-padded ids + mask;
- `generate`: the batched engine (`generation.generate_from_state`) on the model as split once
  at construction (the prompt is bucketed to a multiple of `prompt_bucket` there);
- `complete`: encode + generate + decode, with per-row caps and an optional power-of-two batch;
- `decode`: ids -> text, special tokens skipped.

Shapes: B rows, L longest templated prompt, N = max_new_tokens.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional, Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxsocial import generation
from jaxsocial.generation import grammar as grammar_lib
from jaxsocial.generation.sampling import SamplingConfig
from jaxsocial.models import llama, loading


def messages(user: str, system: str = "") -> list:
    """One conversation: the system message (left out when empty), then the user message."""
    return ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user}]


class Completion(NamedTuple):
    """What `ChatModel.complete` returns for B rows."""

    texts: list  # [B] str: tokens[b, :lengths[b]] decoded, special tokens skipped
    tokens: np.ndarray  # [B, N] int32 generated ids (the pad id after a row stopped)
    lengths: np.ndarray  # [B] int32 tokens kept (stop token included; at most the row's cap)
    stopped: np.ndarray  # [B] bool: the last kept token is a stop id


class ChatModel:
    """A causal LM and its tokenizer as a chat engine (see the module docstring).

    model: a `llama.Llama`; tokenizer: its HF tokenizer; stop_ids: generation's stop ids
    (default `loading.stop_token_ids(tokenizer, model.config)`, what `models.load` returns).
    The model is split (`nnx.split`) once here: `generate` runs the weights it has now.
    """

    def __init__(self, model: llama.Llama, tokenizer: Any,
                 stop_ids: Optional[Sequence[int]] = None):
        self.model, self.tokenizer = model, tokenizer
        self.stop_ids = (loading.stop_token_ids(tokenizer, model.config) if stop_ids is None
                         else tuple(int(i) for i in stop_ids))
        self.graphdef, self.state = nnx.split(model)

    @classmethod
    def load(cls, checkpoint_or_preset: str, dtype: Any = None, *, tokenizer: Any = None,
             **kwargs) -> "ChatModel":
        """`models.load(checkpoint_or_preset, dtype, tokenizer=..., **kwargs)` as a ChatModel:
        a checkpoint path (HF directory or GGUF) or a `llama.PRESETS` name (random init, the
        tiny tokenizer unless `tokenizer` is given). Raises ValueError naming a bad value."""
        model, tok, stop_ids = loading.load(checkpoint_or_preset, dtype, tokenizer=tokenizer,
                                            **kwargs)
        return cls(model, tok, stop_ids)

    # -- token ids ---------------------------------------------------------------------------
    @functools.cached_property
    def _chat_ids(self) -> tuple:
        # (eot, pad), computed on first use: an lm-eval model without a chat template and
        # without an eos token never needs them
        _, eot, pad = loading.chat_token_ids(self.tokenizer, self.model.config)
        return eot, pad

    @property
    def eot(self) -> int:
        """The chat template's end-of-turn id (the eos id without one): a grammar's answer end."""
        return self._chat_ids[0]

    @property
    def pad(self) -> int:
        """The left padding id of `encode`: the tokenizer's pad id, else the config's, else 0."""
        return self._chat_ids[1]

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    def token_ids(self, text: str) -> list:
        """`text`'s ids as the tokenizer encodes it, no special tokens added."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def grammar(self, alternatives) -> grammar_lib.Grammar:
        """`grammar.compile_grammar(alternatives)` over the model's vocabulary, every answer
        closed by the end-of-turn token (`eot`)."""
        return grammar_lib.compile_grammar(alternatives, self.vocab_size,
                                           end_token_ids=[self.eot])

    # -- encode / generate / decode ----------------------------------------------------------
    def encode(self, conversations: Sequence[Sequence[dict]]) -> tuple:
        """B conversations (lists of {"role", "content"} messages; see `messages`) ->
        chat-templated with the generation prompt, left-padded with `pad` to the longest:
        (ids [B, L] int32, mask [B, L] int32, 1 = token)."""
        return loading.encode_chats(self.tokenizer, conversations, self.pad)

    def sampling(self, max_new_tokens: int, extra_stop_ids: Sequence[int] = (),
                 **kwargs) -> SamplingConfig:
        """SamplingConfig(max_new_tokens, **kwargs) stopping on `stop_ids` plus
        `extra_stop_ids` (sorted); the other fields keep SamplingConfig's defaults."""
        stops = tuple(sorted(set(self.stop_ids) | {int(i) for i in extra_stop_ids}))
        return SamplingConfig(max_new_tokens=int(max_new_tokens), stop_token_ids=stops,
                              **kwargs)

    def generate(self, ids, mask, key, config: SamplingConfig,
                 grammar: Optional[grammar_lib.Grammar] = None,
                 return_hidden: bool = False) -> generation.GenerationOutput:
        """The batched engine on left-padded ids [B, T] / mask [B, T] (1 = token): tokens,
        logprobs, mask [B, N], lengths [B] (`generation.generate`; same key -> same tokens)."""
        return generation.generate_from_state(self.graphdef, self.state, jnp.asarray(ids),
                                              jnp.asarray(mask), key, config, grammar,
                                              return_hidden)

    def decode(self, ids) -> str:
        """Token ids -> text, special tokens skipped."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def complete(self, conversations: Sequence[Sequence[dict]], key, max_new_tokens: int, *,
                 caps: Optional[Sequence[int]] = None, grammar=None, pad_batch: bool = False,
                 **sampling) -> Completion:
        """Answer B conversations in one batched call.

        key: the call's jax.random key; max_new_tokens: N, the decode length; caps: [B] per-row
        limits <= N (default N): a row keeps its first min(length, cap) tokens, the text a call
        with that cap would give, since decoding is causal; grammar: a token FSM over the
        vocabulary (`grammar`); pad_batch: pad the batch up to a power of two with copies of
        row 0 (dropped from the result) so few batch sizes compile; sampling: SamplingConfig
        fields (temperature, top_p, top_k, prompt_bucket, ...; see `sampling`).
        Returns `Completion` (texts [B], tokens [B, N], lengths [B], stopped [B]).
        """
        rows = list(conversations)
        b = len(rows)
        if not b:
            raise ValueError("complete needs at least one conversation")
        if pad_batch:
            rows += [rows[0]] * ((1 << (b - 1).bit_length()) - b)
        config = self.sampling(max_new_tokens, **sampling)
        ids, mask = self.encode(rows)
        out = self.generate(ids, mask, key, config, grammar)
        tokens, lengths = np.asarray(out.tokens)[:b], np.asarray(out.lengths)[:b]
        if caps is not None:
            lengths = np.minimum(lengths, np.asarray(caps, np.int64))
        lengths = lengths.astype(np.int32)
        texts = [self.decode(tokens[r, :lengths[r]]) for r in range(b)]
        stops = set(config.stop_token_ids)
        stopped = np.array([bool(lengths[r] > 0 and tokens[r, lengths[r] - 1] in stops)
                            for r in range(b)], bool)
        return Completion(texts, tokens, lengths, stopped)
