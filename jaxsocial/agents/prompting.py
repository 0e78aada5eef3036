"""Prompt assembly inside jit, from pre-tokenized pieces, following the model's chat template.

The feed is shown as OASIS shows it: each post with its author's name, its like and comment
counts, and its newest comment (author, text, likes) when it has one:

    [1] Ada: Hello world! · 3 likes · 2 comments
      newest comment by user2051: Same here! · 1 like
    [2] user977: The 8:15 train is late again · 0 likes · 0 comments

`render_user_message` is the host-side spec of that text; `assemble` builds the same thing as
token ids inside jit, for a batch of feeds, from pieces the host tokenized once
(`PromptTemplate.build`): the chat-template text around the persona and the user turn, labels
"[k]", agents' names (" Ada"), the crowd's name prefix (" user") and digit groups, counts
" 0".." 999" and " 999+" (larger counts are clipped: the prompt says "999+"), the words
" like(s)" / " comment(s)", and the separators.

Token-canonical: the assembled ids equal `tokenizer.apply_chat_template(messages)` of the same
text token for token (tests pin it with Llama-3.2's and SmolLM2's tokenizers), not merely the
same decoded text. A byte-level BPE never merges across a pre-tokenizer split, so every piece
boundary is placed where both families of pre-tokenizer regex (Llama-3's and GPT-2's) split:
- post content is stored in leading-space form (" Hello world!": what a model generates after
  "post:", and how the crowd's text banks are tokenized) and sits between ":" and " ·" (a space
  then punctuation); a newline or punctuation right after content would merge with a trailing
  "!" in Llama-3 ("!\\n" is one pre-token), so no line ends with content;
- labels have no trailing space ("[1]" then " Ada"; "[1] " + "Hello" would leave a lone "Ġ");
- numbers carry their leading space (" 42"; GPT-2's regex joins a space to digits) and are
  followed by " likes" / " comments";
- a crowd user's name is " user" + its id's decimal digits in groups of three from the left
  ("user1234567" = " user" "123" "456" "7"): Llama-3 splits digit runs that way and SmolLM2
  into single digits, so the groups compose to the tokenizer's own ids for any id (no per-user
  table: a 1e6-user society costs a 1,110-row table). `build` verifies the composition and the
  boundaries on sample text and raises if the tokenizer disagrees.
Content itself is the agent's own generated ids (or the bank's tokenization): canonical when
those are.
"""

from __future__ import annotations

import re
from typing import List, NamedTuple, Optional, Sequence, Tuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

Array = jax.Array

_SENTINEL = "\x00PERSONA\x00"
_USER_SENTINEL = "\x00USER\x00"

# The feed's text pieces (the host spec and the jit assembly both use exactly these).
LABEL = "[{k}]"
NAME_SEP = ":"  # after the author's name; content follows with its own leading space
CROWD_PREFIX = " user"  # crowd user u is shown as "user<u>"
COUNT_SEP = " ·"
LIKE_WORDS = (" like", " likes")  # singular when the count is 1
COMMENT_WORDS = (" comment", " comments")
COMMENT_HEAD = "\n  newest comment by"
# feed_comments >= 1: each shown comment on its own labelled line, "\n  comment [n] by <name>:
# <text> · <likes>"; comment labels continue after the K post labels (post k's c-th comment is
# n = K + (k - 1) C + c), so "like_comment <n>" names one.
COMMENT_LINE = "\n  comment"
COMMENT_LABEL = " [{n}]"
COMMENT_BY = " by"
POST_END = "\n"
MAX_COUNT = 999  # larger counts are shown as "999+"
_POW10 = np.asarray([10 ** i for i in range(10)], np.int64)
_GROUP_BASE = (0, 0, 10, 110)  # row of a g-digit group "d..d" in the groups table: base[g] + value
_NUM_GROUPS = 4  # int32 ids have at most 10 digits


