"""Prompt assembly inside jit, from pre-tokenized pieces, following the model's chat template.

The host tokenizes the fixed pieces once (`PromptTemplate.build`): the chat-template text before
the persona, each agent's persona, the text between persona and feed (end of system turn, user
header, instruction), one label per feed position ("[3] "), the separator after a post, and the
tail (footer, end of user turn, assistant header). Inside jit, `assemble` concatenates for each
agent: head + persona + middle + (label_k + post tokens + sep for every valid feed post) + tail,
into a left-padded `[B, max_len]` buffer. Byte-level BPE decoding is concatenative, so the decoded
prompt equals `tokenizer.apply_chat_template(messages)` of the same texts — a test pins that.
"""

from __future__ import annotations

import dataclasses
from typing import List, Sequence, Tuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

Array = jax.Array

_SENTINEL = "\x00PERSONA\x00"
_USER_SENTINEL = "\x00USER\x00"


@struct.dataclass
class PromptTemplate:
    """Pre-tokenized prompt pieces. Token arrays are right-padded; `*_len` give real lengths.

    head [Lh], persona [A, Lp] + persona_len [A], middle [Lm], labels [K, Ll] + label_len [K],
    sep [Ls], tail [Lt]; pad_id fills the left padding; max_len is the static prompt length.
    """

    head: Array
    persona: Array
    persona_len: Array
    middle: Array
    labels: Array
    label_len: Array
    sep: Array
    tail: Array
    pad_id: int = struct.field(pytree_node=False, default=0)
    max_len: int = struct.field(pytree_node=False, default=0)

    @staticmethod
    def build(tokenizer, personas: Sequence[str], instruction: str, footer: str, feed_size: int,
              content_len: int, label_format: str = "[{k}] ", sep: str = "\n",
              bucket: int = 64) -> "PromptTemplate":
        """Tokenize the fixed pieces with `tokenizer` (a transformers tokenizer with a chat
        template). The user message is `instruction + "\\n" + feed + footer`.

        `max_len` is the worst case (longest persona, K full posts) rounded up to `bucket`.
        """
        for i, p in enumerate(personas):
            if p != p.strip() or not p:
                raise ValueError(f"persona {i} must be non-empty without surrounding "
                                 f"whitespace (the chat template trims it): {p!r}")
        if footer != footer.rstrip():
            raise ValueError(f"footer must not end with whitespace (it is trimmed): {footer!r}")
        rendered = render_chat(tokenizer, _SENTINEL, _USER_SENTINEL)
        head_text, rest = rendered.split(_SENTINEL)
        middle_text, tail_text = rest.split(_USER_SENTINEL)
        middle_text = middle_text + instruction + "\n"
        tail_text = footer + tail_text

        def ids(text: str) -> List[int]:
            return tokenizer.encode(text, add_special_tokens=False) if text else []

        def padded(rows: List[List[int]]) -> Tuple[np.ndarray, np.ndarray]:
            width = max(1, max(len(r) for r in rows))
            out = np.full((len(rows), width), tokenizer.pad_token_id or 0, np.int32)
            for i, r in enumerate(rows):
                out[i, :len(r)] = r
            return out, np.asarray([len(r) for r in rows], np.int32)

        persona, persona_len = padded([ids(p) for p in personas])
        labels, label_len = padded([ids(label_format.format(k=k + 1)) for k in range(feed_size)])
        head, middle, sep_ids, tail = (np.asarray(ids(t), np.int32)
                                       for t in (head_text, middle_text, sep, tail_text))
        worst = (len(head) + int(persona_len.max()) + len(middle) + int(label_len.sum())
                 + feed_size * (content_len + len(sep_ids)) + len(tail))
        max_len = -(-worst // bucket) * bucket
        return PromptTemplate(head=jnp.asarray(head), persona=jnp.asarray(persona),
                              persona_len=jnp.asarray(persona_len), middle=jnp.asarray(middle),
                              labels=jnp.asarray(labels), label_len=jnp.asarray(label_len),
                              sep=jnp.asarray(sep_ids), tail=jnp.asarray(tail),
                              pad_id=int(tokenizer.pad_token_id or 0), max_len=int(max_len))


def render_chat(tokenizer, persona: str, user: str) -> str:
    """Host-side reference rendering: system = persona, user = the feed message."""
    messages = [{"role": "system", "content": persona}, {"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def render_user_message(instruction: str, posts: Sequence[str], footer: str,
                        label_format: str = "[{k}] ", sep: str = "\n") -> str:
    """Host-side text of the user turn for a feed (posts in feed order, invalid ones skipped)."""
    body = "".join(label_format.format(k=k + 1) + text + sep for k, text in enumerate(posts))
    return instruction + "\n" + body + footer


def assemble(template: PromptTemplate, agent_ids: Array, feed_tokens: Array,
             feed_valid: Array) -> Tuple[Array, Array]:
    """Build left-padded prompts.

    agent_ids [B] int32 (rows of template.persona); feed_tokens [B, K, L] int32 post tokens,
    right-padded with PAD_TOKEN (a position holds a token iff `>= 0`); feed_valid [B, K] bool. Feed slot k keeps its label k+1
    (labels are positions in the feed, so "like 3" always means the third shown slot).
    Returns (input_ids [B, max_len] int32, attention_mask [B, max_len] bool).
    """
    chex.assert_rank(feed_tokens, 3)
    b, k, l = feed_tokens.shape
    chex.assert_shape(feed_valid, (b, k))
    t = template
    content_len = jnp.where(feed_valid, jnp.sum(feed_tokens >= 0, axis=-1), 0)

    def fixed(piece):  # a piece shared by all rows -> ([B, n], [B] lengths)
        return jnp.broadcast_to(piece, (b, piece.shape[0])), jnp.full((b,), piece.shape[0])

    label_len = jnp.where(feed_valid, t.label_len[None, :], 0)
    sep_len = jnp.where(feed_valid, t.sep.shape[0], 0)
    feed_pieces = []
    for j in range(k):
        feed_pieces += [(jnp.broadcast_to(t.labels[j], (b, t.labels.shape[1])), label_len[:, j]),
                        (feed_tokens[:, j], content_len[:, j]),
                        (jnp.broadcast_to(t.sep, (b, t.sep.shape[0])), sep_len[:, j])]
    pieces = ([fixed(t.head), (t.persona[agent_ids], t.persona_len[agent_ids]), fixed(t.middle)]
              + feed_pieces + [fixed(t.tail)])
    lengths = jnp.stack([n for _, n in pieces], axis=1)  # [B, num_pieces]
    total = lengths.sum(axis=1)
    start = t.max_len - total  # left padding
    offsets = start[:, None] + jnp.cumsum(lengths, axis=1) - lengths
    buf = jnp.full((b, t.max_len), t.pad_id, jnp.int32)
    rows = jnp.arange(b)[:, None]
    for (tokens, n), off in zip(pieces, jnp.moveaxis(offsets, 1, 0)):
        j = jnp.arange(tokens.shape[1])[None, :]
        pos = jnp.where(j < n[:, None], off[:, None] + j, t.max_len)  # out of range -> dropped
        buf = buf.at[rows, pos].set(tokens.astype(jnp.int32), mode="drop")
    mask = jnp.arange(t.max_len)[None, :] >= start[:, None]
    return buf, mask
