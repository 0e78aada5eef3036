"""Crowd text grounded in the encoder's embedding space.

The society compares embeddings; the LLM agents read tokens. A `CrowdText` ties the two: banks of
real short texts (`jaxsocial/assets/crowd_posts.json`, written for the project: 14 topics, per
topic 4 interest descriptions, 24 posts and 10 comments), tokenized once and embedded once by
the frozen encoder (`train.epoch`: `EpochFns.embed`). Held in `SocialState.text`, it makes

- a seed or crowd **post** copy the tokens and embedding of a bank post drawn by its author's
  interest: Gumbel-max over `cos(interest, bank.embedding) / temperature`;
- a crowd **comment or quote** copy a comment-bank entry drawn by
  `normalize(interest + parent embedding)`;

so a crowd post's embedding *is* the encoder's embedding of the exact tokens agents see. With
`by_id=True` (the code society: problems must stay addressable as `post id % bank size`) entry
`id % Nb` of the post bank is used for every crowd-created post instead.

Crowd interests come from the descriptions (`society.reset(..., interests=TextBank)`: each crowd
user = normalize(embedding of a random description + noise)); LLM agents' interests are the
embeddings of their persona texts (`agent_interest`).

Tokens are right-padded with `PAD_TOKEN` and tokenized in leading-space form (`" " + text`), the
form a post takes after a feed label in a rendered prompt.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, List, Optional, Sequence, Tuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsocial.social.state import PAD_TOKEN, normalize

Array = jax.Array


@struct.dataclass
class TextBank:
    """Nb texts: tokens [Nb, L] int32 (right-padded with PAD_TOKEN), embedding [Nb, d] float32
    unit norm (the encoder's embedding of exactly those tokens), topic [Nb] int32."""
    tokens: Array
    embedding: Array
    topic: Array

    @property
    def size(self) -> int:
        return self.tokens.shape[0]


@struct.dataclass
class CrowdText:
    """What `SocialState.text` holds: the post bank (seed and crowd posts), the comment bank
    (crowd comments and quotes; the same length L), the choice temperature, and `by_id`."""
    posts: TextBank
    comments: TextBank
    temperature: Array  # [] float32: Gumbel-max temperature over cosine similarity
    by_id: bool = struct.field(pytree_node=False, default=False)


# ----------------------------------------------------------------------------------------------
# host side: the corpus, tokenization, embedding

def default_path() -> str:
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets",
                        "crowd_posts.json")


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Texts with topic ids (host side). `topics[i]` names topic id i."""
    topics: Tuple[str, ...]
    posts: Tuple[str, ...]
    post_topic: Tuple[int, ...]
    comments: Tuple[str, ...]
    comment_topic: Tuple[int, ...]
    interests: Tuple[str, ...]
    interest_topic: Tuple[int, ...]


def _undecodable(data: bytes, where: str) -> str:
    """The one-line reason `data` is not UTF-8: `where` at byte N (0x..), or "" when it is."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return (f"{where} is not UTF-8 text: byte {e.start} (0x{data[e.start]:02x}) "
                f"{e.reason}")
    return ""