class FeedComment(NamedTuple):
    """A newest comment as shown: author name, text in stored (leading-space) form, likes."""
    author: str
    text: str
    likes: int


class FeedPost(NamedTuple):
    """A feed post as shown (host side): author name, text in stored (leading-space) form,
    like and comment counts, its newest comment (None = none; the `newest_comment` style), and
    `thread`: its shown comments newest first, None for an empty comment slot (the
    `feed_comments` style)."""
    author: str
    text: str
    likes: int
    comments: int
    newest: Optional[FeedComment] = None
    thread: Tuple[Optional[FeedComment], ...] = ()


def crowd_name(user_id: int) -> str:
    """Display name of crowd user `user_id`."""
    return CROWD_PREFIX.strip() + str(int(user_id))


def count_text(n: int) -> str:
    """A count as shown: "0".."999", then "999+"."""
    return str(int(n)) if n <= MAX_COUNT else f"{MAX_COUNT}+"


def persona_name(persona: str) -> str:
    """The name in a persona "You are Ada, ..." -> "Ada" (ValueError when there is none)."""
    m = re.match(r"\s*You are ([A-Z][\w'\-]*(?: [A-Z][\w'\-]*)*)", persona)
    if not m:
        raise ValueError(f"no name in persona {persona!r} (expected 'You are <Name>, ...'); "
                         f"give the agents' names explicitly")
    return m.group(1)


def _digit_groups(digits: str) -> List[str]:
    return [digits[i:i + 3] for i in range(0, len(digits), 3)]


def _name_strings(name: str) -> List[str]:
    """Pieces of a displayed name: " user" + digit groups for crowd names, else " " + name."""
    m = re.fullmatch(CROWD_PREFIX.strip() + r"(\d+)", name)
    if m:
        return [CROWD_PREFIX] + _digit_groups(m.group(1))
    return [" " + name]


def comment_label(k: int, c: int, feed_size: int, feed_comments: int) -> int:
    """The label number of the c-th (1-based) shown comment of feed post k (1-based)."""
    return feed_size + (k - 1) * feed_comments + c


def _comment_strings(c: FeedComment) -> List[str]:
    return _name_strings(c.author) + [NAME_SEP, c.text, COUNT_SEP, " " + count_text(c.likes),
                                      LIKE_WORDS[c.likes != 1]]


def _post_strings(k: int, post: FeedPost, newest_comment: bool = True, feed_comments: int = 0,
                  feed_size: int = 0) -> List[str]:
    """The pieces of feed post `k` (1-based) in assembly order; "".join is its text."""
    out = [LABEL.format(k=k)] + _name_strings(post.author) + [NAME_SEP, post.text]
    out += [COUNT_SEP, " " + count_text(post.likes), LIKE_WORDS[post.likes != 1],
            COUNT_SEP, " " + count_text(post.comments), COMMENT_WORDS[post.comments != 1]]
    if feed_comments > 0:
        for c, com in enumerate(tuple(post.thread)[:feed_comments]):
            if com is not None:
                n = comment_label(k, c + 1, feed_size, feed_comments)
                out += [COMMENT_LINE, COMMENT_LABEL.format(n=n), COMMENT_BY]
                out += _comment_strings(com)
        return out + [POST_END]
    c = post.newest
    if newest_comment and c is not None:
        out += [COMMENT_HEAD] + _comment_strings(c)
    return out + [POST_END]


def render_post(k: int, post: FeedPost, newest_comment: bool = True, feed_comments: int = 0,
                feed_size: int = 0) -> str:
    """Text of feed post `k` (1-based), newline-terminated.  `feed_comments` > 0: its `thread`
    with comment labels (needs the feed's `feed_size`)."""
    return "".join(_post_strings(k, post, newest_comment, feed_comments, feed_size))


