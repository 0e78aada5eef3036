"""Recommenders against independent NumPy / pure-Python versions of the published formulas."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_no_users_by_posts

from jaxsocial.social import recsys, society
from jaxsocial.social.state import PostKind

N, P, K = 20, 64, 5
rec = jax.jit(recsys.recommend, static_argnums=3)
BASE = dict(num_users=N, post_capacity=P, num_seed_posts=P, embed_dim=8, content_len=2,
            feed_size=K, pool_size=P, overfetch=P // K + 1, in_network=0, crowd=False,
            max_muted=3, seen_memory=8, max_active=4, crowd_budget=8, recency_tau=7.0,
            w_sim=1.3, w_rec=0.7, w_pop=0.4, w_in=0.9, seed_max_age=40)


def oasis_hot(likes, dislikes, created_epoch):
    """OASIS's reddit hot score, verbatim in float64 Python."""
    s = likes - dislikes
    order = math.log(max(abs(s), 1), 10)
    sign = 1 if s > 0 else -1 if s < 0 else 0
    seconds = created_epoch - 1134028003
    return round(sign * order + seconds / 45000, 7)


def np_personalized(u, e, age, likes, in_net, w_sim, w_rec, w_pop, w_in, tau, kind="exp"):
    u = u / np.linalg.norm(u, axis=-1, keepdims=True)
    e = e / np.linalg.norm(e, axis=-1, keepdims=True)
    cos = u @ e.T if e.ndim == 2 else np.einsum("bd,bcd->bc", u, e)
    age = np.maximum(age, 0.0)
    if kind == "exp":
        rec = np.exp(-age / tau)
    else:
        rec = np.array([max(math.log(max((271.8 - a) / 100, 1.0)), 0.0)
                        for a in np.ravel(age)]).reshape(np.shape(age))
    return w_sim * cos + w_rec * rec + w_pop * np.log1p(np.maximum(likes, 0)) + w_in * in_net


@pytest.fixture(scope="module")
def world():
    """A society with random likes / ages, some mutes and seen posts, built once."""
    params = society.make_params(**BASE)
    state = society.reset(jax.random.key(3), params)
    rng = np.random.default_rng(0)
    posts = state.posts.replace(
        likes=jnp.asarray(rng.integers(0, 50, P), jnp.int32),
        dislikes=jnp.asarray(rng.integers(0, 50, P), jnp.int32),
        created_at=jnp.asarray(np.sort(rng.integers(-40, 0, P)), jnp.int32))
    muted = np.full((N, 3), -1, np.int32)
    muted[:, 0] = rng.integers(0, N, N)
    seen = np.full((N, 8), -1, np.int32)
    seen[:, :3] = rng.integers(0, P, (N, 3))
    state = state.replace(posts=posts, graph=state.graph.replace(muted=jnp.asarray(muted)),
                          memory=state.memory.replace(seen=jnp.asarray(seen)),
                          tick=jnp.int32(5))
    return params, state


def test_reddit_hot_score_matches_oasis_values_and_ranking():
    rng = np.random.default_rng(1)
    n = 2000
    likes = rng.integers(0, 10_000, n)
    dislikes = rng.integers(0, 10_000, n)
    created = rng.integers(1_700_000_000, 1_700_000_000 + 30 * 86400, n)
    want = np.array([oasis_hot(int(a), int(b), int(c)) for a, b, c in zip(likes, dislikes,
                                                                          created)])
    got = np.asarray(recsys.reddit_hot_score(likes, dislikes, created))
    np.testing.assert_allclose(got, want, atol=5e-3)  # float32 at magnitude ~1.3e4
    ref = 1_700_000_000 + 30 * 86400
    rel = np.asarray(recsys.reddit_hot_score(likes, dislikes, created, reference_seconds=ref),
                     np.float64)
    np.testing.assert_allclose(rel + (ref - 1134028003) / 45000, want, atol=2e-5, rtol=0)
    order = np.argsort(-want, kind="stable")
    gaps = -np.diff(want[order])
    clear = gaps > 1e-5  # OASIS's order between posts whose hot differs by more than 1e-5
    assert clear.mean() > 0.9
    assert (np.diff(rel[order])[clear] < 0).all()
    top = order[:200]  # and the top of the feed ranks identically
    assert (gaps[:199] > 1e-5).all()
    np.testing.assert_array_equal(np.argsort(-rel, kind="stable")[:200], top)
    # sign conventions: net-negative posts lose order, zero net has no order term
    assert float(recsys.reddit_hot_score(0, 0, 1134028003)) == 0.0
    assert float(recsys.reddit_hot_score(10, 110, 1134028003)) == pytest.approx(-2.0)


