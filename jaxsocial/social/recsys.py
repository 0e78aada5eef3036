"""Recommender systems: random, reddit hot, personalized ("twitter"), TwHIN ("twhin"), and your
own (`register`: a scoring function over twitter's candidates).  Batched over users.

Every recommender scores a candidate set per user and keeps the top K:
- shared pool: the C best posts of the whole buffer by a user-independent prior (O(P) once),
  or (twhin) C uniformly random live posts, as OASIS's TwHIN recommender samples 4,000,
- per-user in-network candidates (twitter only): the latest post of I sampled followees,
so the cost is O(P + B (C + I) d) -- never a dense users x posts matrix.  Then a cheap pass over
the top `K + overfetch` drops duplicates and posts by muted authors and keeps the best K.  Posts
already shown to the user (its seen ring) are excluded or down-weighted per `seen_policy` before
the top-k, by binary search of the seen ids in the shared pool (O(B S log C)).  reddit's pool is
one hot-score order shared by all users, so its feeds skip the per-user top-k: each is the first
pool entries passing the user's filters (`_reddit_fast`, O(B (K + S) D) with D ~ S + 5 M).
"""
from __future__ import annotations

from typing import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsocial.social.state import (
    EMPTY,
    RECSYS_NAMES,
    REGISTERED_RECSYS,
    PostKind,
    SocialParams,
    SocialState,
    normalize,
)

REDDIT_EPOCH_SECONDS = 1134028003  # OASIS / reddit's reference epoch
_NEG = -jnp.inf


@struct.dataclass
class Feed:
    """Feeds of B users.  `slots` index the post arrays: `state.posts.tokens[feed.slots]` is
    `[B, K, L]`; `ids` are the global post ids to use as action targets."""
    ids: jax.Array  # [B, K] int32 global post ids, EMPTY where not valid
    slots: jax.Array  # [B, K] int32 ring slots (ids % P), 0 where not valid
    valid: jax.Array  # [B, K] bool
    score: jax.Array  # [B, K] float32 recommender score (descending), -inf where not valid


def reddit_hot_score(likes, dislikes, created_at_seconds, reference_seconds=None):
    """OASIS's reddit hot score, elementwise.

      s = likes - dislikes;  order = log10(max(|s|, 1));  sign = sign(s)
      hot = sign * order + (created_at_seconds - 1134028003) / 45000

    (OASIS then rounds to 7 decimals in float64; float32 keeps ~1e-3 absolute at today's
    magnitudes ~ 1.3e4.)  With `reference_seconds`, returns `hot - (reference - 1134028003)/45000`
    computed as `(created - reference) / 45000`: same ranking, full float32 precision -- the form
    the recommender uses.  Integer seconds in, float32 out.
    """
    s = jnp.asarray(likes, jnp.int32) - jnp.asarray(dislikes, jnp.int32)
    order = jnp.log10(jnp.maximum(jnp.abs(s), 1).astype(jnp.float32))
    sign = jnp.sign(s).astype(jnp.float32)
    ref = REDDIT_EPOCH_SECONDS if reference_seconds is None else reference_seconds
    seconds = (jnp.asarray(created_at_seconds, jnp.int32) - jnp.asarray(ref, jnp.int32))
    return sign * order + seconds.astype(jnp.float32) / 45000.0


def recency_decay(age, kind: str = "exp", tau=24.0):
    """Monotone non-increasing, finite recency factor of a post `age` ticks old.

    - "exp": exp(-max(age, 0) / tau)
    - "oasis_clipped": max(ln((271.8 - age) / 100), 0) -- OASIS's TwHIN factor, clipped at 0 so
      it never goes negative (OASIS's inverts the ranking after 171.8 steps, NaN after 271.8).
    """
    age = jnp.maximum(jnp.asarray(age, jnp.float32), 0.0)
    if kind == "exp":
        return jnp.exp(-age / tau)
    if kind == "oasis_clipped":
        return jnp.maximum(jnp.log(jnp.maximum((271.8 - age) / 100.0, 1.0)), 0.0)
    raise ValueError(f"unknown recency kind {kind!r}")


def personalized_score(user_emb, post_emb, age, likes, in_network, *, w_sim=1.0, w_rec=1.0,
                       w_pop=0.3, w_in=0.5, recency="exp", tau=24.0):
    """Personalized ("twitter") score of posts for users.

      score[b, c] = w_sim * cos(user_emb[b], post_emb[.., c])
                  + w_rec * recency_decay(age[.., c])
                  + w_pop * log1p(max(likes[.., c], 0))
                  + w_in  * in_network[.., c]

    user_emb `[B, d]`; post_emb `[C, d]` (shared pool) or `[B, C, d]` (per user); age, likes,
    in_network `[C]` or `[B, C]`.  Returns `[B, C]` float32.
    """
    u = user_emb / jnp.maximum(jnp.linalg.norm(user_emb, axis=-1, keepdims=True), 1e-6)
    p = post_emb / jnp.maximum(jnp.linalg.norm(post_emb, axis=-1, keepdims=True), 1e-6)
    cos = u @ p.T if p.ndim == 2 else jnp.einsum("bd,bcd->bc", u, p)
    return _personalized_from_cos(cos, age, likes, in_network, w_sim, w_rec, w_pop, w_in,
                                  recency, tau)


def _personalized_from_cos(cos, age, likes, in_network, w_sim, w_rec, w_pop, w_in, recency,
                           tau):
    prior = (w_rec * recency_decay(age, recency, tau)
             + w_pop * jnp.log1p(jnp.maximum(jnp.asarray(likes, jnp.float32), 0.0))
             + w_in * jnp.asarray(in_network, jnp.float32))
    return w_sim * cos + prior


def twhin_score(profile, post_emb, age):
    """OASIS's personalized TwHIN score: cos(profile, post) * recency(age), with OASIS's recency
    ln((271.8 - age) / 100) clipped at 0 (`recency_decay(age, "oasis_clipped")`), so posts older
    than 171.8 ticks score 0 instead of inverting the ranking.  (A negative cosine times a smaller
    recency is still a *higher* score: OASIS's product, kept as published.)

    profile `[B, d]` (any norm: the running-mean profile or its sum); post_emb `[C, d]`;
    age `[C]` ticks.  Returns `[B, C]` float32.
    """
    return normalize(profile) @ _twhin_post_side(post_emb, age).T


def _twhin_post_side(post_emb, age):
    """`[C, d]` normalize(post) * recency: the recency folded into the posts' side (once per
    tick, not once per user x post)."""
    return normalize(post_emb) * recency_decay(age, "oasis_clipped")[:, None]


