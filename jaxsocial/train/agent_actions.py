"""What an LLM agent may answer, as token patterns: the grammar for constrained decoding and the
JAX parser that maps a response to a society action.

The agent's answer refers to its feed by position: "like 2" likes the second post shown,
"follow 2" follows that post's author, "comment 2: <text>" comments on it, "post: <text>"
creates a post, "nothing" does nothing. Each keyword, each " <k>" and ":" are tokenized once on
the host; a response is parsed by matching those token sequences at its start (longest match
wins), and the text after the matched prefix (up to the stop token) becomes the content.

Modes: `constrained` decodes under `grammar` (every response parses); `free` decodes without it
and the parser maps anything that does not start with an action prefix to MALFORMED (counted by
the society as an invalid action, never applied). Only the canonical tokenization of a prefix
parses; a free-running model that spells "like 2" with other token boundaries counts as
unparsable.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsocial.generation import grammar as grammar_lib
from jaxsocial.social.actions import ActionBatch, ActionType
from jaxsocial.social.state import EMPTY, PAD_TOKEN

Array = jax.Array

# keyword -> (society action, takes a feed position, takes text, target is the post's author)
ACTIONS: Dict[str, Tuple[ActionType, bool, bool, bool]] = {
    "post": (ActionType.CREATE_POST, False, True, False),
    "comment": (ActionType.CREATE_COMMENT, True, True, False),
    "quote": (ActionType.QUOTE_POST, True, True, False),
    "like": (ActionType.LIKE_POST, True, False, False),
    "dislike": (ActionType.DISLIKE_POST, True, False, False),
    "repost": (ActionType.REPOST, True, False, False),
    "follow": (ActionType.FOLLOW, True, False, True),
    "mute": (ActionType.MUTE, True, False, True),
    "nothing": (ActionType.DO_NOTHING, False, False, False),
}


@struct.dataclass
class ActionVocab:
    """Prefix table. prefixes [M, Lmax] int32 (right-padded with -1), prefix_len [M],
    action_type [M], feed_pos [M] (0-based, -1 = none), has_text [M] bool, to_author [M] bool."""

    prefixes: Array
    prefix_len: Array
    action_type: Array
    feed_pos: Array
    has_text: Array
    to_author: Array
    stop_ids: Tuple[int, ...] = struct.field(pytree_node=False, default=())

    @staticmethod
    def build(tokenizer, actions: Sequence[str], feed_size: int,
              stop_ids: Sequence[int]) -> "ActionVocab":
        unknown = [a for a in actions if a not in ACTIONS]
        if unknown:
            raise ValueError(f"unknown agent action {unknown[0]!r}; known: {sorted(ACTIONS)}")
        if not actions:
            raise ValueError("agents.actions is empty")
        enc = lambda s: list(tokenizer.encode(s, add_special_tokens=False))  # noqa: E731
        rows, meta = [], []
        for name in actions:
            kind, positional, text, author = ACTIONS[name]
            head = enc(name + ":") if (text and not positional) else enc(name)
            for k in (range(feed_size) if positional else [-1]):
                seq = head + (enc(f" {k + 1}") if positional else [])
                if text and positional:
                    seq = seq + enc(":")
                rows.append(seq)
                meta.append((int(kind), k, text, author))
        width = max(len(r) for r in rows)
        prefixes = np.full((len(rows), width), -1, np.int32)
        for i, r in enumerate(rows):
            prefixes[i, :len(r)] = r
        kinds, pos, text, author = map(np.asarray, zip(*meta))
        return ActionVocab(prefixes=jnp.asarray(prefixes),
                           prefix_len=jnp.asarray([len(r) for r in rows], jnp.int32),
                           action_type=jnp.asarray(kinds, jnp.int32),
                           feed_pos=jnp.asarray(pos, jnp.int32),
                           has_text=jnp.asarray(text, bool), to_author=jnp.asarray(author, bool),
                           stop_ids=tuple(int(s) for s in stop_ids))

    def grammar(self, vocab_size: int, max_text_tokens: int,
                exclude_from_text: Sequence[int]) -> grammar_lib.Grammar:
        """The constrained-decoding FSM: one alternative per prefix, text actions followed by
        1..max_text_tokens free tokens (minus specials), every answer closed by a stop token."""
        prefixes = np.asarray(self.prefixes)
        patterns = []
        for row, n, text in zip(prefixes, np.asarray(self.prefix_len), np.asarray(self.has_text)):
            pattern: List = [grammar_lib.Tokens(tuple(row[:n]))]
            if text:
                pattern.append(grammar_lib.free_text(max_text_tokens, exclude=exclude_from_text))
            patterns.append(pattern)
        return grammar_lib.compile_grammar(patterns, vocab_size, end_token_ids=self.stop_ids)


@struct.dataclass
class Parsed:
    """type [B] int32 ActionType (MALFORMED when nothing matched); feed_pos [B] (-1 = none);
    content [B, L] int32 (right-padded with PAD_TOKEN); parsed [B] bool."""

    type: Array
    feed_pos: Array
    content: Array
    parsed: Array
    to_author: Array


def parse(vocab: ActionVocab, tokens: Array, mask: Array, content_len: int) -> Parsed:
    """tokens [B, N] int32, mask [B, N] bool (response incl. stop) -> Parsed actions."""
    chex.assert_rank(tokens, 2)
    b, n = tokens.shape
    m, width = vocab.prefixes.shape
    w = min(width, n)
    head = jnp.where(mask[:, :w], tokens[:, :w], -2)  # -2 never equals a prefix entry
    pref = vocab.prefixes[:, :w]
    j = jnp.arange(w)
    ok_tok = ((head[:, None, :] == pref[None])
              | (j[None, None, :] >= vocab.prefix_len[None, :, None]))
    match = ok_tok.all(-1) & (vocab.prefix_len[None, :] <= w)  # [B, M]
    best = jnp.argmax(jnp.where(match, vocab.prefix_len[None, :], -1), axis=1)
    parsed = match.any(axis=1)
    plen = vocab.prefix_len[best]
    # Content: the response after the prefix, stop tokens and padding removed.
    stops = jnp.asarray(vocab.stop_ids or (-1,), jnp.int32)
    idx = plen[:, None] + jnp.arange(content_len)[None, :]
    gathered = jnp.take_along_axis(tokens, jnp.minimum(idx, n - 1), axis=1)
    keep = (idx < n) & jnp.take_along_axis(mask, jnp.minimum(idx, n - 1), axis=1)
    keep &= ~jnp.isin(gathered, stops)
    keep = jnp.cumprod(keep, axis=1).astype(bool)  # text ends at the first stop / pad
    has_text = vocab.has_text[best] & parsed
    content = jnp.where(keep & has_text[:, None], gathered, PAD_TOKEN)
    empty_text = has_text & ~keep[:, 0]
    parsed = parsed & ~empty_text
    kind = jnp.where(parsed, vocab.action_type[best], int(ActionType.MALFORMED))
    return Parsed(type=kind.astype(jnp.int32),
                  feed_pos=jnp.where(parsed, vocab.feed_pos[best], -1).astype(jnp.int32),
                  content=content.astype(jnp.int32), parsed=parsed,
                  to_author=vocab.to_author[best] & parsed)


def to_actions(parsed: Parsed, actors: Array, feed_ids: Array, feed_valid: Array,
               feed_authors: Array, embedding: Array) -> ActionBatch:
    """Parsed answers -> society ActionBatch. feed_ids/feed_valid/feed_authors [B, K];
    embedding [B, d] of the content (read for posts/comments/quotes only).

    A feed position that points at an empty feed slot targets EMPTY (the society rejects it as a
    missing post and counts it)."""
    pos = jnp.clip(parsed.feed_pos, 0, feed_ids.shape[1] - 1)
    rows = jnp.arange(feed_ids.shape[0])
    shown = feed_valid[rows, pos] & (parsed.feed_pos >= 0)
    post = jnp.where(shown, feed_ids[rows, pos], EMPTY)
    author = jnp.where(shown, feed_authors[rows, pos], EMPTY)
    target = jnp.where(parsed.to_author, author, post)
    return ActionBatch(type=parsed.type, actor=actors.astype(jnp.int32),
                       target=target.astype(jnp.int32), content=parsed.content,
                       embedding=embedding.astype(jnp.float32),
                       valid=jnp.ones_like(parsed.parsed))