@pytest.mark.parametrize("kind", ["exp", "oasis_clipped"])
def test_personalized_score_matches_numpy(kind):
    rng = np.random.default_rng(2)
    b, c, d = 7, 31, 12
    u = rng.normal(size=(b, d))
    w = dict(w_sim=1.7, w_rec=0.6, w_pop=0.25, w_in=0.8)
    # shared pool [C, d]
    e = rng.normal(size=(c, d))
    age = rng.uniform(0, 300, c)
    likes = rng.integers(-2, 40, c)
    in_net = rng.random(c) < 0.3
    got = recsys.personalized_score(u, e, age, likes, in_net, recency=kind, tau=9.0, **w)
    want = np_personalized(u, e, age, likes, in_net, tau=9.0, kind=kind, **w)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.argsort(-np.asarray(got), 1)[:, :5],
                                  np.argsort(-want, 1)[:, :5])
    # per-user candidates [B, C, d]
    e3 = rng.normal(size=(b, c, d))
    age3, likes3 = rng.uniform(0, 50, (b, c)), rng.integers(0, 9, (b, c))
    got3 = recsys.personalized_score(u, e3, age3, likes3, np.ones((b, c)), recency=kind,
                                     tau=9.0, **w)
    want3 = np_personalized(u, e3, age3, likes3, 1.0, tau=9.0, kind=kind, **w)
    np.testing.assert_allclose(np.asarray(got3), want3, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["exp", "oasis_clipped"])
def test_recency_decay_is_monotone_and_finite(kind):
    age = jnp.arange(0, 2000, 0.5)
    r = np.asarray(recsys.recency_decay(age, kind, 24.0))
    assert np.isfinite(r).all() and (r >= 0).all()
    assert (np.diff(r) <= 0).all()
    if kind == "oasis_clipped":  # equals OASIS's ln((271.8 - age) / 100) where that is >= 0
        a = np.asarray(age)
        young = a < 171.8
        np.testing.assert_allclose(r[young], np.log((271.8 - a[young]) / 100), rtol=1e-5,
                                   atol=1e-6)


def _brute_force_feed(state, params, users, score_fn):
    """Score every live post for every user in NumPy, apply the exclusions, keep top K."""
    s = jax.device_get(state)
    out = []
    for u in users:
        scores = score_fn(s, u)
        ok = (s.posts.id >= 0) & (s.posts.kind != PostKind.COMMENT)
        ok &= s.posts.author != u
        ok &= ~np.isin(s.posts.author, s.graph.muted[u][s.graph.muted[u] >= 0])
        ok &= ~np.isin(s.posts.id, s.memory.seen[u])
        scores = np.where(ok, scores, -np.inf)
        order = np.argsort(-scores, kind="stable")[:K]
        out.append([int(s.posts.id[i]) if np.isfinite(scores[i]) else -1 for i in order])
    return np.array(out)


def np_twitter_prior(s, params):
    """User-independent prior [P] of every slot, and the live non-comment slots by descending
    prior (ties: lower slot first); the pool is the first `pool_size` of them."""
    posts = s.posts
    live = (posts.id >= 0) & (posts.kind != PostKind.COMMENT)
    age = np.maximum(float(s.tick) - posts.created_at.astype(np.float64), 0.0)
    prior = (params.w_rec * np.exp(-age / params.recency_tau)
             + params.w_pop * np.log1p(np.maximum(posts.likes, 0)))
    return prior, [i for i in np.argsort(-prior, kind="stable") if live[i]]


