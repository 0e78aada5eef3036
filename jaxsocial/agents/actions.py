"""The answers an agent may give in `free` / `constrained` mode, as token patterns: the action
table (`ACTIONS`, `PRESETS`; OASIS's names in `TOOL_ARGS`), `ActionVocab` (the prefixes as token
ids [M, Lmax] and the constrained-decoding `grammar`), the JAX parser `parse` (tokens [B, N] ->
`Parsed`: type / feed_pos [B], content [B, L]) and `to_actions` (-> the society's
`ActionBatch`). The tool_call mode's parser is in `tool_calls`.

The agent's answer refers to its feed by position: "like 2" likes the second post shown,
"follow 2" follows that post's author, "comment 2: <text>" comments on it, "post: <text>"
creates a post, "nothing" does nothing; "like_comment 7" likes the comment labelled [7] (comment
labels follow the K post labels), "search_posts: <query>" / "search_user: <query>" / "trend"
make the results the agent's next feed (`ACTIONS` lists every form; `agents.actions` picks a
set, by keywords, OASIS's names or a preset). Each keyword, each " <k>" and ":" are tokenized
once on the host; a response is parsed by matching those token sequences at its start (longest match
wins), and the text after the matched prefix (up to the stop token) becomes the content.

Modes: `constrained` decodes under `grammar` (every response parses); `free` decodes without it
and the parser maps anything that does not start with an action prefix to MALFORMED (counted by
the society as an invalid action, never applied). Only the canonical tokenization of a prefix
parses; a free-running model that spells "like 2" with other token boundaries counts as
unparsable.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsocial.generation import grammar as grammar_lib
from jaxsocial.social.actions import ActionBatch, ActionType
from jaxsocial.social.state import EMPTY, PAD_TOKEN

Array = jax.Array

class Spec(NamedTuple):
    """An answer form: the society action, what "<n>" names (`target`: "none" = no number,
    "post" = the n-th feed post, "author" = that post's author, "comment" = the comment
    labelled n), and whether text follows (":" then the text: a post's, a comment's, a query)."""
    type: ActionType
    target: str
    text: bool


T = ActionType
# keyword (the answer's first word) -> Spec.  OASIS's names for the same actions are accepted in
# configs (`OASIS_NAMES`).
ACTIONS: Dict[str, Spec] = {
    "post": Spec(T.CREATE_POST, "none", True),            # post: <text>
    "comment": Spec(T.CREATE_COMMENT, "post", True),      # comment <n>: <text>
    "quote": Spec(T.QUOTE_POST, "post", True),            # quote <n>: <text>
    "like": Spec(T.LIKE_POST, "post", False),             # like <n>
    "unlike": Spec(T.UNLIKE_POST, "post", False),
    "dislike": Spec(T.DISLIKE_POST, "post", False),
    "undo_dislike": Spec(T.UNDO_DISLIKE_POST, "post", False),
    "report": Spec(T.REPORT_POST, "post", False),
    "repost": Spec(T.REPOST, "post", False),
    "follow": Spec(T.FOLLOW, "author", False),            # follow <n>: the author of post n
    "unfollow": Spec(T.UNFOLLOW, "author", False),
    "mute": Spec(T.MUTE, "author", False),
    "unmute": Spec(T.UNMUTE, "author", False),
    "like_comment": Spec(T.LIKE_COMMENT, "comment", False),   # like_comment <n>: comment [n]
    "unlike_comment": Spec(T.UNLIKE_COMMENT, "comment", False),
    "dislike_comment": Spec(T.DISLIKE_COMMENT, "comment", False),
    "undo_dislike_comment": Spec(T.UNDO_DISLIKE_COMMENT, "comment", False),
    "search_posts": Spec(T.SEARCH_POSTS, "none", True),   # search_posts: <query>
    "search_user": Spec(T.SEARCH_USER, "none", True),     # search_user: <query>
    "trend": Spec(T.TREND, "none", False),
    "refresh": Spec(T.REFRESH, "none", False),
    "nothing": Spec(T.DO_NOTHING, "none", False),
}
# Action sets by name (`agents.actions` may be one of these names or a sequence of keywords).
PRESETS = {
    "default": ("post", "comment", "like", "repost", "follow", "nothing"),
    "oasis_twitter": ("post", "like", "repost", "follow", "nothing", "quote"),
    "oasis_reddit": ("like", "dislike", "post", "comment", "like_comment", "dislike_comment",
                     "search_posts", "search_user", "trend", "refresh", "nothing", "follow",
                     "mute"),
    "all": tuple(ACTIONS),
}

# keyword -> (tool name, integer argument or None, text argument or None): OASIS's names.
TOOL_ARGS = {
    "post": ("create_post", None, "content"),
    "comment": ("create_comment", "post_id", "content"),
    "quote": ("quote_post", "post_id", "quote_content"),
    "like": ("like_post", "post_id", None),
    "unlike": ("unlike_post", "post_id", None),
    "dislike": ("dislike_post", "post_id", None),
    "undo_dislike": ("undo_dislike_post", "post_id", None),
    "report": ("report_post", "post_id", None),
    "repost": ("repost", "post_id", None),
    "follow": ("follow", "followee_id", None),
    "unfollow": ("unfollow", "followee_id", None),
    "mute": ("mute", "mutee_id", None),
    "unmute": ("unmute", "mutee_id", None),
    "like_comment": ("like_comment", "comment_id", None),
    "unlike_comment": ("unlike_comment", "comment_id", None),
    "dislike_comment": ("dislike_comment", "comment_id", None),
    "undo_dislike_comment": ("undo_dislike_comment", "comment_id", None),
    "search_posts": ("search_posts", None, "query"),
    "search_user": ("search_user", None, "query"),
    "trend": ("trend", None, None),
    "refresh": ("refresh", None, None),
    "nothing": ("do_nothing", None, None),
}
# OASIS's action names that differ from our keywords, accepted in `agents.actions`.
OASIS_NAMES = {tool: kw for kw, (tool, _, _) in TOOL_ARGS.items() if tool != kw}


def resolve(actions: Union[str, Sequence[str]]) -> Tuple[str, ...]:
    """`agents.actions` -> answer keywords: a preset name (`PRESETS`) or a sequence of keywords
    / OASIS action names.  ValueError naming an unknown action (or preset) or a repeat."""
    if isinstance(actions, str):
        if actions not in PRESETS:
            raise ValueError(f"unknown agents.actions preset {actions!r}; presets: "
                             f"{sorted(PRESETS)}, or give a sequence of actions")
        return PRESETS[actions]
    out = []
    for a in actions:
        name = OASIS_NAMES.get(a, a)
        if name not in ACTIONS:
            raise ValueError(f"unknown agent action {a!r} in agents.actions; known: "
                             f"{sorted(ACTIONS)} (or OASIS's names {sorted(OASIS_NAMES)})")
        if name in out:
            raise ValueError(f"agent action {a!r} appears twice in agents.actions")
        out.append(name)
    if not out:
        raise ValueError("agents.actions is empty")
    return tuple(out)


def needs_comments(actions: Union[str, Sequence[str]]) -> Tuple[str, ...]:
    """The actions of a set that name a shown comment (need `society.feed_comments >= 1`)."""
    return tuple(a for a in resolve(actions) if ACTIONS[a].target == "comment")


def _check_comments(actions: Sequence[str], feed_comments: int) -> None:
    if feed_comments < 1 and needs_comments(actions):
        raise ValueError(f"agent actions {list(needs_comments(actions))} name a shown "
                         f"comment: set society.feed_comments >= 1")


@struct.dataclass
class ActionVocab:
    """Prefix table. prefixes [M, Lmax] int32 (right-padded with -1), prefix_len [M],
    action_type [M], feed_pos [M] (0-based label index: posts 0..K-1, comments K..K+KC-1;
    -1 = none), has_text [M] bool, to_author [M] bool, to_comment [M] bool."""

    prefixes: Array
    prefix_len: Array
    action_type: Array
    feed_pos: Array
    has_text: Array
    to_author: Array
    to_comment: Array
    stop_ids: Tuple[int, ...] = struct.field(pytree_node=False, default=())

    @staticmethod
    def build(tokenizer, actions: Union[str, Sequence[str]], feed_size: int,
              stop_ids: Sequence[int], feed_comments: int = 0) -> "ActionVocab":
        """Prefix rows for `actions` (`resolve`): per numbered action one row per label ("like
        1" .. "like K"; comment actions "like_comment K+1" .. "like_comment K+K*C" for C =
        `feed_comments` comments shown per post).  ValueError for an unknown action, or a
        comment action with feed_comments = 0."""
        actions = resolve(actions)
        _check_comments(actions, feed_comments)
        enc = lambda s: list(tokenizer.encode(s, add_special_tokens=False))  # noqa: E731
        rows, meta = [], []
        for name in actions:
            spec = ACTIONS[name]
            positional = spec.target != "none"
            head = enc(name + ":") if (spec.text and not positional) else enc(name)
            if spec.target == "comment":
                labels = range(feed_size, feed_size + feed_size * feed_comments)
            elif positional:
                labels = range(feed_size)
            else:
                labels = [-1]
            for k in labels:
                seq = head + (enc(f" {k + 1}") if positional else [])
                if spec.text and positional:
                    seq = seq + enc(":")
                rows.append(seq)
                meta.append((int(spec.type), k, spec.text, spec.target == "author",
                             spec.target == "comment"))
        width = max(len(r) for r in rows)
        prefixes = np.full((len(rows), width), -1, np.int32)
        for i, r in enumerate(rows):
            prefixes[i, :len(r)] = r
        kinds, pos, text, author, comment = map(np.asarray, zip(*meta))
        return ActionVocab(prefixes=jnp.asarray(prefixes),
                           prefix_len=jnp.asarray([len(r) for r in rows], jnp.int32),
                           action_type=jnp.asarray(kinds, jnp.int32),
                           feed_pos=jnp.asarray(pos, jnp.int32),
                           has_text=jnp.asarray(text, bool), to_author=jnp.asarray(author, bool),
                           to_comment=jnp.asarray(comment, bool),
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
    """type [B] int32 ActionType (MALFORMED when nothing matched); feed_pos [B] (label index,
    -1 = none); content [B, L] int32 (right-padded with PAD_TOKEN); parsed [B] bool;
    to_author / to_comment [B] bool (what feed_pos names)."""

    type: Array
    feed_pos: Array
    content: Array
    parsed: Array
    to_author: Array
    to_comment: Array


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
                  to_author=vocab.to_author[best] & parsed,
                  to_comment=vocab.to_comment[best] & parsed)


def to_actions(parsed: Parsed, actors: Array, feed_ids: Array, feed_valid: Array,
               feed_authors: Array, embedding: Array,
               comment_ids: Optional[Array] = None) -> ActionBatch:
    """Parsed answers -> society ActionBatch. feed_ids/feed_valid/feed_authors [B, K];
    embedding [B, d] of the content (read for posts/comments/quotes; a search's query);
    comment_ids [B, K, C] (`FeedView.comment_ids`: the shown comments, EMPTY where none) for
    comment actions: label K + k C + c names comment_ids[:, k, c].

    A label that points at an empty feed slot or comment slot targets EMPTY (the society rejects
    it as a missing post and counts it)."""
    b, k = feed_ids.shape
    pos = jnp.clip(parsed.feed_pos, 0, k - 1)
    rows = jnp.arange(b)
    shown = feed_valid[rows, pos] & (parsed.feed_pos >= 0)
    post = jnp.where(shown, feed_ids[rows, pos], EMPTY)
    author = jnp.where(shown, feed_authors[rows, pos], EMPTY)
    target = jnp.where(parsed.to_author, author, post)
    if comment_ids is not None:
        flat = comment_ids.reshape(b, -1)
        cpos = jnp.clip(parsed.feed_pos - k, 0, flat.shape[1] - 1)
        target = jnp.where(parsed.to_comment, flat[rows, cpos], target)
    else:
        target = jnp.where(parsed.to_comment, EMPTY, target)
    return ActionBatch(type=parsed.type, actor=actors.astype(jnp.int32),
                       target=target.astype(jnp.int32), content=parsed.content,
                       embedding=embedding.astype(jnp.float32),
                       valid=jnp.ones_like(parsed.parsed))
