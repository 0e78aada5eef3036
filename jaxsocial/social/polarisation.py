"""Polarisation: the follow graph's interest homophily against a degree-preserving shuffle, the
modularity of the society's 2-way split by interest, and the diversity of what feeds show.

The graph's edges are `graph.following` [N, F] read as u -> v (u follows v; EMPTY holes are
no edge); users' interests are unit vectors [N, d].

- `homophily(users, graph)`: the mean cosine between a follower's and a followee's interests
  over the edges.
- `shuffled_followees(key, graph)`: the same edges with their followees permuted among
  themselves, so every user keeps its out-degree and its in-degree (a configuration-model
  shuffle: what homophily is when who follows whom ignores interests);
  `homophily_shuffled(users, graph)`: its expectation over the shuffle's permutations, in
  closed form (what `summary` reports: exact, and cheap at 1e6 users).
- `interest_split(users)`: side [N] bool, the sign of each interest's coordinate along the
  interests' first principal direction (centred; the direction oriented so that its largest
  component is positive).
- `modularity(graph, side)`: Newman's directed modularity of that split,
  Q = sum_c [e_cc / m - (out_c / m)(in_c / m)], with e_cc the edges inside side c, out_c / in_c
  the edges leaving / entering it, m the edges: 0 for a split the edges ignore, up to 1/2 for two
  closed camps of equal size.
- `exposure_diversity(key, state, params, users)`: the mean over `users` (with at least two
  posts in their feed) of the mean pairwise cosine distance 1 - cos between the posts the
  recommender would show them now (`recsys.recommend`).
All of them are jit-able at static shapes.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxsocial.social import recsys
from jaxsocial.social.state import Graph, SocialParams, SocialState, Users

Array = jax.Array


def edges(graph: Graph):
    """(follower [E], followee [E], valid [E]) with E = N * F (EMPTY entries invalid)."""
    n, f = graph.following.shape
    follower = jnp.repeat(jnp.arange(n, dtype=jnp.int32), f)
    followee = graph.following.reshape(-1)
    return follower, jnp.maximum(followee, 0), followee >= 0


def _mean_cos(interest: Array, src: Array, dst: Array, valid: Array) -> Array:
    cos = jnp.sum(interest[src] * interest[dst], axis=-1)
    return jnp.sum(jnp.where(valid, cos, 0.0)) / jnp.maximum(jnp.sum(valid), 1)


def _row_block(n: int) -> int:
    """Rows per block of the per-row passes: [block, F, d] gathers stay near 64 MB."""
    return max(1, min(n, 16384))


def homophily(users: Users, graph: Graph) -> Array:
    """[] float32 mean cosine between follower and followee interests (0 without edges).

    Summed row by row in blocks (`lax.map`), so no [E, d] array of the edges' interests exists
    (E = N * F: 32M edges and 4 GB per side at 1e6 users)."""
    chex.assert_rank(users.interest, 2)
    interest, following = users.interest, graph.following

    def row(args):
        x, f = args
        return jnp.sum(jnp.where(f >= 0, interest[jnp.maximum(f, 0)] @ x, 0.0))

    total = jnp.sum(jax.lax.map(row, (interest, following),
                                batch_size=_row_block(following.shape[0])))
    return total / jnp.maximum(jnp.sum(following >= 0), 1)


def homophily_shuffled(users: Users, graph: Graph) -> Array:
    """[] float32 the expected `homophily` of `shuffled_followees(key, graph)` over the
    shuffle's permutations, in closed form: a uniformly permuted followee of an edge is any
    edge's followee with equal chance, so the mean cosine is
    (mean over edges of the follower's interest) . (mean over edges of the followee's
    interest). Exact, with no draw and no sort of the E edges (0 without edges)."""
    interest, following = users.interest, graph.following
    valid = following >= 0
    out_deg = jnp.sum(valid, axis=1).astype(interest.dtype)
    in_deg = jnp.zeros(interest.shape[0], interest.dtype).at[
        jnp.where(valid, following, interest.shape[0])].add(1.0, mode="drop")
    e = jnp.maximum(jnp.sum(valid), 1).astype(interest.dtype)
    return (out_deg @ interest) @ (in_deg @ interest) / (e * e)


def shuffled_followees(key: Array, graph: Graph) -> Graph:
    """`graph` with the followees of all edges permuted among the edges (holes stay holes):
    out- and in-degrees are kept, who follows whom is random."""
    n, f = graph.following.shape
    _, dst, valid = edges(graph)
    # Edge slots in order (valid first) and the valid followees in a random order.
    slots = jnp.argsort(jnp.where(valid, 0, 1), stable=True)
    draw = jnp.argsort(jnp.where(valid, jax.random.uniform(key, valid.shape), 2.0))
    new = jnp.full(dst.shape, -1, jnp.int32).at[slots].set(
        jnp.where(valid[draw], dst[draw], -1))
    return graph.replace(following=new.reshape(n, f))


def interest_split(users: Users) -> Array:
    """[N] bool: which side of the interests' first principal direction each user sits on."""
    x = users.interest - users.interest.mean(0)
    _, vecs = jnp.linalg.eigh(x.T @ x)
    v = vecs[:, -1]
    v = v * jnp.sign(v[jnp.argmax(jnp.abs(v))])  # an eigenvector's sign is arbitrary: fix it
    return x @ v > 0