def twhin_candidates(key, state: SocialState, params: SocialParams):
    """The TwHIN recommender's shared candidates: a uniform random subset of
    C = min(twhin_candidates, P) slots among the live non-comment posts (all of them when fewer
    are live; the rest are marked invalid).  Same key, same set.  Returns (slots `[C]` int32,
    valid `[C]` bool).  O(P log C)."""
    posts = state.posts
    live = (posts.id >= 0) & (posts.kind != PostKind.COMMENT)
    c = min(params.twhin_candidates, posts.capacity)
    r = jnp.where(live, jax.random.uniform(key, (posts.capacity,)), -1.0)
    _, slot = jax.lax.top_k(r, c)
    return slot.astype(jnp.int32), live[slot]


_TWHIN_BLOCK = 512  # users per block of _twhin_top
_TOPK_GROUP = 16  # columns per group of _top_k_grouped (both module-level: tests shrink them)


def _top_k_grouped(x, k: int, group: int | None = None):
    """`lax.top_k(x, k)` over the last axis of `x [R, C]` (the same values; among equal values
    possibly other indices), via the columns' groups of `group`: the top k lie in the k groups
    with the largest maxima (a group outside them has k groups at least as large above it, each
    holding a distinct element >= its max), so one cheap max pass over `[R, C]` and two top-k of
    size C / group and k * group replace the top-k over C (~1.4x faster at C = 4,000)."""
    group = group or _TOPK_GROUP
    r, c = x.shape
    ng = -(-c // group)
    if k * group >= c or k > ng:
        return jax.lax.top_k(x, k)
    xp = jnp.pad(x, ((0, 0), (0, ng * group - c)), constant_values=_NEG).reshape(r, ng, group)
    _, gi = jax.lax.top_k(jnp.max(xp, axis=2), k)
    gi = jnp.sort(gi, axis=1)  # keep column order: ties resolve towards lower columns
    cand = jnp.take_along_axis(xp, gi[:, :, None], axis=1).reshape(r, k * group)
    v, j = jax.lax.top_k(cand, k)
    return v, jnp.take_along_axis(gi, j // group, axis=1) * group + j % group


def _twhin_top(key, state: SocialState, u, seen, params: SocialParams):
    """The twhin candidates' best `K + overfetch` per user: (score `[B, X]`, ids `[B, X]`).

    Scores `[b, C]` (twhin_score; -inf for invalid candidates, own posts, and per the seen
    policy) are built and cut to the top X one block of 512 users at a time (`lax.map`), so
    the `[B, C]` matrix never exists: at C = 4,000 a block stays in cache, where the whole
    matrix (1 GB at B = 6e4) would be streamed through memory once per pass."""
    posts = state.posts
    cslot, cok = twhin_candidates(key, state, params)
    c = cslot.shape[0]
    pid = jnp.where(cok, posts.id[cslot], EMPTY)
    cauthor = jnp.where(cok, posts.author[cslot], EMPTY)
    age = state.tick - posts.created_at[cslot]
    post = _twhin_post_side(posts.embedding[cslot], age)  # twhin_score = prof @ post.T
    x = min(c, params.feed_size + params.overfetch)
    b = u.shape[0]
    ch = min(_TWHIN_BLOCK, b)
    nb = -(-b // ch)
    pad = nb * ch - b
    prof = normalize(state.users.profile_sum[u])
    blocks = (jnp.pad(prof, ((0, pad), (0, 0))).reshape(nb, ch, -1),
              jnp.pad(u, (0, pad)).reshape(nb, ch),
              jnp.pad(seen, ((0, pad), (0, 0)), constant_values=EMPTY).reshape(nb, ch, -1))

    def block(args):
        pr, ub, sb = args
        sc = pr @ post.T  # [ch, C]
        bad = ~cok[None, :]
        if params.exclude_own:
            bad = bad | (cauthor[None, :] == ub[:, None])
        sc = _pool_seen(jnp.where(bad, _NEG, sc), pid, sb, params)
        top, at = _top_k_grouped(sc, x)
        return top, jnp.where(jnp.isfinite(top), pid[jnp.minimum(at, c - 1)], EMPTY)

    score, ids = jax.lax.map(block, blocks)
    return score.reshape(nb * ch, x)[:b], ids.reshape(nb * ch, x)[:b]


def post_seconds(state: SocialState, params: SocialParams, created_at_tick):
    """Wall-clock seconds of a tick: start_seconds + tick * seconds_per_tick (int32)."""
    return params.start_seconds + created_at_tick * params.seconds_per_tick


def _pool(key, state: SocialState, params: SocialParams):
    """Shared candidates: the top `pool_size` posts by the recommender's user-independent prior,
    plus (twitter) `pool_random` uniformly drawn live posts for diversity.  O(P)."""
    posts = state.posts
    cap = posts.capacity
    live = (posts.id >= 0) & (posts.kind != PostKind.COMMENT)
    age = (state.tick - posts.created_at).astype(jnp.float32)
    if params.recsys == "reddit":
        prior = reddit_hot_score(posts.likes, posts.dislikes,
                                 post_seconds(state, params, posts.created_at),
                                 reference_seconds=post_seconds(state, params, state.tick))
    else:
        prior = _personalized_from_cos(0.0, age, posts.likes, 0.0, params.w_sim, params.w_rec,
                                       params.w_pop, params.w_in, params.recency,
                                       params.recency_tau)
    prior = jnp.where(live, prior, _NEG)
    c = min(params.pool_size, cap)
    score, slot = jax.lax.top_k(prior, c)
    if params.recsys != "reddit" and params.pool_random > 0:  # twitter, registered
        lo = jnp.maximum(posts.next_id - cap, 0)
        rid = lo + jnp.floor(jax.random.uniform(key, (params.pool_random,))
                             * (posts.next_id - lo)).astype(jnp.int32)
        rslot = posts.slot(rid)
        slot = jnp.concatenate([slot, rslot])
        score = jnp.concatenate([score, prior[rslot]])  # -inf for comments / empty slots
        x = slot.shape[0]
        dup = jnp.any((slot[:, None] == slot[None, :]) & jnp.tril(jnp.ones((x, x), bool), -1),
                      axis=1)
        score = jnp.where(dup, _NEG, score)
    return slot, score


def _seen_adjust(score, hit, params: SocialParams):
    if params.seen_policy == "exclude":
        return jnp.where(hit, _NEG, score)
    if params.seen_policy == "downweight":
        return score - params.seen_penalty * hit
    return score


def _pool_seen(score, pid, seen, params: SocialParams):
    """Apply the seen policy to a shared pool `pid [C]` for users' seen rings `seen [B, S]`:
    binary search of each seen id in the sorted pool, O(B S log C) -- no [B, C, S] compare."""
    if params.seen_policy == "none":
        return score
    order = jnp.argsort(pid)
    sorted_ids = pid[order]
    pos = jnp.clip(jnp.searchsorted(sorted_ids, seen), 0, pid.shape[0] - 1)  # [B, S]
    hit = (sorted_ids[pos] == seen) & (seen >= 0)
    b = seen.shape[0]
    rows = jnp.where(hit, jnp.arange(b)[:, None], b)
    mask = jnp.zeros(score.shape, bool).at[rows, order[pos]].set(True, mode="drop")
    return _seen_adjust(score, mask, params)


def _in_network(key, state: SocialState, u, params: SocialParams):
    """In-network candidates of users `u [B]`: the latest post of I = `in_network` followees,
    I consecutive (cyclically, from a random offset) non-empty entries of the following row:
    distinct when the user follows >= I accounts, all of them otherwise.  (ids `[B, I]` int32,
    alive `[B, I]` bool)."""
    row = state.graph.following[u]  # [B, F]
    cnt = jnp.cumsum(row >= 0, axis=1)  # [B, F]
    total = cnt[:, -1:]
    offset = jax.random.randint(key, (u.shape[0], 1), 0, params.max_following)
    r = (offset + jnp.arange(params.in_network)[None]) % jnp.maximum(total, 1)
    col = jnp.sum(cnt[:, None, :] <= r[:, :, None], axis=2)  # (r+1)-th entry
    followee = jnp.take_along_axis(row, jnp.minimum(col, params.max_following - 1), axis=1)
    followee = jnp.where(total > 0, followee, EMPTY)  # [B, I]
    iid = jnp.where(followee >= 0, state.users.last_post[jnp.maximum(followee, 0)], EMPTY)
    return iid, state.posts.alive(iid)


# ---------------------------------------------------------------------------------------------
# Your own recommender: a registered scoring function ranks twitter's candidates
# (the registry is `state.REGISTERED_RECSYS`, where SocialParams checks names against it)


def register(name: str, fn: Callable) -> None:
    """Register `fn` as the recommender `name`: `SocialParams.recsys=name` (a run's
    `society.recsys`) selects it, and the config checks accept the name from then on.

        scores = fn(user, candidates, state)

    - `user` `[B]` int32: the users whose feeds are built (valid ids);
    - `candidates` `[B, C]` int32: global post ids, `EMPTY` (-1) where a column holds no
      candidate (its score is ignored); `state.posts.slot(candidates)` indexes the post arrays;
    - `state`: the `SocialState`;
    - returns `scores` `[B, C]`, real (used as float32), finite, higher first.

    The candidates are twitter's: the shared pool (the top `pool_size` live posts by
    `w_rec decay(age) + w_pop log1p(likes)`, then `pool_random` uniform draws) in the first
    min(pool_size, P) + pool_random columns, then the latest posts of `in_network` followees.
    Everything else is the built-ins' (`recommend`): no comments, own or muted authors'
    posts, the seen policy, duplicates dropped, the top K, exploration.  `fn` runs inside the
    jitted tick (write it in jax.numpy); a result of the wrong shape or dtype is refused when
    the tick is traced, non-finite scores by `check` (once, on the real state).  Registering a
    name again replaces its function and clears JAX's in-memory compilation caches (compiled
    ticks key on the name, not on the function).
    """
    if not (isinstance(name, str) and name.isidentifier()):
        raise ValueError(f"recsys.register: name {name!r} must be an identifier")
    if name in RECSYS_NAMES:
        raise ValueError(f"recsys.register: {name!r} is a built-in recommender "
                         f"({', '.join(RECSYS_NAMES)}); choose another name")
    if not callable(fn):
        raise ValueError(f"recsys.register: {name!r} needs a callable "
                         f"fn(user, candidates, state), got {fn!r}")
    if REGISTERED_RECSYS.get(name, fn) is not fn:
        jax.clear_caches()
    REGISTERED_RECSYS[name] = fn


def registered() -> tuple[str, ...]:
    """The registered recommenders' names, in registration order."""
    return tuple(REGISTERED_RECSYS)


def _describe(fn) -> str:
    return f"{getattr(fn, '__module__', None) or '?'}.{getattr(fn, '__qualname__', repr(fn))}"


def _registered_candidates(k_pool, k_in, state: SocialState, u, params: SocialParams):
    """A registered recommender's candidates `[B, C]` (EMPTY where none): the shared pool's ids
    `[C0]` (`_pool`, twitter's; returned too), then `_in_network`'s."""
    posts = state.posts
    pslot, pprior = _pool(k_pool, state, params)
    pid = jnp.where(jnp.isfinite(pprior), posts.id[pslot], EMPTY)
    ids = jnp.broadcast_to(pid, (u.shape[0], pid.shape[0]))
    if params.in_network > 0:
        iid, iok = _in_network(k_in, state, u, params)
        ids = jnp.concatenate([ids, jnp.where(iok, iid, EMPTY)], axis=1)
    return ids, pid


def _call_registered(name: str, u, ids, state: SocialState):
    """The registered `fn(u, ids, state)` as float32 `[B, C]`; ValueError naming the
    function where its result has another shape or is not real (at trace time)."""
    fn = REGISTERED_RECSYS[name]
    score = fn(u, ids, state)
    shape, dtype = getattr(score, "shape", None), getattr(score, "dtype", None)
    if shape is None or tuple(shape) != ids.shape or not (
            jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)):
        got = (f"{dtype} of shape {tuple(shape)}" if shape is not None
               else type(score).__name__)
        raise ValueError(f"recsys {name!r}: {_describe(fn)}(user [B], candidates [B, C], "
                         f"state) returned {got}; expected real scores [B, C] = {ids.shape}")
    return score.astype(jnp.float32)


def _registered_scores(k_pool, k_in, state: SocialState, u, seen, params: SocialParams):
    """(ids `[B, C]`, score `[B, C]`) of a registered recommender: its function's scores, -inf
    for empty candidates and own posts, the seen policy applied -- by the pool's ids and authors
    `[C0]` and the in-network columns `[B, I]`, as twitter's (no `[B, C]` author gather)."""
    posts = state.posts
    ids, pid = _registered_candidates(k_pool, k_in, state, u, params)
    c = pid.shape[0]
    score = _call_registered(params.recsys, u, ids, state)
    pool = jnp.where(pid >= 0, score[:, :c], _NEG)
    if params.exclude_own:
        pool = jnp.where(posts.author[posts.slot(pid)][None, :] == u[:, None], _NEG, pool)
    parts = [_pool_seen(pool, pid, seen, params)]
    if ids.shape[1] > c:  # in-network columns
        extra = ids[:, c:]
        ok = extra >= 0
        if params.exclude_own:
            ok = ok & (posts.author[posts.slot(extra)] != u[:, None])
        hit = jnp.any((extra[:, :, None] == seen[:, None, :]) & ok[:, :, None], axis=2)
        parts.append(_seen_adjust(jnp.where(ok, score[:, c:], _NEG), hit, params))
    return ids, jnp.concatenate(parts, axis=1)


@jax.jit
def _sample_scores(key, state: SocialState, users, params: SocialParams):
    k_pool, k_in, _, _ = jax.random.split(key, 4)  # as _recommend's
    ids, _ = _registered_candidates(k_pool, k_in, state, users, params)
    return ids, _call_registered(params.recsys, users, ids, state)


def check(state: SocialState, params: SocialParams, users=None, key=None) -> None:
    """Refuse a registered recommender (`params.recsys`) whose function gives non-finite
    scores on `state`: ValueError, one line naming the function and the first bad score.
    Evaluates it eagerly on the candidates of `users` (default: 64 users spread over the ids)
    -- a sample of the real state, once where a society is built, not in the tick.  Built-in
    recommenders: nothing to check."""
    if params.recsys not in REGISTERED_RECSYS:
        return
    n = params.num_users
    if users is None:
        users = np.linspace(0, n - 1, min(n, 64)).astype(np.int32)
    users = jnp.asarray(users, jnp.int32)
    ids, score = jax.device_get(_sample_scores(jax.random.key(0) if key is None else key,
                                               state, users, params))
    bad = (ids >= 0) & ~np.isfinite(score)
    if bad.any():
        b, c = np.argwhere(bad)[0]
        raise ValueError(
            f"recsys {params.recsys!r}: {_describe(REGISTERED_RECSYS[params.recsys])} returned "
            f"{int(bad.sum())} non-finite scores of {int((ids >= 0).sum())} on the candidates "
            f"of {users.shape[0]} sampled users (first: {score[b, c]} for user "
            f"{int(users[b])}, post {int(ids[b, c])}); scores must be finite")


def recommend(key: jax.Array, state: SocialState, users: jax.Array, params: SocialParams
              ) -> Feed:
    """Feeds `[B, K]` for `users [B]` (distinct ids; out-of-range ids get empty feeds).

    Candidates never include comments, the user's own posts (unless `exclude_own=False`), posts
    by authors the user muted, or (seen_policy="exclude") posts in the user's seen ring;
    "downweight" subtracts `seen_penalty` instead.  `explore_frac` of the slots are swapped for
    uniformly random live posts.  twhin: the shared candidates are `twhin_candidates` (drawn
    with `key`), scored by `twhin_score` of the users' profiles.  A registered recommender
    (`register`) scores twitter's candidates with its own function.  Pure; does not mark the
    feed as seen (see `mark_seen`).

    reddit with seen_policy "exclude" or "none": the hot-score pool is one sorted list shared by
    all users, so each feed is the first posts of that list passing the user's filters
    (`_reddit_fast`: O(B (K + S)) instead of a per-user top-k over the pool, and exploration
    swaps checked sparsely).  Its feeds equal the per-user top-k path's, kept as the reference:
    `_recommend(..., sorted_pool=False)`.
    """
    return _recommend(key, state, users, params, sorted_pool=True)


def _recommend(key: jax.Array, state: SocialState, users: jax.Array, params: SocialParams,
               sorted_pool: bool) -> Feed:
    """`recommend`; `sorted_pool=False` forces reddit through the generic per-user top-k path
    (the reference `_reddit_fast` is tested against)."""
    chex.assert_rank(users, 1)
    chex.assert_type(users, jnp.int32)
    posts = state.posts
    n, cap, k = params.num_users, posts.capacity, params.feed_size
    b = users.shape[0]
    user_ok = (users >= 0) & (users < n)
    u = jnp.clip(users, 0, n - 1)
    k_cand, k_in, k_exp, k_exp2 = jax.random.split(key, 4)
    lo = jnp.maximum(posts.next_id - cap, 0)
    span = posts.next_id - lo

    seen = state.memory.seen[u]  # [B, S]
    if sorted_pool and params.recsys == "reddit" and params.seen_policy != "downweight":
        ids, score = _reddit_fast(key, state, u, seen, params)
        valid = jnp.isfinite(score) & user_ok[:, None] & (ids >= 0)
        ids = jnp.where(valid, ids, EMPTY)
        return Feed(ids=ids, slots=jnp.where(valid, posts.slot(ids), 0), valid=valid,
                    score=jnp.where(valid, score, _NEG))
    if params.recsys == "twhin":
        score, ids = _twhin_top(k_cand, state, u, seen, params)
    elif params.recsys in REGISTERED_RECSYS:
        ids, score = _registered_scores(k_cand, k_in, state, u, seen, params)
    elif params.recsys == "random":
        kk = k + params.overfetch
        ids = lo + jnp.floor(jax.random.uniform(k_cand, (b, kk)) * span).astype(jnp.int32)
        ids = jnp.where(span > 0, jnp.minimum(ids, posts.next_id - 1), EMPTY)
        score = jax.random.uniform(k_exp2, (b, kk))
        ok = posts.alive(ids) & (posts.kind[posts.slot(ids)] != PostKind.COMMENT)
        score = jnp.where(ok, score, _NEG)
    else:
        pslot, pprior = _pool(k_cand, state, params)
        pid = posts.id[pslot]
        if params.recsys == "reddit":
            score = jnp.broadcast_to(pprior, (b, pprior.shape[0]))
            ids = jnp.broadcast_to(pid, (b, pid.shape[0]))
            score = _pool_seen(score, pid, seen, params)
        else:
            interest = state.users.interest[u]  # [B, d], unit norm
            sim = interest @ posts.embedding[pslot].T  # [B, C]
            score = _pool_seen(params.w_sim * sim + pprior, pid, seen, params)
            if params.exclude_own:  # by the pool's authors: no [B, C] id or author gather
                score = jnp.where(posts.author[pslot][None, :] == u[:, None], _NEG, score)
            # The ids stay [C] (and [B, I]) until the top-k has picked columns (`pick`).
            ids, pool_ids, extra_ids = None, pid, None
            if params.in_network > 0:
                iid, iok = _in_network(k_in, state, u, params)
                islot = posts.slot(iid)
                isim = jnp.einsum("bd,bid->bi", interest, posts.embedding[islot])
                iage = (state.tick - posts.created_at[islot]).astype(jnp.float32)
                iscore = _personalized_from_cos(isim, iage, posts.likes[islot], 1.0, params.w_sim,
                                                params.w_rec, params.w_pop, params.w_in,
                                                params.recency, params.recency_tau)
                ihit = jnp.any((iid[:, :, None] == seen[:, None, :]) & (iid[:, :, None] >= 0),
                               axis=2)
                iscore = _seen_adjust(iscore, ihit, params)
                if params.exclude_own:
                    iok = iok & (posts.author[islot] != u[:, None])
                score = jnp.concatenate([score, jnp.where(iok, iscore, _NEG)], axis=1)
                extra_ids = jnp.where(iok, iid, EMPTY)
    if params.exclude_own and params.recsys in ("random", "reddit"):  # (the others: above)
        score = jnp.where(posts.author[posts.slot(ids)] == u[:, None], _NEG, score)

    # The seen policy is applied above for the pool / in-network candidates; the top
    # K + overfetch then only lose muted authors and duplicates (and seen: random recsys).
    kk = min(score.shape[1], k + params.overfetch)
    score, pos = jax.lax.top_k(score, kk)
    if ids is None:  # pool columns [C], then the in-network ones [B, I]
        c = pool_ids.shape[0]
        ids = pool_ids[jnp.minimum(pos, c - 1)]
        if extra_ids is not None:
            ids = jnp.where(pos < c, ids, jnp.take_along_axis(
                extra_ids, jnp.clip(pos - c, 0, extra_ids.shape[1] - 1), axis=1))
    else:
        ids = jnp.take_along_axis(ids, pos, axis=1)
    score = _filter(state, u, ids, score, params, penalize=params.recsys == "random")
    score, pos = jax.lax.top_k(score, min(k, kk))
    ids = jnp.take_along_axis(ids, pos, axis=1)
    if kk < k:  # fewer candidates than feed slots: pad
        score = jnp.pad(score, ((0, 0), (0, k - kk)), constant_values=_NEG)
        ids = jnp.pad(ids, ((0, 0), (0, k - kk)), constant_values=EMPTY)

    if params.recsys != "random":  # exploration (the random recommender is all exploration)
        swap = jax.random.uniform(k_exp, (b, k)) < params.explore_frac
        rid = lo + jnp.floor(jax.random.uniform(k_exp2, (b, k)) * span).astype(jnp.int32)
        rid = jnp.where(span > 0, jnp.minimum(rid, posts.next_id - 1), EMPTY)
        rok = posts.alive(rid) & (posts.kind[posts.slot(rid)] != PostKind.COMMENT)
        ids = jnp.where(swap, jnp.where(rok, rid, EMPTY), ids)
        score = jnp.where(swap, jnp.where(rok, -1e9, _NEG), score)
        score = _filter(state, u, ids, score, params, penalize=False)

    valid = jnp.isfinite(score) & user_ok[:, None] & (ids >= 0)
    ids = jnp.where(valid, ids, EMPTY)
    return Feed(ids=ids, slots=jnp.where(valid, posts.slot(ids), 0), valid=valid,
                score=jnp.where(valid, score, _NEG))


_REDDIT_MARGIN = 8  # pool head entries indexed past K + overfetch + S (own / muted posts)
_AUTHOR_POSTS = 4  # an author's posts in the head looked up per own / muted author
# (both module level: tests shrink them to exercise the dense fallback)


def _explore_slots(k: int) -> int:
    """E: swapped slots per feed the sparse exploration check handles (a batch with more in any
    row takes the dense `_filter`).  explore_frac = 0.05, K = 100: P(> 25 swaps) ~ 1e-12 a row."""
    return min(k, max(8, k // 4))


def _prefix_count(mask):
    """Inclusive prefix counts `[R, X]` int32 of `mask [R, X]` along its rows (an associative
    scan: XLA:CPU's cumsum is a reduce-window, several times slower at X ~ 100)."""
    return jax.lax.associative_scan(jnp.add, mask.astype(jnp.int32), axis=1)


def _first_true(mask, rank, n: int, fill: int):
    """Columns `[R, n]` int32 of the first n True entries of `mask [R, X]` in order (`fill`
    where a row has fewer), `rank = _prefix_count(mask)`: one flat scatter."""
    r, x = mask.shape
    at = jnp.where(mask & (rank <= n), jnp.arange(r)[:, None] * n + rank - 1, r * n)
    col = jnp.broadcast_to(jnp.arange(x, dtype=jnp.int32), (r, x))
    return jnp.full((r * n,), fill, jnp.int32).at[at.reshape(-1)].set(
        col.reshape(-1), mode="drop").reshape(r, n)


def _reddit_fast(key, state: SocialState, u, seen, params: SocialParams):
    """reddit feeds of users `u [B]` (seen `[B, S]` their seen rings), seen_policy "exclude" or
    "none": (ids `[B, K]`, score `[B, K]`, -inf / any id where invalid), equal to the per-user
    top-k path of `_recommend` with the same key.

    The pool (`_pool`: top C posts by hot score) is sorted, so the per-user top-(K + overfetch)
    with seen and own posts at -inf is the first K + overfetch pool entries passing those
    filters, in pool order; muted authors' posts among them are dropped and the first K kept
    (`_reddit_feed`).  Exploration draws the same swaps and random posts; since the feed's
    valid entries are distinct and pass every filter, only the swapped slots are checked, with
    `[B, E]` work (E = `_explore_slots(K)`) -- a batch with a row of more than E swaps takes the
    dense `_filter` instead."""
    posts = state.posts
    cap, k = posts.capacity, params.feed_size
    b = u.shape[0]
    k_cand, _, k_exp, k_exp2 = jax.random.split(key, 4)
    lo = jnp.maximum(posts.next_id - cap, 0)
    span = posts.next_id - lo
    pslot, pscore = _pool(k_cand, state, params)
    pid = posts.id[pslot]
    c = pid.shape[0]

    # exploration draws, as _recommend's: swapped slots, and random posts (`random_post`) where
    # swapped -- the [B, K] uniforms elementwise when `_uniform_at` can reproduce them
    flat = jnp.arange(b, dtype=jnp.int32)[:, None] * k + jnp.arange(k, dtype=jnp.int32)[None]
    at_ok = _uniform_at_ok(k_exp) and _uniform_at_ok(k_exp2) and b * k < 2 ** 31

    def random_post(r):  # uniforms [..] -> random post ids, EMPTY where none
        rid = lo + jnp.floor(r * span).astype(jnp.int32)
        return jnp.where(span > 0, jnp.minimum(rid, posts.next_id - 1), EMPTY)

    swap = (_uniform_at(k_exp, flat) if at_ok else jax.random.uniform(k_exp, (b, k))
            ) < params.explore_frac
    swap = _materialized(swap, posts.next_id >= 0)
    e = _explore_slots(k)
    # [B, E] swapped slots in order, k = none: the (e+1)-th swap is at #{j : swaps <= j are e}
    at = _count_le(_prefix_count(swap), jnp.arange(e, dtype=jnp.int32)[None])
    at_c = jnp.minimum(at, k - 1)
    if at_ok:
        rc = random_post(_uniform_at(k_exp2, jnp.take_along_axis(flat, at_c, axis=1)))
    else:
        rc = jnp.take_along_axis(random_post(jax.random.uniform(k_exp2, (b, k))), at_c, axis=1)
    rc = jnp.where(at < k, rc, EMPTY)
    rc = jnp.where(posts.alive(rc) & (posts.kind[posts.slot(rc)] != PostKind.COMMENT), rc,
                   EMPTY)
    # pool index of each random post (c = not in the pool): where the feed may show it too
    inv = jnp.full((cap,), c, jnp.int32).at[pslot].set(jnp.arange(c, dtype=jnp.int32))
    qr = inv[posts.slot(rc)]
    qr = jnp.where((rc >= 0) & (qr < c) & (pid[jnp.minimum(qr, c - 1)] == rc), qr, c)

    ids, score, jpos = _reddit_feed(state, u, seen, pid, pscore, inv, params, qr)

    def sparse(ids, score):
        author = posts.author[posts.slot(rc)]
        bad = (rc < 0) | _any_eq(author, state.graph.muted[u])
        if params.exclude_own:
            bad = bad | (author == u[:, None])
        if params.seen_policy == "exclude":
            bad = bad | _any_eq(rc, seen)
        bad = bad | (_dedupe(rc, EMPTY - 1) != rc)  # repeats an earlier swap
        # the feed shows the same post at jpos (not swapped away): the later of the two goes
        shown = (jpos < k) & ~jnp.take_along_axis(swap, jnp.minimum(jpos, k - 1), axis=1)
        bad = bad | (shown & (jpos < at))
        bad, shown = _materialized((bad, shown), posts.next_id >= 0)
        gone = jnp.concatenate([jnp.where(bad, at, k), jnp.where(shown & (jpos > at), jpos, k)],
                               axis=1)  # [B, 2E] slots to drop
        rows = jnp.arange(b)[:, None]
        drop = jnp.zeros((b, k), bool).at[rows, gone].set(True, mode="drop")
        ids = ids.at[rows, at].set(rc, mode="drop")
        score = jnp.where(swap, -1e9, score)
        return ids, jnp.where(drop | (ids < 0), _NEG, score)

    def dense(ids, score):
        rid = random_post(jax.random.uniform(k_exp2, (b, k)))
        rok = posts.alive(rid) & (posts.kind[posts.slot(rid)] != PostKind.COMMENT)
        ids = jnp.where(swap, jnp.where(rok, rid, EMPTY), ids)
        score = jnp.where(swap, jnp.where(rok, -1e9, _NEG), score)
        return ids, _filter(state, u, ids, score, params, penalize=False)

    n_swap = jnp.max(jnp.sum(swap, axis=1))
    return jax.lax.switch(jnp.where(n_swap == 0, 0, jnp.where(n_swap <= e, 1, 2)),
                          [lambda i, s: (i, s), sparse, dense], ids, score)


_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(k0, k1, x0, x1):
    """Threefry-2x32, 20 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
    2011) of the uint32 counter pairs (x0, x1) under the key (k0, k1), written out elementwise:
    XLA fuses it into one loop, where XLA:CPU runs jax.random's as a rolled loop over `[B, K]`
    buffers (memory bound at 1e5 users)."""
    ks = (k0, k1, k0 ^ k1 ^ jnp.uint32(0x1BD11BDA))
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in _THREEFRY_ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = ((x1 << jnp.uint32(r)) | (x1 >> jnp.uint32(32 - r))) ^ x0
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + jnp.uint32(i + 1)
    return x0, x1


def _uniform_at_ok(key) -> bool:
    """Whether `_uniform_at` reproduces `jax.random.uniform` for `key` (a threefry key under
    jax_threefry_partitionable, JAX's default since 0.5)."""
    return (bool(jax.config.jax_threefry_partitionable)
            and "threefry2x32" in str(jax.random.key_impl(key)))


def _uniform_at(key, flat):
    """`jax.random.uniform(key, shape)` (float32, [0, 1)) at the row-major flat indices
    `flat` (int32, any shape) of `shape`, without drawing the rest: under partitionable
    threefry element i hashes the counter (0, i) (shapes under 2**32 elements), and its float
    is the top 23 bits as the mantissa of a number in [1, 2), minus 1."""
    kd = jax.random.key_data(key)
    b0, b1 = _threefry2x32(kd[0], kd[1], jnp.zeros(flat.shape, jnp.uint32),
                           flat.astype(jnp.uint32))
    bits = (b0 ^ b1) >> jnp.uint32(9) | jnp.uint32(0x3F800000)
    return jax.lax.bitcast_convert_type(bits, jnp.float32) - 1.0


def _materialized(x, true):
    """`x` (a pytree), computed into buffers once: XLA fuses a cheap elementwise producer into
    each of its consumers, recomputing it (a fused threefry, once per level of an associative
    scan), and XLA:CPU drops `optimization_barrier`; a conditional's operands are buffers.
    `true`: a traced predicate that holds (not constant-folded)."""
    return jax.lax.cond(true, lambda y: y, lambda y: jax.tree.map(jnp.zeros_like, y), x)


def _any_eq(a, b):
    """`[R, J]` bool: a[r, j] == b[r, d] for some d (`a [R, J]`, `b [R, D]`), unrolled over D:
    XLA:CPU runs a reduction over a short minor axis ~30x slower than D fused passes."""
    out = jnp.zeros(a.shape, bool)
    for d in range(b.shape[1]):
        out = out | (a == b[:, d:d + 1])
    return out


def _count_le(t, v):
    """`[R, J]` int32: #{d : t[r, d] <= v[r, j]} (`t [R, D]`, `v [R, J]`), unrolled over D."""
    out = jnp.zeros(jnp.broadcast_shapes(v.shape, (t.shape[0], 1)), jnp.int32)
    for d in range(t.shape[1]):
        out = out + (t[:, d:d + 1] <= v)
    return out


def _dedupe(d, none):
    """`d [R, D]` with every repeat of an earlier entry in its row replaced by `none`."""
    col = jnp.arange(d.shape[1])[None]
    rep = jnp.zeros(d.shape, bool)
    for i in range(d.shape[1] - 1):
        rep = rep | ((d == d[:, i:i + 1]) & (col > i))
    return jnp.where(rep, none, d)


def _nth_kept(excluded, j, none):
    """Positions `[R, J]` of the j-th (0-based, `j [R, J]` or `[1, J]`) entry of 0, 1, 2, ...
    not in `excluded [R, D]` (distinct within a row; `none`, larger than any answer, pads):
    j + #{d : d - rank(d) <= j}, rank(d) = #excluded entries below d."""
    rank = _count_le(excluded, excluded - 1)  # [R, D]
    return j + _count_le(jnp.where(excluded == none, none, excluded - rank), j)


def _reddit_feed(state: SocialState, u, seen, pid, pscore, inv, params: SocialParams, probe):
    """The feeds before exploration from the sorted pool (`pid [C]`, `pscore [C]` descending,
    `inv [P]` slot -> pool index or C): (ids `[B, K]`, score `[B, K]`, probe_at `[B, E]`),
    invalid entries EMPTY / -inf; `probe [B, E]` pool indices (C = none), probe_at their slots
    in the feed (K = not in it).

    A user's excluded pool positions are few: its seen posts (their pool index, `inv`), its own
    and its muted authors' posts (at most `_AUTHOR_POSTS` each, found by binary search in the
    pool head's entries sorted by author).  The j-th kept entry is then j plus a count over the
    D excluded positions (`_nth_kept`): `[B, K, D]` compares, no per-user sort, scan or
    scatter.  Stage 1 (seen, own) fixes the cut at the K + overfetch-th passing entry, stage 2
    drops the muted authors' posts up to the cut.  Own / muted posts are only indexed in the
    head X = K + overfetch + S + `_REDDIT_MARGIN`: a batch with a cut past X, or an author with
    more than `_AUTHOR_POSTS` head posts, takes the dense path over the whole pool
    (`_reddit_feed_dense`, `lax.cond`)."""
    posts = state.posts
    b, c, k = u.shape[0], pid.shape[0], params.feed_size
    kk = min(c, k + params.overfetch)
    excl_seen = params.seen_policy == "exclude"
    x = min(c, kk + (params.seen_memory if excl_seen else 0) + _REDDIT_MARGIN)
    g = _AUTHOR_POSTS
    none = jnp.int32(2 ** 30)
    pauthor = posts.author[posts.slot(pid)]
    live = jnp.isfinite(pscore) & (pid >= 0)  # a prefix of the pool
    n_live = jnp.sum(live, dtype=jnp.int32)
    hauth = jnp.where(live[:x], pauthor[:x], none)
    order = jnp.argsort(hauth, stable=True).astype(jnp.int32)
    sauth = hauth[order]  # the head's authors, sorted

    def author_posts(a):  # a [B, J] -> head positions of their posts [B, J * g], overflow [B]
        lo = jnp.searchsorted(sauth, a, side="left").astype(jnp.int32)
        cnt = jnp.where(a >= 0, jnp.searchsorted(sauth, a, side="right") - lo, 0)
        r = jnp.arange(g, dtype=jnp.int32)
        at = jnp.where(r < cnt[..., None], order[jnp.minimum(lo[..., None] + r, x - 1)], none)
        return at.reshape(b, -1), jnp.any(cnt > g, axis=1)

    parts, over = [], jnp.zeros((b,), bool)
    if excl_seen:
        sq = inv[posts.slot(seen)]
        sq_ok = (seen >= 0) & (sq < c)
        sq_ok = sq_ok & (pid[jnp.minimum(sq, c - 1)] == seen) & live[jnp.minimum(sq, c - 1)]
        parts.append(jnp.where(sq_ok, sq, none))
    if params.exclude_own:
        own, over_own = author_posts(u[:, None])
        parts.append(own)
        over = over | over_own
    kk_col = jnp.full((1, 1), kk - 1, jnp.int32)
    if parts:
        excl = _dedupe(jnp.concatenate(parts, axis=1), none)  # [B, DA] stage-1 exclusions
        cut = _nth_kept(excl, kk_col, none)[:, 0]  # the (K + overfetch)-th passing entry
    else:
        excl, cut = jnp.full((b, 1), none), jnp.full((b,), kk - 1, jnp.int32)
    cut = jnp.minimum(cut, n_live - 1)
    mpos, over_m = author_posts(state.graph.muted[u])
    over = over | over_m
    mpos = _dedupe(jnp.where(mpos <= cut[:, None], mpos, none), none)
    excl = jnp.concatenate([excl, jnp.where(_any_eq(mpos, excl), none, mpos)], axis=1)
    pos = _nth_kept(excl, jnp.arange(k, dtype=jnp.int32)[None], none)  # [B, K]
    q = jnp.where(pos <= cut[:, None], pos, c)
    pr_ok = (probe <= cut[:, None]) & ~_any_eq(probe, excl)
    pr_at = probe - _count_le(excl, probe - 1)
    probe_at = jnp.where(pr_ok & (pr_at < k), pr_at, k)
    if x < c:
        q, probe_at = jax.lax.cond(
            jnp.any(over | (cut >= x)),
            lambda: _reddit_feed_dense(state, u, seen, pid, pscore, params, probe),
            lambda: (q, probe_at))
    ok = q < c
    qc = jnp.minimum(q, c - 1)
    return jnp.where(ok, pid[qc], EMPTY), jnp.where(ok, pscore[qc], _NEG), probe_at


def _reddit_feed_dense(state: SocialState, u, seen, pid, pscore, params: SocialParams, probe):
    """`_reddit_feed`'s (pool index `[B, K]` (C = none), probe_at `[B, E]`) from `[B, C]`
    masks over the whole pool (prefix counts and a scatter): its fallback."""
    posts = state.posts
    b, c, k = u.shape[0], pid.shape[0], params.feed_size
    kk = min(c, k + params.overfetch)
    pauthor = posts.author[posts.slot(pid)]
    good = jnp.broadcast_to((jnp.isfinite(pscore) & (pid >= 0))[None], (b, c))
    if params.exclude_own:
        good = good & (pauthor[None] != u[:, None])
    if params.seen_policy == "exclude":
        good = good & ~_any_eq(jnp.broadcast_to(pid[None], (b, c)), seen)
    r1 = _prefix_count(good)  # [B, C]
    keep = good & (r1 <= kk) & ~_any_eq(jnp.broadcast_to(pauthor[None], (b, c)),
                                         state.graph.muted[u])
    r2 = _prefix_count(keep)
    q = _first_true(keep, r2, k, c)
    pc = jnp.minimum(probe, c - 1)
    hit = jnp.take_along_axis(keep & (r2 <= k), pc, axis=1) & (probe < c)
    return q, jnp.where(hit, jnp.take_along_axis(r2, pc, axis=1) - 1, k)

def _filter(state: SocialState, u, ids, score, params: SocialParams, penalize=True):
    """-inf for duplicates (keep the first), own/muted authors, seen posts (exclude policy;
    `penalize`: also apply the downweight policy)."""
    posts = state.posts
    x = ids.shape[1]
    author = posts.author[posts.slot(ids)]
    earlier = jnp.tril(jnp.ones((x, x), bool), k=-1)  # [j, i]: i < j
    dup = jnp.any((ids[:, :, None] == ids[:, None, :]) & earlier[None], axis=2)
    muted = jnp.any(author[:, :, None] == state.graph.muted[u][:, None, :], axis=2)
    bad = dup | muted | (ids < 0)
    if params.exclude_own:
        bad = bad | (author == u[:, None])
    if params.seen_policy != "none":
        seen = jnp.any(ids[:, :, None] == state.memory.seen[u][:, None, :], axis=2)
        if params.seen_policy == "exclude":
            bad = bad | seen
        elif penalize:
            score = score - params.seen_penalty * seen
    return jnp.where(bad, _NEG, score)


def mark_seen(state: SocialState, users: jax.Array, feed: Feed, params: SocialParams
              ) -> SocialState:
    """Append each user's valid feed ids to its seen ring `[N, S]` (users must be distinct)."""
    chex.assert_rank(users, 1)
    chex.assert_shape([feed.ids, feed.valid], (users.shape[0], None))
    n, s = params.num_users, params.seen_memory
    mem = state.memory
    user_ok = (users >= 0) & (users < n)
    u = jnp.clip(users, 0, n - 1)
    rank = jnp.cumsum(feed.valid, axis=1) - 1
    pos = (mem.seen_head[u][:, None] + rank) % s
    write = feed.valid & user_ok[:, None] & (rank < s)
    row = jnp.where(write, u[:, None], n)
    seen = mem.seen.at[row, pos].set(feed.ids, mode="drop")
    count = jnp.where(user_ok, jnp.minimum(jnp.sum(feed.valid, axis=1), s), 0)
    head = mem.seen_head.at[jnp.where(user_ok, u, n)].add(count, mode="drop") % s
    return state.replace(memory=mem.replace(seen=seen, seen_head=head))


def following_posts(state: SocialState, users: jax.Array, params: SocialParams,
                    exclude: jax.Array | None = None):
    """The followees' most-liked recent posts (OASIS's in-network part of a Twitter feed):
    (ids `[B, Kf]` int32, valid `[B, Kf]` bool), Kf = `feed_following`.

    Candidates: the `following_depth` newest posts / reposts / quotes of each followee (its
    author chain `users.last_post`, `posts.prev_by_author`), kept if alive, of kind post or
    quote, younger than `following_window` ticks, not by a muted author, not seen (seen_policy
    "exclude") and not in `exclude [B, X]` (posts the feed already shows); ranked by likes,
    ties newest first.  O(B F D) for F followee slots and depth D; no `[B, P]` work."""
    chex.assert_rank(users, 1)
    posts, graph = state.posts, state.graph
    n, kf = params.num_users, params.feed_following
    u = jnp.clip(users, 0, n - 1)
    row = graph.following[u]  # [B, F]
    cur = jnp.where(row >= 0, state.users.last_post[jnp.maximum(row, 0)], EMPTY)
    chain = []
    for _ in range(params.following_depth):
        chain.append(cur)
        cur = jnp.where(posts.alive(cur), posts.prev_by_author[posts.slot(cur)], EMPTY)
    ids = jnp.concatenate(chain, axis=1)  # [B, F * D]
    slot = posts.slot(ids)
    kind = posts.kind[slot]
    ok = (posts.alive(ids) & ((kind == PostKind.POST) | (kind == PostKind.QUOTE))
          & (state.tick - posts.created_at[slot] < params.following_window)
          & ((users >= 0) & (users < n))[:, None])
    muted = jnp.any(posts.author[slot][:, :, None] == graph.muted[u][:, None, :], axis=2)
    ok = ok & ~muted
    if params.seen_policy == "exclude":
        ok = ok & ~jnp.any(ids[:, :, None] == state.memory.seen[u][:, None, :], axis=2)
    if exclude is not None:
        ok = ok & ~jnp.any(ids[:, :, None] == exclude[:, None, :], axis=2)
    imax = jnp.iinfo(jnp.int32).max
    k1 = jnp.where(ok, -posts.likes[slot], imax)
    k2 = jnp.where(ok, -ids, imax)
    s1, _, sid = jax.lax.sort((k1, k2, ids), dimension=1, num_keys=2)
    if sid.shape[1] < kf:
        pad = kf - sid.shape[1]
        s1 = jnp.pad(s1, ((0, 0), (0, pad)), constant_values=imax)
        sid = jnp.pad(sid, ((0, 0), (0, pad)), constant_values=EMPTY)
    valid = s1[:, :kf] != imax
    return jnp.where(valid, sid[:, :kf], EMPTY), valid


def compose_following(state: SocialState, users: jax.Array, rec: Feed, params: SocialParams
                      ) -> Feed:
    """OASIS's feed: the recommender's first K - Kf posts, then up to Kf = `feed_following`
    of the followees' most-liked recent posts (`following_posts`, not already shown), then the
    recommender's remaining posts (minus those), the valid ones first, K in all.  Followee posts
    carry score 0.0 (they are not ranked against the recommender's).  rec `[B, K]`."""
    k, kf = params.feed_size, params.feed_following
    kr = k - kf
    fol, fok = following_posts(state, users, params, rec.ids[:, :kr])
    tail_ids = rec.ids[:, kr:]
    tail_ok = rec.valid[:, kr:] & ~jnp.any(tail_ids[:, :, None] == jnp.where(
        fok, fol, EMPTY - 1)[:, None, :], axis=2)
    ids = jnp.concatenate([rec.ids[:, :kr], fol, tail_ids], axis=1)
    ok = jnp.concatenate([rec.valid[:, :kr], fok, tail_ok], axis=1)
    score = jnp.concatenate([rec.score[:, :kr], jnp.zeros(fol.shape, jnp.float32),
                             rec.score[:, kr:]], axis=1)
    order = jnp.argsort(~ok, axis=1, stable=True)[:, :k]
    ids = jnp.take_along_axis(ids, order, axis=1)
    ok = jnp.take_along_axis(ok, order, axis=1)
    score = jnp.take_along_axis(score, order, axis=1)
    ids = jnp.where(ok, ids, EMPTY)
    return Feed(ids=ids, slots=jnp.where(ok, state.posts.slot(ids), 0), valid=ok,
                score=jnp.where(ok, score, _NEG))