def read_text_file(path: str, key: str) -> str:
    """The contents of the file at `path`, decoded as strict UTF-8. ValueError in one line
    naming `key` (the config key that gave the path), the path and, for text that is not UTF-8,
    the byte offset of the first undecodable byte; FileNotFoundError for a missing file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{key}={path!r}: no such file") from None
    except OSError as e:
        raise ValueError(f"{key}={path!r}: cannot read it ({e.strerror or e})") from None
    bad = _undecodable(data, f"{key}={path!r}")
    if bad:
        raise ValueError(f"{bad}; save the file as UTF-8")
    return data.decode("utf-8")


def read_lines(path: str, key: str, what: str = "text") -> Tuple[str, ...]:
    """The non-blank lines of a UTF-8 text file (`read_text_file`), stripped: e.g. one persona
    per line for `agents.personas`. Checked by `check_texts` (ValueError naming `key`)."""
    texts = tuple(line.strip() for line in read_text_file(path, key).splitlines()
                  if line.strip())
    if not texts:
        raise ValueError(f"{key}={path!r} holds no {what}: give at least one {what} (one per "
                         f"line)")
    return check_texts(texts, key, what)


def check_texts(texts, key: str, what: str = "text") -> Tuple[str, ...]:
    """`texts` as a tuple of str, or ValueError in one line naming `key` (e.g.
    "agents.personas") and the bad entry: an empty sequence ("agents.personas is empty: give at
    least one persona"), a lone string where a sequence is meant, an entry that is bytes (with
    the first undecodable byte when it is not UTF-8 either), not a string, blank, or holding
    characters that cannot be encoded (lone surrogates, as `errors="surrogateescape"` makes
    from a file that is not UTF-8)."""
    if isinstance(texts, (str, bytes)):
        raise ValueError(f"{key} is a single {type(texts).__name__}, not a sequence: give a "
                         f"tuple of {what}s, e.g. ({str(texts)[:30]!r},)")
    try:
        texts = tuple(texts)
    except TypeError:
        raise ValueError(f"{key}={texts!r} is not a sequence of {what}s") from None
    if not texts:
        raise ValueError(f"{key} is empty: give at least one {what}")
    for i, t in enumerate(texts):
        where = f"{key}[{i}]"
        if isinstance(t, (bytes, bytearray)):
            bad = _undecodable(bytes(t), where)
            raise ValueError(bad + " (and is bytes, not str)" if bad else
                             f"{where} is bytes, not str: decode it as UTF-8 first")
        if not isinstance(t, str):
            raise ValueError(f"{where} is {type(t).__name__}, not a string")
        if not t.strip():
            raise ValueError(f"{where} is blank: every {what} needs some text")
        try:
            t.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{where} holds an undecodable character at position {e.start} "
                             f"({t[e.start]!r}: a byte that was not UTF-8 where it was read); "
                             f"read the file as UTF-8") from None
    return texts


def load_corpus(path: Optional[str] = None) -> Corpus:
    """Read the crowd corpus JSON (`{"topics": [{"name", "interests", "posts", "comments"}]}`).
    ValueError in one line naming the path for a file that is missing, not UTF-8 (with the
    byte offset), not JSON or not of this shape."""
    path = path or default_path()
    try:
        text = read_text_file(path, "crowd_text.path")
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None
    try:
        data = json.loads(text)
        topics = data["topics"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot read crowd corpus {path!r}: {e}") from None
    fields = {k: ([], []) for k in ("posts", "comments", "interests")}
    for i, t in enumerate(topics):
        for k, (texts, ids) in fields.items():
            items = t.get(k) or []
            if not items or not all(isinstance(s, str) and s.strip() for s in items):
                raise ValueError(f"crowd corpus {path!r}: topic {t.get('name', i)!r} needs a "
                                 f"non-empty list of non-empty strings under {k!r}")
            texts += items
            ids += [i] * len(items)
    names = tuple(str(t["name"]) for t in topics)
    return Corpus(topics=names, **{k: tuple(v[0]) for k, v in fields.items()},
                  post_topic=tuple(fields["posts"][1]),
                  comment_topic=tuple(fields["comments"][1]),
                  interest_topic=tuple(fields["interests"][1]))


def topic_ids(corpus: Corpus, names: Sequence[str]) -> List[int]:
    """Topic ids of `names` (ValueError names an unknown topic)."""
    out = []
    for n in names:
        if n not in corpus.topics:
            raise ValueError(f"unknown crowd topic {n!r}; known: {', '.join(corpus.topics)}")
        out.append(corpus.topics.index(n))
    return out


def tokenize(tokenizer, texts: Sequence[str], length: Optional[int] = None) -> np.ndarray:
    """[n, length] int32 ids of `" " + text` (leading-space form), truncated to `length` (None:
    the longest), right-padded with PAD_TOKEN."""
    rows = [tokenizer.encode(" " + t, add_special_tokens=False) for t in texts]
    length = length or max(1, max(len(r) for r in rows))
    out = np.full((len(rows), length), PAD_TOKEN, np.int32)
    for i, r in enumerate(rows):
        r = r[:length]
        out[i, :len(r)] = r
    return out


def embed_rows(embed_fn: Callable[[Array], Array], tokens: np.ndarray,
               chunk: int = 64) -> np.ndarray:
    """Apply `embed_fn` ([chunk, L] int32 -> [chunk, d]) over fixed-size chunks of `tokens`
    [n, L] (one compiled shape; the last chunk is padded with PAD rows). Returns [n, d]."""
    n = tokens.shape[0]
    chunk = max(1, min(chunk, n))
    pad = -n % chunk
    padded = np.concatenate([tokens, np.full((pad, tokens.shape[1]), PAD_TOKEN, np.int32)])
    out = [np.asarray(embed_fn(jnp.asarray(padded[i:i + chunk])))
           for i in range(0, len(padded), chunk)]
    return np.concatenate(out)[:n].astype(np.float32)


def make_bank(tokens: np.ndarray, embedding: np.ndarray, topic: Sequence[int]) -> TextBank:
    """A TextBank from host arrays (checks shapes; embeddings must be finite and unit norm:
    non-finite ones, NaN or inf, are named as such, since they come from non-finite encoder
    weights or activations rather than from a missing normalisation)."""
    tokens, embedding = np.asarray(tokens, np.int32), np.asarray(embedding, np.float32)
    topic = np.asarray(topic, np.int32)
    n = tokens.shape[0]
    if tokens.ndim != 2 or embedding.shape[:1] != (n,) or topic.shape != (n,) or n < 1:
        raise ValueError(f"text bank needs tokens [Nb, L], embedding [Nb, d], topic [Nb] with "
                         f"Nb >= 1; got {tokens.shape}, {embedding.shape}, {topic.shape}")
    finite = np.isfinite(embedding).all(axis=-1)
    if not finite.all():
        nan = int(np.isnan(embedding).any(axis=-1).sum())
        raise ValueError(f"text bank embeddings are non-finite: {int((~finite).sum())} of {n} "
                         f"rows hold NaN or inf ({nan} NaN), so the encoder (the model's "
                         f"weights or activations) produced non-finite values; check the "
                         f"checkpoint's weights")
    norm = np.linalg.norm(embedding, axis=-1)
    if not np.allclose(norm, 1.0, atol=1e-3):
        raise ValueError(f"text bank embeddings must be unit norm (norms in "
                         f"[{norm.min():.3g}, {norm.max():.3g}])")
    return TextBank(tokens=jnp.asarray(tokens), embedding=jnp.asarray(embedding),
                    topic=jnp.asarray(topic))


def topic_centroids(bank: TextBank, num_topics: int) -> Array:
    """[num_topics, d] unit mean embedding of each topic's entries (zero for an empty topic)."""
    onehot = jax.nn.one_hot(bank.topic, num_topics, dtype=jnp.float32)  # [Nb, T]
    return normalize(onehot.T @ bank.embedding)