def modularity(graph: Graph, side: Array) -> Array:
    """[] float32 directed modularity of the 2-way split `side` [N] bool (0 without edges)."""
    valid = graph.following >= 0
    src = jnp.broadcast_to(side[:, None], valid.shape)  # [N, F]: no [E] follower ids built
    dst = side[jnp.maximum(graph.following, 0)]
    m = jnp.maximum(jnp.sum(valid), 1).astype(jnp.float32)
    q = jnp.float32(0.0)
    for c in (False, True):
        out_c = jnp.sum(valid & (src == c))
        in_c = jnp.sum(valid & (dst == c))
        inside = jnp.sum(valid & (src == c) & (dst == c))
        q = q + inside / m - (out_c / m) * (in_c / m)
    return q


def feed_diversity(embedding: Array, valid: Array) -> Array:
    """embedding [B, K, d] unit vectors of the posts shown, valid [B, K] -> [B] mean pairwise
    1 - cos over the valid pairs of each feed (NaN where fewer than two posts)."""
    cos = jnp.einsum("bkd,bjd->bkj", embedding, embedding)
    k = valid.shape[1]
    pair = valid[:, :, None] & valid[:, None, :] & ~jnp.eye(k, dtype=bool)[None]
    n = jnp.sum(pair, axis=(1, 2))
    total = jnp.sum(jnp.where(pair, 1.0 - cos, 0.0), axis=(1, 2))
    return jnp.where(n > 0, total / jnp.maximum(n, 1), jnp.nan)


def exposure_diversity(key: Array, state: SocialState, params: SocialParams,
                       users: Array) -> Array:
    """[] float32 mean `feed_diversity` of the feeds `recsys.recommend` gives `users` [U]
    now, over the users shown at least two posts (NaN if none is)."""
    feed = recsys.recommend(key, state, users, params)
    emb = state.posts.embedding[feed.slots]
    per_user = feed_diversity(emb, feed.valid)
    ok = ~jnp.isnan(per_user)
    return jnp.where(jnp.any(ok), jnp.sum(jnp.where(ok, per_user, 0.0))
                     / jnp.maximum(jnp.sum(ok), 1), jnp.nan)


def summary(key: Array, state: SocialState, params: SocialParams, sample: int = 256) -> dict:
    """{"homophily", "homophily_shuffled", "modularity", "split_share", "follow_edges",
    "exposure_diversity"} of `state`: the graph's homophily, its expectation under
    `shuffled_followees` (`homophily_shuffled`), the modularity of the interest split, the
    share of users on its True side, the edges, and the feeds' diversity over `sample` users
    drawn without replacement (all of them when there are fewer)."""
    users, graph = state.users, state.graph
    _, k_users, k_feed = jax.random.split(key, 3)  # the first key drew a shuffle once
    side = interest_split(users)
    n = users.interest.shape[0]
    who = jax.random.permutation(k_users, n)[:min(sample, n)].astype(jnp.int32)
    return {"homophily": homophily(users, graph),
            "homophily_shuffled": homophily_shuffled(users, graph),
            "modularity": modularity(graph, side),
            "split_share": jnp.mean(side.astype(jnp.float32)),
            "follow_edges": jnp.sum(graph.following >= 0),
            "exposure_diversity": exposure_diversity(k_feed, state, params, who)}