def np_twitter_feed(s, params, u, followees, *, pool_cut=True, use_in_network=True,
                    use_w_in=True):
    """The twitter rule for user `u`, written from docs/society.md in NumPy (float64).

    Candidates: the shared pool = the `pool_size` live non-comment posts with the highest
    user-independent prior `w_rec decay(age) + w_pop log1p(likes)` (ties: lower slot first), plus
    the latest non-comment post of each followee in `followees` (with repeats, as sampled), with
    the in-network bonus `w_in`.  Own posts and seen posts are dropped before the cut to the top
    `K + overfetch` by score; then muted authors and repeated ids (keep the best) are dropped
    and the top K kept.  Returns (ids [K], scores [K]), -1 / -inf padded.
    The keyword flags build deliberately broken variants for negative controls.
    """
    posts, k = s.posts, params.feed_size
    live = (posts.id >= 0) & (posts.kind != PostKind.COMMENT)
    prior, ranked = np_twitter_prior(s, params)
    interest = s.users.interest[u] / np.linalg.norm(s.users.interest[u])
    emb = posts.embedding / np.linalg.norm(posts.embedding, axis=1, keepdims=True)
    score = params.w_sim * (emb @ interest) + prior
    cands = [(int(posts.id[i]), score[i]) for i in (ranked[:params.pool_size] if pool_cut
                                                   else ranked)]
    if use_in_network:
        for f in followees:
            mine = np.flatnonzero(live & (posts.author == f))
            if len(mine):
                i = mine[np.argmax(posts.id[mine])]
                cands.append((int(posts.id[i]), score[i] + params.w_in * use_w_in))
    seen = set(s.memory.seen[u][s.memory.seen[u] >= 0].tolist())
    muted = set(s.graph.muted[u][s.graph.muted[u] >= 0].tolist())
    cands = [(pid, sc) for pid, sc in cands
             if posts.author[pid % posts.id.shape[0]] != u and pid not in seen]
    cands.sort(key=lambda c: -c[1])
    out, taken = [], set()
    for pid, sc in cands[:k + params.overfetch]:
        if pid in taken or posts.author[pid % posts.id.shape[0]] in muted:
            continue
        taken.add(pid)
        out.append((pid, sc))
    out = out[:k] + [(-1, -np.inf)] * (k - len(out[:k]))
    return np.array([o[0] for o in out]), np.array([o[1] for o in out])


def twitter_mismatches(feed, s, params, **broken):
    """Users whose feed equals the NumPy rule for none of the in-network samples the rule
    allows (I consecutive non-empty followee entries, cyclically, from any offset)."""
    bad = []
    ids, scores = np.asarray(feed.ids), np.asarray(feed.score)
    for u in range(ids.shape[0]):
        row = s.graph.following[u]
        e = row[row >= 0]
        windows = ([[e[(o + j) % len(e)] for j in range(params.in_network)]
                    for o in range(len(e))] if params.in_network and len(e) else [[]])
        ok = False
        for w in windows:
            want_ids, want_sc = np_twitter_feed(s, params, u, w, **broken)
            fin = np.isfinite(want_sc)
            if (np.array_equal(ids[u], want_ids) and np.array_equal(np.isfinite(scores[u]), fin)
                    and np.allclose(scores[u][fin], want_sc[fin], rtol=1e-5, atol=1e-5)):
                ok = True
                break
        if not ok:
            bad.append(u)
    return bad


@pytest.fixture(scope="module")
def twitter_world(world):
    """The world with a candidate pool smaller than the buffer, in-network candidates, a few
    comments (never candidates), and follow rows with holes: users 0-9 follow fewer accounts
    than `in_network` (every followee sampled), users 10-19 more (a random window)."""
    params, state = world
    params = params.replace(pool_size=16, in_network=4, overfetch=4)
    rng = np.random.default_rng(7)
    following = np.full((N, params.max_following), -1, np.int32)
    for u in range(N):
        n_f = 2 + (u % 3) if u < 10 else 6 + (u % 4)
        others = rng.permutation(np.delete(np.arange(N), u))[:n_f]
        cols = np.sort(rng.choice(params.max_following, n_f, replace=False))
        following[u, cols] = others
    kind = np.asarray(state.posts.kind).copy()
    kind[rng.choice(P, 6, replace=False)] = PostKind.COMMENT
    author = np.asarray(state.posts.author)
    last = np.full(N, -1, np.int32)  # users.last_post = latest non-comment post
    for pid in range(P):
        if kind[pid] != PostKind.COMMENT:
            last[author[pid]] = max(last[author[pid]], pid)
    state = state.replace(
        posts=state.posts.replace(kind=jnp.asarray(kind)),
        users=state.users.replace(last_post=jnp.asarray(last)),
        graph=state.graph.replace(following=jnp.asarray(following)))
    return params, state