def render_user_message(instruction: str, posts: Sequence[Optional[FeedPost]], footer: str,
                        newest_comment: bool = True, feed_comments: int = 0) -> str:
    """Host-side text of the user turn for a feed: posts in feed order, None for an empty slot
    (skipped; labels stay feed positions). This is the spec `assemble` must equal."""
    body = "".join(render_post(k + 1, p, newest_comment, feed_comments, len(posts))
                   for k, p in enumerate(posts) if p is not None)
    return instruction + "\n" + body + footer


def render_chat(tokenizer, persona: str, user: str) -> str:
    """Host-side reference rendering: system = persona, user = the feed message."""
    messages = [{"role": "system", "content": persona}, {"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@struct.dataclass
class PromptTemplate:
    """Pre-tokenized prompt pieces. Token tables are right-padded; `*_len` give real lengths.

    head [Lh], persona [A, Lp] + persona_len [A], middle [Lm], tail [Lt]; labels [K, Ll];
    names [A, Ln] (agents' " Name"); crowd_prefix [Lc]; groups [1110, Lg] (digit groups "0".."9",
    "00".."99", "000".."999"); counts [1001, Lk] (" 0".." 999", " 999+"); like_words /
    comment_words [2, Lw] (singular, plural); name_sep, count_sep, comment_head, post_end.
    pad_id fills the left padding; max_len is the static prompt length; newest_comment whether
    posts show their newest comment; feed_comments = C > 0: instead, each post shows up to C
    comments on labelled lines (comment_line, comment_labels [K C, Lcl], comment_by).
    """

    head: Array
    persona: Array
    persona_len: Array
    middle: Array
    tail: Array
    labels: Array
    label_len: Array
    names: Array
    name_len: Array
    crowd_prefix: Array
    groups: Array
    group_len: Array
    counts: Array
    count_len: Array
    like_words: Array
    like_word_len: Array
    comment_words: Array
    comment_word_len: Array
    name_sep: Array
    count_sep: Array
    comment_head: Array
    post_end: Array
    comment_line: Array = None
    comment_labels: Array = None  # [K * C, Lcl] " [K+1]" .. " [K+KC]"
    comment_label_len: Array = None
    comment_by: Array = None
    pad_id: int = struct.field(pytree_node=False, default=0)
    max_len: int = struct.field(pytree_node=False, default=0)
    newest_comment: bool = struct.field(pytree_node=False, default=True)
    feed_comments: int = struct.field(pytree_node=False, default=0)

    @staticmethod
    def build(tokenizer, personas: Sequence[str], instruction: str, footer: str, feed_size: int,
              content_len: int, names: Optional[Sequence[str]] = None,
              newest_comment: bool = True, num_users: Optional[int] = None,
              bucket: int = 64, feed_comments: int = 0) -> "PromptTemplate":
        """Tokenize the fixed pieces with `tokenizer` (a transformers tokenizer with a chat
        template). The user message is `instruction + "\\n" + feed + footer`. Agent a is
        user a, shown as `names[a]` (default: the name in its persona, "You are Ada, ...").

        `max_len` is the worst case (longest persona, K full posts with full newest comments,
        longest names and counts; crowd ids below `num_users`, default any int32) rounded up
        to `bucket`. Raises ValueError when the tokenizer
        does not split the pieces canonically (checked on sample feeds). `feed_comments` = C > 0
        shows up to C labelled comments per post (newest_comment is then ignored).
        """
        if feed_comments < 0:
            raise ValueError(f"feed_comments must be >= 0, got {feed_comments}")
        for i, p in enumerate(personas):
            if p != p.strip() or not p:
                raise ValueError(f"persona {i} must be non-empty without surrounding "
                                 f"whitespace (the chat template trims it): {p!r}")
        if footer != footer.rstrip():
            raise ValueError(f"footer must not end with whitespace (it is trimmed): {footer!r}")
        names = [persona_name(p) for p in personas] if names is None else list(names)
        if len(names) != len(personas):
            raise ValueError(f"{len(names)} names for {len(personas)} agents")
        for n in names:
            if not n or n != n.strip() or "\n" in n or re.fullmatch(r"user\d+", n):
                raise ValueError(f"bad agent name {n!r} (non-empty, no surrounding whitespace, "
                                 f"not of the crowd's form 'user<digits>')")
        rendered = render_chat(tokenizer, _SENTINEL, _USER_SENTINEL)
        head_text, rest = rendered.split(_SENTINEL)
        middle_text, tail_text = rest.split(_USER_SENTINEL)
        middle_text = middle_text + instruction + "\n"
        tail_text = footer + tail_text

        def ids(text: str) -> List[int]:
            return tokenizer.encode(text, add_special_tokens=False) if text else []

        def table(texts: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
            rows = [ids(t) for t in texts]
            out = np.zeros((len(rows), max(1, max(len(r) for r in rows))), np.int32)
            for i, r in enumerate(rows):
                out[i, :len(r)] = r
            return out, np.asarray([len(r) for r in rows], np.int32)

        _check_canonical(ids, names, feed_comments)
        persona, persona_len = table(personas)
        labels, label_len = table([LABEL.format(k=k + 1) for k in range(feed_size)])
        name_t, name_len = table([" " + n for n in names])
        groups, group_len = table([f"{v:0{g}d}" for g in (1, 2, 3) for v in range(10 ** g)])
        counts, count_len = table([" " + count_text(n) for n in range(MAX_COUNT + 2)])
        like_w, like_w_len = table(LIKE_WORDS)
        com_w, com_w_len = table(COMMENT_WORDS)
        ncl = max(feed_size * feed_comments, 1)
        com_l, com_l_len = table([COMMENT_LABEL.format(n=feed_size + i + 1) for i in range(ncl)])
        fixed = {k: np.asarray(ids(v), np.int32) for k, v in dict(
            head=head_text, middle=middle_text, tail=tail_text, crowd_prefix=CROWD_PREFIX,
            name_sep=NAME_SEP, count_sep=COUNT_SEP, comment_head=COMMENT_HEAD,
            post_end=POST_END, comment_line=COMMENT_LINE, comment_by=COMMENT_BY).items()}
        digits = len(str(max(int(num_users) - 1, 0))) if num_users else 10
        longest_name = max(int(name_len.max()), len(fixed["crowd_prefix"])
                           + -(-digits // 3) * int(group_len.max()))
        num = int(count_len.max())
        word = max(int(like_w_len.max()), int(com_w_len.max()))
        n_sep, c_sep = len(fixed["name_sep"]), len(fixed["count_sep"])
        post = (int(label_len.max()) + longest_name + n_sep + content_len
                + 2 * (c_sep + num + word) + len(fixed["post_end"]))
        comment = longest_name + n_sep + content_len + c_sep + num + word
        if feed_comments:
            post += feed_comments * (len(fixed["comment_line"]) + int(com_l_len.max())
                                     + len(fixed["comment_by"]) + comment)
        elif newest_comment:
            post += len(fixed["comment_head"]) + comment
        worst = (len(fixed["head"]) + int(persona_len.max()) + len(fixed["middle"])
                 + feed_size * post + len(fixed["tail"]))
        max_len = -(-worst // bucket) * bucket
        j = jnp.asarray
        return PromptTemplate(
            head=j(fixed["head"]), persona=j(persona), persona_len=j(persona_len),
            middle=j(fixed["middle"]), tail=j(fixed["tail"]), labels=j(labels),
            label_len=j(label_len), names=j(name_t), name_len=j(name_len),
            crowd_prefix=j(fixed["crowd_prefix"]), groups=j(groups), group_len=j(group_len),
            counts=j(counts), count_len=j(count_len), like_words=j(like_w),
            like_word_len=j(like_w_len), comment_words=j(com_w), comment_word_len=j(com_w_len),
            name_sep=j(fixed["name_sep"]), count_sep=j(fixed["count_sep"]),
            comment_head=j(fixed["comment_head"]), post_end=j(fixed["post_end"]),
            comment_line=j(fixed["comment_line"]), comment_labels=j(com_l),
            comment_label_len=j(com_l_len), comment_by=j(fixed["comment_by"]),
            pad_id=int(tokenizer.pad_token_id or 0), max_len=int(max_len),
            newest_comment=bool(newest_comment), feed_comments=int(feed_comments))


_SAMPLE_TEXTS = (" Hello world!", " 2024 was great!!", " ok", " Is it 8:15 yet?", " wow...\n",
                 " trailing space ", " (quoted) \"yes\"", " 100% sure", " it's fine", " émoji 🎉")


def _check_canonical(ids, names: Sequence[str], feed_comments: int = 0) -> None:
    """Raise ValueError unless the tokenizer's ids of sample feed posts equal the concatenation
    of their pieces' ids (the property `assemble` relies on)."""
    users = [0, 7, 42, 999, 1000, 20481, 1234567, 2**31 - 1]
    counts = [0, 1, 7, 10, 999, 1000, 123456]
    for i, text in enumerate(_SAMPLE_TEXTS):
        author = names[i % len(names)] if i % 2 else crowd_name(users[i % len(users)])
        c = FeedComment(crowd_name(users[(i + 3) % len(users)]), _SAMPLE_TEXTS[-1 - i],
                        counts[(i + 2) % len(counts)])
        post = FeedPost(author, text, counts[i % len(counts)], counts[(i + 1) % len(counts)], c)
        pieces = ["Feed:\n"] + _post_strings(i + 1, post) + _post_strings(i + 2, post._replace(
            newest=None))
        if feed_comments:  # a post with labelled comments, one comment slot empty
            c2 = c._replace(text=_SAMPLE_TEXTS[i - 3], author=author)
            thread = post._replace(thread=(c, None, c2))
            pieces += _post_strings(i + 3, thread, True, 3, 9 + 10 ** (i % 4))
        pieces += ["Your action:"]
        whole = ids("".join(pieces))
        joined = [t for p in pieces for t in ids(p)]
        if whole != joined:
            raise ValueError(f"the tokenizer does not split the feed pieces canonically: "
                             f"{''.join(pieces)!r} -> {whole} but the pieces give {joined}")


@struct.dataclass
class FeedView:
    """What the prompt shows of B feeds of K posts: content tokens [B, K, L] (right-padded with
    PAD_TOKEN; a position holds a token iff >= 0), valid [B, K] bool, author / likes / comments
    [B, K] int32; the shown comments: has_comment, comment_author, comment_likes [B, K] (the
    newest comment) or [B, K, C] (C comments newest first, `feed_view(..., num_comments=C)`),
    comment_tokens [B, K, L] or [B, K, C, L]; comment_ids [B, K, C] global ids (EMPTY where
    none is shown; the targets of comment actions) or None."""

    tokens: Array
    valid: Array
    author: Array
    likes: Array
    comments: Array
    has_comment: Array
    comment_tokens: Array
    comment_author: Array
    comment_likes: Array
    comment_ids: Optional[Array] = None


def feed_view(posts, slots: Array, valid: Array, num_comments: Optional[int] = None
              ) -> FeedView:
    """FeedView of feeds given as post slots [B, K] (`Feed.slots`, `Feed.valid`) of
    `state.posts`. A comment is shown while it is alive in the ring buffer and has text.

    num_comments None: the newest comment (`posts.last_comment`), fields [B, K]. An int C >= 1:
    the C newest comments (`last_comment`, then `posts.prev_comment`, kept when the society's
    `feed_comments` > 1), fields [B, K, C]; O(B K C) gathers."""
    last = posts.last_comment[slots]
    if num_comments is None:
        cslot = posts.slot(last)
        ctok = posts.tokens[cslot]
        has = valid & posts.alive(last) & jnp.any(ctok >= 0, axis=-1)
        return FeedView(tokens=posts.tokens[slots], valid=valid, author=posts.author[slots],
                        likes=posts.likes[slots], comments=posts.comments[slots],
                        has_comment=has, comment_tokens=ctok,
                        comment_author=posts.author[cslot], comment_likes=posts.likes[cslot])
    if num_comments < 1:
        raise ValueError(f"num_comments must be >= 1 (or None), got {num_comments}")
    chain, cur = [], jnp.where(valid, last, -1)
    for c in range(num_comments):
        chain.append(cur)
        if c + 1 < num_comments:
            cur = jnp.where(posts.alive(cur), posts.prev_comment[posts.slot(cur)], -1)
    cid = jnp.stack(chain, axis=-1)  # [B, K, C]
    cslot = posts.slot(cid)
    ctok = posts.tokens[cslot]
    has = valid[..., None] & posts.alive(cid) & jnp.any(ctok >= 0, axis=-1)
    return FeedView(tokens=posts.tokens[slots], valid=valid, author=posts.author[slots],
                    likes=posts.likes[slots], comments=posts.comments[slots], has_comment=has,
                    comment_tokens=ctok, comment_author=posts.author[cslot],
                    comment_likes=posts.likes[cslot], comment_ids=jnp.where(has, cid, -1))


def _name_pieces(t: PromptTemplate, author: Array, on: Array) -> List[Tuple[Array, Array]]:
    """Pieces of the names of `author` [B] (user ids) where `on` [B]: an agent's name row, or
    the crowd prefix + up to four digit groups of the id."""
    a = t.names.shape[0]
    u = jnp.maximum(author, 0).astype(jnp.int32)
    agent = on & (u < a)
    crowd = on & (u >= a)
    row = jnp.minimum(u, a - 1)
    pieces = [(t.names[row], jnp.where(agent, t.name_len[row], 0)),
              (_bcast(t.crowd_prefix, u.shape[0]), jnp.where(crowd, t.crowd_prefix.shape[0], 0))]
    pow10 = jnp.asarray(_POW10.astype(np.int32))
    nd = 1 + sum((u >= 10 ** i).astype(jnp.int32) for i in range(1, 10))  # digits of u
    for g in range(_NUM_GROUPS):
        end = jnp.minimum(3 * g + 3, nd)
        glen = jnp.clip(end - 3 * g, 0, 3)
        value = (u // pow10[jnp.clip(nd - end, 0, 9)]) % pow10[glen]
        idx = jnp.clip(jnp.asarray(_GROUP_BASE, jnp.int32)[glen] + value, 0,
                       t.groups.shape[0] - 1)
        pieces.append((t.groups[idx], jnp.where(crowd & (glen > 0), t.group_len[idx], 0)))
    return pieces


def _bcast(piece: Array, b: int) -> Array:
    return jnp.broadcast_to(piece, (b, piece.shape[0]))


def _count_pieces(t: PromptTemplate, n: Array, words: Array, word_len: Array, on: Array):
    idx = jnp.clip(n, 0, MAX_COUNT + 1)
    w = (n != 1).astype(jnp.int32)
    b = n.shape[0]
    return [(_bcast(t.count_sep, b), jnp.where(on, t.count_sep.shape[0], 0)),
            (t.counts[idx], jnp.where(on, t.count_len[idx], 0)),
            (words[w], jnp.where(on, word_len[w], 0))]


def assemble(template: PromptTemplate, agent_ids: Array, feed: FeedView) -> Tuple[Array, Array]:
    """Build left-padded prompts.

    agent_ids [B] int32 (rows of template.persona); feed a FeedView of [B, K] posts. Feed slot
    k keeps its label k+1 (labels are positions in the feed, so "like 3" always means the third
    shown slot). Returns (input_ids [B, max_len] int32, attention_mask [B, max_len] bool).
    """
    chex.assert_rank(feed.tokens, 3)
    b, k, _ = feed.tokens.shape
    t = template
    chex.assert_shape([feed.valid, feed.author, feed.likes, feed.comments], (b, k))
    if t.feed_comments:
        chex.assert_shape([feed.has_comment, feed.comment_author, feed.comment_likes],
                          (b, k, t.feed_comments))
        chex.assert_shape(feed.comment_tokens, (b, k, t.feed_comments, feed.tokens.shape[2]))
    else:
        chex.assert_shape([feed.has_comment, feed.comment_author, feed.comment_likes], (b, k))
        chex.assert_equal_shape([feed.tokens, feed.comment_tokens])
    def fixed(piece, on=None):
        return (_bcast(piece, b), jnp.full((b,), piece.shape[0], jnp.int32)
                                        if on is None else jnp.where(on, piece.shape[0], 0))
    pieces = [fixed(t.head), (t.persona[agent_ids], t.persona_len[agent_ids]), fixed(t.middle)]
    for j in range(k):
        on = feed.valid[:, j]
        con = (on & feed.has_comment[:, j] if t.newest_comment and not t.feed_comments
               else jnp.zeros_like(on))
        pieces += [(_bcast(t.labels[j], b), jnp.where(on, t.label_len[j], 0))]
        pieces += _name_pieces(t, feed.author[:, j], on)
        pieces += [fixed(t.name_sep, on),
                   (feed.tokens[:, j], jnp.where(on, jnp.sum(feed.tokens[:, j] >= 0, -1), 0))]
        pieces += _count_pieces(t, feed.likes[:, j], t.like_words, t.like_word_len, on)
        pieces += _count_pieces(t, feed.comments[:, j], t.comment_words, t.comment_word_len, on)
        def comment(author, ctok, likes, on):
            return (_name_pieces(t, author, on)
                    + [fixed(t.name_sep, on), (ctok, jnp.where(on, jnp.sum(ctok >= 0, -1), 0))]
                    + _count_pieces(t, likes, t.like_words, t.like_word_len, on))
        if t.feed_comments:
            for c in range(t.feed_comments):
                con = on & feed.has_comment[:, j, c]
                n = j * t.feed_comments + c
                pieces += [fixed(t.comment_line, con),
                           (_bcast(t.comment_labels[n], b),
                            jnp.where(con, t.comment_label_len[n], 0)),
                           fixed(t.comment_by, con)]
                pieces += comment(feed.comment_author[:, j, c], feed.comment_tokens[:, j, c],
                                  feed.comment_likes[:, j, c], con)
        elif t.newest_comment:
            pieces += [fixed(t.comment_head, con)]
            pieces += comment(feed.comment_author[:, j], feed.comment_tokens[:, j],
                              feed.comment_likes[:, j], con)
        pieces += [fixed(t.post_end, on)]
    pieces.append(fixed(t.tail))
    # One scatter: every piece's tokens side by side [B, W]; token w of piece p goes to
    # offset[p] + w when w < len[p], else it is dropped.
    widths = [p.shape[1] for p, _ in pieces]
    tokens = jnp.concatenate([p.astype(jnp.int32) for p, _ in pieces], axis=1)
    lengths = jnp.stack([n.astype(jnp.int32) for _, n in pieces], axis=1)  # [B, num_pieces]
    piece_of = np.repeat(np.arange(len(pieces)), widths)
    within = np.concatenate([np.arange(w) for w in widths])
    total = lengths.sum(axis=1)
    start = t.max_len - total  # left padding
    offsets = start[:, None] + jnp.cumsum(lengths, axis=1) - lengths
    pos = jnp.where(within[None, :] < lengths[:, piece_of],
                    offsets[:, piece_of] + within[None, :], t.max_len)  # out of range: dropped
    buf = jnp.full((b, t.max_len), t.pad_id, jnp.int32)
    buf = buf.at[jnp.arange(b)[:, None], pos].set(tokens, mode="drop")
    mask = jnp.arange(t.max_len)[None, :] >= start[:, None]
    return buf, mask