# ----------------------------------------------------------------------------------------------
# inside jit: drawing entries

def choose(key: Array, bank: TextBank, query: Array, temperature) -> Array:
    """Gumbel-max draw of one entry per query: query [B, d] -> index [B] int32, with
    P(i) = softmax_i(cos(query, bank.embedding[i]) / temperature)."""
    chex.assert_rank(query, 2)
    logits = normalize(query) @ bank.embedding.T / temperature  # [B, Nb]
    return jnp.argmax(logits + jax.random.gumbel(key, logits.shape), axis=1).astype(jnp.int32)


def draw_posts(key: Array, text: CrowdText, interest: Array) -> Tuple[Array, Array, Array]:
    """Post text for authors of interest [B, d]: (tokens [B, L], embedding [B, d], index [B])."""
    i = choose(key, text.posts, interest, text.temperature)
    return text.posts.tokens[i], text.posts.embedding[i], i


def draw_replies(key: Array, text: CrowdText, interest: Array, parent: Array
                 ) -> Tuple[Array, Array, Array]:
    """Comment / quote text for authors of interest [B, d] replying to posts of embedding
    parent [B, d]: drawn by normalize(interest + parent). Returns (tokens, embedding, index)."""
    i = choose(key, text.comments, normalize(interest) + normalize(parent), text.temperature)
    return text.comments.tokens[i], text.comments.embedding[i], i


def by_id(text: CrowdText, ids: Array) -> Tuple[Array, Array]:
    """Post-bank entry `id % Nb` for global post ids [B]: (tokens [B, L], embedding [B, d])."""
    i = jnp.maximum(ids, 0) % text.posts.size
    return text.posts.tokens[i], text.posts.embedding[i]