@pytest.mark.parametrize("path", ["pool_and_in_network", "whole_buffer"])
def test_twitter_feed_equals_brute_force(world, twitter_world, path):
    """The personalized feed equals an independent NumPy version of the rule: on the path every
    real config takes (pool_size < P, in_network > 0) and on the whole-buffer one."""
    if path == "whole_buffer":
        params, state = world
        params = params.replace(overfetch=P)
        assert params.pool_size == P and params.in_network == 0
    else:
        params, state = twitter_world
        assert params.pool_size < P and params.in_network > 0
    s = jax.device_get(state)
    for key in range(3):  # in-network windows are sampled: several keys
        feed = rec(jax.random.key(key), state, jnp.arange(N, dtype=jnp.int32), params)
        assert twitter_mismatches(feed, s, params) == []
        np.testing.assert_array_equal(np.asarray(feed.slots),
                                      np.where(np.asarray(feed.valid), np.asarray(feed.ids) % P, 0))
    assert np.asarray(feed.valid).mean() > 0.9
    if path == "pool_and_in_network":
        # Non-trivial: some feed items come from outside the pool (reached in-network only).
        prior, ranked = np_twitter_prior(s, params)
        c = params.pool_size
        assert prior[ranked[c - 1]] - prior[ranked[c]] > 1e-4  # a clear cut (no float ties)
        pool_ids = s.posts.id[ranked[:c]]
        in_feed = np.asarray(feed.ids)[np.asarray(feed.valid)]
        assert (~np.isin(in_feed, pool_ids)).sum() >= 3


def test_twitter_brute_force_rejects_broken_rules(twitter_world):
    """Negative controls: the comparison rejects recommenders that ignore the in-network
    candidates, the pool cut or the in-network bonus, and reference rules that do."""
    params, state = twitter_world
    s = jax.device_get(state)
    users = jnp.arange(N, dtype=jnp.int32)
    feed = rec(jax.random.key(0), state, users, params)
    assert twitter_mismatches(feed, s, params) == []
    for broken in (dict(use_in_network=False), dict(pool_cut=False), dict(use_w_in=False)):
        assert len(twitter_mismatches(feed, s, params, **broken)) >= N // 2, broken
    for wrong in (params.replace(in_network=0), params.replace(pool_size=P),
                  params.replace(w_in=0.0)):
        assert len(twitter_mismatches(rec(jax.random.key(0), state, users, wrong), s,
                                      params)) >= N // 2, wrong
    # ... and a feed with two items of one user swapped.
    ids = np.asarray(feed.ids).copy()
    ids[3, [0, 1]] = ids[3, [1, 0]]
    assert twitter_mismatches(feed.replace(ids=jnp.asarray(ids)), s, params) == [3]


def test_reddit_feed_equals_brute_force(world):
    params, state = world
    params = params.replace(recsys="reddit")
    feed = rec(jax.random.key(0), state, jnp.arange(N, dtype=jnp.int32), params)

    def score(s, u):
        sec = params.start_seconds + s.posts.created_at * params.seconds_per_tick
        return np.array([oasis_hot(int(a), int(b), int(c))
                         for a, b, c in zip(s.posts.likes, s.posts.dislikes, sec)])

    want = _brute_force_feed(state, params, range(N), score)
    np.testing.assert_array_equal(np.asarray(feed.ids), want)


