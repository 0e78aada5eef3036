"""OASIS's search_posts, search_user and trend as array ops, and their delivery to the agents.

A query is an embedding `[d]` (the caller embeds the agent's query text with the same frozen
encoder that embeds posts, so a query and the posts it should find share one space):

- `search_posts`: the K live posts (kind post or quote: no comments, no reposts, whose text is
  their original's) with the largest cos(query, post embedding);
- `search_user`: the K users (not the searcher) with the largest cos(query, interest), the
  interest being the user's bio embedding, among users with a live latest post; the result
  shows that latest post of each (`users.last_post`), so "follow <n>" follows its author;
- `trend`: the K most-liked live posts (post or quote) created in the last `trend_window`
  ticks, ties newest first (OASIS: its trend action's top posts by likes over a recent window).

Ties in cos resolve towards the lower ring slot / user id (`lax.top_k`'s order).  Results are
not filtered by mutes or seen posts (an explicit request, as in OASIS; "unmute" needs to find a
muted user's post).  Cost: O(B (P + N) d) for a batch of B queries, in chunks of
`_CHUNK` rows (a running top-K), so no `[B, P]` matrix exists at scale; `deliver` runs it only
in ticks where some agent searched.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxsocial.social.actions import SEARCH_TYPES, ActionBatch, ActionType, ApplyInfo, Reason
from jaxsocial.social.state import EMPTY, PostKind, SocialParams, SocialState, normalize

_NEG = -jnp.inf
_CHUNK = 16384  # rows (posts or users) scored per step of the running top-k (tests shrink it)
_INT_MAX = jnp.iinfo(jnp.int32).max


def _top_k_cos(query, emb, ok, k: int):
    """Top-k of `normalize(query) @ normalize(emb).T` per query row over rows with `ok`:
    (score `[B, k]` (-inf past the valid ones), index `[B, k]` int32).  query `[B, d]`,
    emb `[X, d]`, ok `[X]`.  Equal to `lax.top_k` over the whole `[B, X]` matrix (ties: lower
    index), computed `_CHUNK` rows of `emb` at a time."""
    chex.assert_rank([query, emb], 2)
    b, x = query.shape[0], emb.shape[0]
    q = normalize(query.astype(jnp.float32))
    e = normalize(emb.astype(jnp.float32))
    k = min(k, x)
    if x <= _CHUNK:
        s = jnp.where(ok[None, :], q @ e.T, _NEG)
        v, i = jax.lax.top_k(s, k)
        return v, i.astype(jnp.int32)
    nc = -(-x // _CHUNK)
    pad = nc * _CHUNK - x
    e = jnp.pad(e, ((0, pad), (0, 0))).reshape(nc, _CHUNK, -1)
    okc = jnp.pad(ok, (0, pad)).reshape(nc, _CHUNK)

    def body(carry, xs):
        v, i = carry
        ec, oc, base = xs
        s = jnp.where(oc[None, :], q @ ec.T, _NEG)
        # running entries first: among equal scores they hold the lower indices
        allv = jnp.concatenate([v, s], axis=1)
        alli = jnp.concatenate([i, base + jnp.broadcast_to(jnp.arange(_CHUNK, dtype=jnp.int32),
                                                          (b, _CHUNK))], axis=1)
        nv, at = jax.lax.top_k(allv, k)
        return (nv, jnp.take_along_axis(alli, at, axis=1)), None

    init = (jnp.full((b, k), _NEG, jnp.float32), jnp.zeros((b, k), jnp.int32))
    bases = jnp.arange(nc, dtype=jnp.int32) * _CHUNK
    (v, i), _ = jax.lax.scan(body, init, (e, okc, bases))
    return v, i


def _pad_k(ids, score, k):
    if ids.shape[1] < k:
        extra = k - ids.shape[1]
        ids = jnp.pad(ids, ((0, 0), (0, extra)), constant_values=EMPTY)
        score = jnp.pad(score, ((0, 0), (0, extra)), constant_values=_NEG)
    return ids, score


def _searchable(state: SocialState) -> jax.Array:
    """[P] bool: live posts of kind post or quote."""
    p = state.posts
    return (p.id >= 0) & ((p.kind == PostKind.POST) | (p.kind == PostKind.QUOTE))


def search_posts(state: SocialState, query: jax.Array, params: SocialParams, k: int):
    """Posts best matching each query: (ids `[B, k]` int32 global post ids, EMPTY past the
    matches; score `[B, k]` float32 cos, -inf where EMPTY).  query `[B, d]`."""
    chex.assert_shape(query, (None, params.embed_dim))
    posts = state.posts
    v, slot = _top_k_cos(query, posts.embedding, _searchable(state), k)
    ids = jnp.where(jnp.isfinite(v), posts.id[slot], EMPTY)
    return _pad_k(ids, v, k)


def search_user(state: SocialState, query: jax.Array, actor: jax.Array, params: SocialParams,
                k: int):
    """Users best matching each query, shown by their latest post: (ids `[B, k]` int32 global
    ids of the users' `last_post`, EMPTY past the matches; score `[B, k]` cos(query, interest)).
    query `[B, d]`, actor `[B]` (the searcher, excluded)."""
    chex.assert_shape(query, (None, params.embed_dim))
    chex.assert_shape(actor, (query.shape[0],))
    users, posts = state.users, state.posts
    has_post = posts.alive(users.last_post)
    v, u = _top_k_cos(query, users.interest, has_post, k + 1)
    v = jnp.where(u == actor[:, None], _NEG, v)  # the searcher: drop, keep the order
    v, at = jax.lax.top_k(v, min(k, v.shape[1]))
    u = jnp.take_along_axis(u, at, axis=1)
    ids = jnp.where(jnp.isfinite(v), users.last_post[u], EMPTY)
    return _pad_k(ids, v, k)


def trend(state: SocialState, params: SocialParams, k: int):
    """The k most-liked posts (post or quote) created in the last `trend_window` ticks
    (`tick - created_at < trend_window`), ties newest first: ids `[k]` int32 (EMPTY past them).
    One sort of the buffer, O(P log P)."""
    posts = state.posts
    recent = _searchable(state) & (state.tick - posts.created_at < params.trend_window)
    k1 = jnp.where(recent, -posts.likes, _INT_MAX)
    k2 = jnp.where(recent, -posts.id, _INT_MAX)
    s1, _, sid = jax.lax.sort((k1, k2, posts.id), num_keys=2)
    k = min(k, posts.capacity)
    ids = jnp.where(s1[:k] != _INT_MAX, sid[:k], EMPTY)
    return jnp.pad(ids, (0, params.feed_size - k), constant_values=EMPTY) \
        if k < params.feed_size else ids


def results(state: SocialState, actions: ActionBatch, params: SocialParams) -> jax.Array:
    """What each row of `actions` found, by its type: ids `[B, K]` (K = feed_size; EMPTY for
    rows that are not searches).  Query = `actions.embedding`."""
    kf = params.feed_size
    t = actions.type
    sp, _ = search_posts(state, actions.embedding, params, kf)
    su, _ = search_user(state, actions.embedding, actions.actor, params, kf)
    tr = jnp.broadcast_to(trend(state, params, kf)[None, :], sp.shape)
    ids = jnp.where((t == ActionType.SEARCH_POSTS)[:, None], sp,
                    jnp.where((t == ActionType.SEARCH_USER)[:, None], su, tr))
    is_search = jnp.isin(t, jnp.asarray([int(x) for x in SEARCH_TYPES]))
    return jnp.where(is_search[:, None], ids, EMPTY)


def deliver(state: SocialState, actions: ActionBatch, info: ApplyInfo, params: SocialParams
            ) -> SocialState:
    """Put the results of the accepted search / trend rows of LLM agents (actor <
    num_agents) in their inbox (`state.inbox`): their next `society.observe` shows them.  The
    search runs on `state` (the state after the batch) and only in a tick where some agent
    searched (`lax.cond`).  One row per agent in a batch (as the training loop sends)."""
    a, b = params.num_agents, actions.size
    if a == 0 or b == 0:
        return state
    t = actions.type
    is_search = jnp.isin(t, jnp.asarray([int(x) for x in SEARCH_TYPES]))
    mine = (info.reason == Reason.OK) & is_search & (actions.actor >= 0) & (actions.actor < a)
    ids = jax.lax.cond(jnp.any(mine), lambda: results(state, actions, params),
                       lambda: jnp.full((b, params.feed_size), EMPTY, jnp.int32))
    row = jnp.where(mine, actions.actor, a)  # out of range -> dropped
    inbox = state.inbox
    return state.replace(inbox=inbox.replace(
        ids=inbox.ids.at[row].set(ids, mode="drop"),
        pending=inbox.pending.at[row].set(True, mode="drop")))