def test_in_network_candidates(world):
    """With a one-post pool, every other feed item is a followee's latest post, scored with
    the in-network bonus."""
    params, state = world
    params = params.replace(pool_size=1, in_network=4, seen_policy="none", overfetch=2)
    following = np.full((N, params.max_following), -1, np.int32)
    following[:, :4] = (np.arange(N)[:, None] + np.arange(1, 5)[None]) % N
    last = np.asarray(state.users.last_post)
    state = state.replace(graph=state.graph.replace(following=jnp.asarray(following),
                                                    muted=jnp.full((N, 3), -1, jnp.int32)))
    feed = rec(jax.random.key(1), state, jnp.arange(N, dtype=jnp.int32), params)
    s = jax.device_get(state)
    pool_id = int(s.posts.id[np.argmax(np.where(
        s.posts.id >= 0, params.w_rec * np.exp(-(5 - s.posts.created_at) / params.recency_tau)
        + params.w_pop * np.log1p(s.posts.likes), -np.inf))])
    n_in = 0
    for u in range(N):
        for pid, ok, sc in zip(np.asarray(feed.ids[u]), np.asarray(feed.valid[u]),
                               np.asarray(feed.score[u])):
            if not ok or pid == pool_id:
                continue
            assert pid in last[following[u, :4]]
            want = np_personalized(s.users.interest[u][None], s.posts.embedding[pid][None],
                                   5.0 - s.posts.created_at[pid], s.posts.likes[pid], 1.0,
                                   params.w_sim, params.w_rec, params.w_pop, params.w_in,
                                   params.recency_tau)[0, 0]
            assert sc == pytest.approx(want, rel=1e-5, abs=1e-5)
            n_in += 1
    assert n_in > N


def test_random_feed_and_seen_exclusion(world):
    params, state = world
    params = params.replace(recsys="random", overfetch=5)
    users = jnp.arange(N, dtype=jnp.int32)
    feed = rec(jax.random.key(2), state, users, params)
    ids, valid = np.asarray(feed.ids), np.asarray(feed.valid)
    authors = np.asarray(state.posts.author)
    muted = np.asarray(state.graph.muted)
    seen = np.asarray(state.memory.seen)
    assert valid.mean() > 0.8
    for u in range(N):
        row = ids[u][valid[u]]
        assert len(set(row)) == len(row)
        assert not np.isin(authors[row % P], [u] + list(muted[u][muted[u] >= 0])).any()
        assert not np.isin(row, seen[u]).any()
    # marking the feed as seen removes those posts from the next feed
    state2 = recsys.mark_seen(state, users, feed, params)
    feed2 = rec(jax.random.key(3), state2, users, params)
    for u in range(N):
        assert not np.isin(np.asarray(feed2.ids[u])[np.asarray(feed2.valid[u])],
                           ids[u][valid[u]]).any()
    # coverage: random feeds reach most of the buffer
    many = jax.vmap(lambda k: rec(k, state, users, params).ids)(
        jax.random.split(jax.random.key(4), 8))
    assert len(np.unique(np.asarray(many))) > 0.8 * P


def test_downweight_policy_and_exploration(world):
    params, state = world
    users = jnp.arange(N, dtype=jnp.int32)
    p_none = params.replace(seen_policy="none")
    p_down = params.replace(seen_policy="downweight", seen_penalty=100.0)
    f_none = rec(jax.random.key(0), state, users, p_none)
    f_down = rec(jax.random.key(0), state, users, p_down)
    f_excl = rec(jax.random.key(0), state, users, params)
    seen = np.asarray(state.memory.seen)
    assert np.isin(np.asarray(f_none.ids), seen).any()  # the fixture's seen posts rank high
    # a huge penalty ranks seen posts last: same feed as excluding them
    np.testing.assert_array_equal(np.asarray(f_down.ids), np.asarray(f_excl.ids))
    p_exp = params.replace(explore_frac=1.0)
    f_exp = rec(jax.random.key(5), state, users, p_exp)
    ids = np.asarray(f_exp.ids)[np.asarray(f_exp.valid)]
    assert len(ids) > 0.6 * N * K
    assert np.asarray(state.posts.alive(jnp.asarray(ids))).all()
    assert not (np.asarray(f_exp.ids) == np.asarray(f_excl.ids)).all()


def test_no_users_by_posts_intermediate():
    """The personalized recommender never materialises a [B, P] array (B users, P posts)."""
    params = society.make_params(**{**BASE, "num_users": 37, "post_capacity": 101,
                                    "num_seed_posts": 101, "pool_size": 16, "in_network": 3,
                                    "overfetch": 2})
    assert_no_users_by_posts(params)
