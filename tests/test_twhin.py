"""recsys="twhin": OASIS's personalized TwHIN recommender against a NumPy version of the rule.

OASIS (rec_sys_personalized_twh): score = cos(user profile, post) * ln((271.8 - age) / 100) over
a random set of 4,000 candidate posts; ours clips the recency at 0 (never negative) and keeps the
profile as the running mean of the bio and the posts the user created or liked.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import jaxpr_shapes

from jaxsocial.social import actions, recsys, society
from jaxsocial.social.actions import ActionType as T
from jaxsocial.social.actions import Reason, make_actions
from jaxsocial.social.state import PostKind

N, P, K, C, D = 20, 64, 5, 32, 8
BASE = dict(num_users=N, post_capacity=P, num_seed_posts=P, embed_dim=D, content_len=2,
            feed_size=K, recsys="twhin", twhin_candidates=C, overfetch=C, crowd=False,
            max_muted=3, seen_memory=8, max_active=4, crowd_budget=8, pool_size=16)
rec = jax.jit(recsys.recommend, static_argnums=3)


def oasis_recency(age, clip=True):
    """OASIS's TwHIN recency ln((271.8 - age) / 100); clipped at 0 as ours (clip=False: as
    published, negative after 171.8 ticks)."""
    r = math.log((271.8 - age) / 100)
    return max(r, 0.0) if clip else r


@pytest.fixture(scope="module")
def world():
    """Posts aged 0..260 ticks (a third past OASIS's 171.8-tick sign flip), a few comments,
    mutes, seen posts, and profiles that are no longer the bio (bio + random posts)."""
    params = society.make_params(**BASE)
    state = society.reset(jax.random.key(3), params)
    rng = np.random.default_rng(0)
    kind = np.full(P, PostKind.POST, np.int32)
    kind[rng.choice(P, 6, replace=False)] = PostKind.COMMENT
    emb = np.asarray(state.posts.embedding)
    extra = rng.integers(0, 4, N)
    prof = np.asarray(state.users.interest) + np.stack(
        [emb[rng.choice(P, e)].sum(0) for e in extra])
    muted = np.full((N, 3), -1, np.int32)
    muted[:, 0] = rng.integers(0, N, N)
    seen = np.full((N, 8), -1, np.int32)
    seen[:, :3] = rng.integers(0, P, (N, 3))
    tick = 300
    state = state.replace(
        posts=state.posts.replace(
            kind=jnp.asarray(kind),
            created_at=jnp.asarray(tick - rng.integers(0, 261, P), jnp.int32)),
        users=state.users.replace(profile_sum=jnp.asarray(prof, jnp.float32),
                                  profile_count=jnp.asarray(1 + extra, jnp.int32)),
        graph=state.graph.replace(muted=jnp.asarray(muted)),
        memory=state.memory.replace(seen=jnp.asarray(seen)), tick=jnp.int32(tick))
    return params, state


def np_twhin_feed(s, params, u, cand, *, recency=True, clip=True, profile="running_mean"):
    """The TwHIN rule for user `u` in NumPy (float64): over the candidate slots `cand` (live
    non-comment posts), score = cos(profile_u, post) * max(ln((271.8 - age) / 100), 0); drop
    own posts and seen posts, cut to the top K + overfetch, drop muted authors, keep the top K.
    Returns (ids [K], scores [K]), -1 / -inf padded.  The keywords build deliberately broken
    variants (negative controls)."""
    posts = s.posts
    if profile == "running_mean":
        prof = s.users.profile_sum[u] / s.users.profile_count[u]
    else:  # the bio alone
        prof = s.users.interest[u]
    prof = prof / np.linalg.norm(prof)
    muted = set(s.graph.muted[u][s.graph.muted[u] >= 0].tolist())
    seen = set(s.memory.seen[u][s.memory.seen[u] >= 0].tolist())
    out = []
    for i in cand:
        if posts.id[i] < 0 or posts.kind[i] == PostKind.COMMENT:
            continue
        a = int(posts.author[i])
        if a == u or int(posts.id[i]) in seen:
            continue
        e = posts.embedding[i] / np.linalg.norm(posts.embedding[i])
        age = float(s.tick - posts.created_at[i])
        sc = float(prof @ e) * (oasis_recency(age, clip) if recency else 1.0)
        out.append((int(posts.id[i]), sc, a))
    out.sort(key=lambda c: -c[1])
    out = [o for o in out[:params.feed_size + params.overfetch] if o[2] not in muted]
    out = out[:params.feed_size]
    out += [(-1, -np.inf)] * (params.feed_size - len(out))
    return np.array([o[0] for o in out]), np.array([o[1] for o in out])


def mismatches(feed, s, params, cand, **broken):
    """Users whose feed differs from the NumPy rule (ids may differ only within exact ties)."""
    bad = []
    ids, scores = np.asarray(feed.ids), np.asarray(feed.score)
    for u in range(ids.shape[0]):
        want_ids, want_sc = np_twhin_feed(s, params, u, cand, **broken)
        fin = np.isfinite(want_sc)
        ok = (np.array_equal(np.isfinite(scores[u]), fin)
              and np.allclose(scores[u][fin], want_sc[fin], rtol=1e-5, atol=1e-5))
        tie = np.array([np.sum(np.abs(want_sc - x) < 1e-6) > 1 for x in want_sc])
        ok = ok and np.array_equal(ids[u][~tie], want_ids[~tie])
        if not ok:
            bad.append(u)
    return bad


def _candidates(key, state, params):
    """The candidate set `recommend(key, ...)` scores: drawn with the first of its 4 subkeys."""
    slots, valid = recsys.twhin_candidates(jax.random.split(key, 4)[0], state, params)
    return np.asarray(slots)[np.asarray(valid)]


@pytest.mark.parametrize("path", ["one_block", "blocks_grouped_top_k"])
def test_feed_equals_numpy_rule(world, path, monkeypatch):
    """The feed equals the NumPy rule, also when users are scored in several blocks (one padded)
    and the per-block top-k takes the grouped path (as at C = 4,000)."""
    params, state = world
    if path == "blocks_grouped_top_k":
        monkeypatch.setattr(recsys, "_TWHIN_BLOCK", 7)
        monkeypatch.setattr(recsys, "_TOPK_GROUP", 2)
        params = params.replace(overfetch=3)  # top 8 of 32 candidates in groups of 2
    s = jax.device_get(state)
    users = jnp.arange(N, dtype=jnp.int32)
    ages = s.tick - s.posts.created_at
    f = jax.jit(lambda k, st, us: recsys.recommend(k, st, us, params))  # traced here
    for key in range(3):
        k = jax.random.key(key)
        feed = f(k, state, users)
        cand = _candidates(k, state, params)
        assert mismatches(feed, s, params, cand) == []
        assert np.asarray(feed.valid).mean() > 0.9
        shown = np.asarray(feed.slots)[np.asarray(feed.valid)]
        assert np.isin(shown, cand).all()  # only sampled candidates are recommended
    # non-trivial: fewer candidates than posts, and old (clipped) posts among them
    assert len(cand) == C < P and (ages[cand] > 171.8).sum() >= 5


def test_numpy_rule_rejects_broken_rules(world):
    """Negative controls: the comparison rejects reference rules without the recency factor,
    with OASIS's unclipped log, with the bio alone as profile, or over the whole buffer."""
    params, state = world
    s = jax.device_get(state)
    k = jax.random.key(0)
    feed = rec(k, state, jnp.arange(N, dtype=jnp.int32), params)
    cand = _candidates(k, state, params)
    assert mismatches(feed, s, params, cand) == []
    for broken in (dict(recency=False), dict(clip=False), dict(profile="bio")):
        assert len(mismatches(feed, s, params, cand, **broken)) >= N // 2, broken
    assert len(mismatches(feed, s, params, np.arange(P))) >= N // 2
    # and a feed with two items of one user swapped
    ids = np.asarray(feed.ids).copy()
    ids[3, [0, 1]] = ids[3, [1, 0]]
    assert mismatches(feed.replace(ids=jnp.asarray(ids)), s, params, cand) == [3]


def test_candidates_uniform_and_keyed(world):
    """Candidates: C distinct live non-comment posts, uniform over them (each post's inclusion
    frequency ~ C / live), a function of the key alone; twhin_candidates is clamped to P."""
    params, state = world
    s = jax.device_get(state)
    live = np.flatnonzero((s.posts.id >= 0) & (s.posts.kind != PostKind.COMMENT))
    draws = jax.jit(jax.vmap(lambda k: recsys.twhin_candidates(k, state, params)))(
        jax.random.split(jax.random.key(1), 400))
    slots, valid = np.asarray(draws[0]), np.asarray(draws[1])
    assert valid.all() and slots.shape == (400, C)
    assert all(len(set(r)) == C and np.isin(r, live).all() for r in slots)
    freq = np.bincount(slots.ravel(), minlength=P)[live] / 400
    p = C / len(live)
    assert np.abs(freq - p).max() < 5 * math.sqrt(p * (1 - p) / 400)
    users = jnp.arange(N, dtype=jnp.int32)
    a, b = rec(jax.random.key(7), state, users, params), rec(jax.random.key(7), state, users,
                                                              params)
    np.testing.assert_array_equal(np.asarray(a.ids), np.asarray(b.ids))
    c = rec(jax.random.key(8), state, users, params)
    assert not np.array_equal(np.asarray(a.ids), np.asarray(c.ids))
    whole, ok = recsys.twhin_candidates(jax.random.key(0), state,
                                        params.replace(twhin_candidates=10 * P))
    assert whole.shape == (P,) and set(np.asarray(whole)[np.asarray(ok)]) == set(live)


def test_bad_params_name_the_value():
    with pytest.raises(ValueError, match=r"recsys='twhn'.*'twhin'"):
        society.make_params(recsys="twhn")
    with pytest.raises(ValueError, match=r"twhin_candidates=0"):
        society.make_params(recsys="twhin", twhin_candidates=0)


def test_profile_running_mean_equals_numpy():
    """Over a few ticks, agents 0..19 send random batches (posts, likes incl. of reposts,
    reposts, quotes, comments, unlikes, invalid rows) while the crowd acts; the ring wraps.
    Each agent's profile mean equals the NumPy running mean of its bio and the embeddings of the
    posts it created or liked; for the crowd, the count increments equal its accepted likes +
    posts + reposts + quotes and the summed increments equal those posts' embeddings."""
    a = 20
    params = society.make_params(**{**BASE, "num_users": 200, "num_agents": a,
                                    "post_capacity": 256, "num_seed_posts": 128, "crowd": True,
                                    "max_active": 64, "crowd_budget": 256,
                                    "activation_rate": 0.3, "like_bias": -1.0, "p_post": 0.3,
                                    "p_repost": 0.1, "p_quote": 0.1, "p_comment": 0.2,
                                    "seen_memory": 16, "overfetch": 4, "reaction_memory": 32})
    state = society.reset(jax.random.key(0), params)
    step = jax.jit(society.step, static_argnums=3)
    rng = np.random.default_rng(1)
    s = jax.device_get(state)
    total = s.users.interest[:a].astype(np.float64).copy()
    count = np.ones(a)
    types = [T.CREATE_POST, T.LIKE_POST, T.LIKE_POST, T.REPOST, T.QUOTE_POST, T.CREATE_COMMENT,
             T.UNLIKE_POST, T.LIKE_COMMENT, T.FOLLOW]
    n_like = n_made = n_evicted = crowd_checks = 0
    for t in range(6):
        b = 24
        before = s
        typ = rng.choice(types, b)
        actor = rng.integers(0, a, b)
        nid = int(before.posts.next_id)
        target = np.where(typ == T.FOLLOW, rng.integers(0, a, b),
                          rng.integers(max(nid - P, 0) - 2, nid, b))
        # row 0 likes the oldest live post, whose slot this batch's first new post overwrites
        # once the ring is full: the like must count the liked post, not the slot's new one
        typ[0], target[0] = T.LIKE_POST, max(nid - params.post_capacity, 0)
        emb = rng.normal(size=(b, D))
        state, info = step(jax.random.key(t), state,
                           make_actions(params, typ, actor, target, embedding=emb), params)
        s = jax.device_get(state)
        for i in np.flatnonzero(np.asarray(info.agent.reason) == Reason.OK):
            slot = target[i] % params.post_capacity
            if typ[i] in (T.LIKE_POST, T.REPOST):  # a repost's like / repost: its original
                if before.posts.kind[slot] == PostKind.REPOST:
                    slot = before.posts.parent[slot] % params.post_capacity
                e = before.posts.embedding[slot]
            elif typ[i] in (T.CREATE_POST, T.QUOTE_POST):
                e = emb[i] / np.linalg.norm(emb[i])
            else:
                continue
            n_like += typ[i] == T.LIKE_POST
            n_evicted += (typ[i] == T.LIKE_POST) & (s.posts.id[slot] != before.posts.id[slot])
            n_made += typ[i] != T.LIKE_POST
            total[actor[i]] += e
            count[actor[i]] += 1
        np.testing.assert_array_equal(s.users.profile_count[:a], count)
        np.testing.assert_allclose(s.users.profile_sum[:a] / s.users.profile_count[:a, None],
                                   total / count[:, None], rtol=1e-5, atol=1e-5)
        tc = np.asarray(info.crowd.apply.type_counts)
        assert tc[T.LIKE_POST] > 0 and tc[T.CREATE_POST] > 0
        d_count = s.users.profile_count[a:] - before.users.profile_count[a:]
        assert d_count.sum() == tc[[T.LIKE_POST, T.CREATE_POST, T.REPOST, T.QUOTE_POST]].sum()
        if int(s.posts.next_id) <= params.post_capacity:  # no slot overwritten: sum check
            new = ((s.posts.created_at == t) & (s.posts.kind != PostKind.COMMENT)
                   & (s.posts.author >= a))
            liked = np.asarray(info.crowd.apply.like_delta)[:, None] * s.posts.embedding
            np.testing.assert_allclose(
                (s.users.profile_sum[a:] - before.users.profile_sum[a:]).sum(0),
                s.posts.embedding[new].sum(0) + liked.sum(0), rtol=1e-4, atol=1e-3)
            crowd_checks += 1
    assert n_like >= 5 and n_made >= 10 and n_evicted >= 1 and crowd_checks >= 2
    assert int(s.posts.next_id) > params.post_capacity  # the ring wrapped
    # other recommenders leave the profile at the bio
    assert actions.update_profiles(before, state, make_actions(params, typ, actor, target),
                                  info.agent, params.replace(recsys="twitter")) is state


def test_no_users_by_posts_intermediate(world):
    """With C < P candidates the recommender never materialises a [B, P] array."""
    params, state = world
    b = 13
    shapes = jaxpr_shapes(lambda k, s, u: recsys.recommend(k, s, u, params),
                          jax.random.key(0), state, jnp.arange(b, dtype=jnp.int32))
    assert any(P in s for s in shapes) and (b, C) in shapes
    assert not [s for s in shapes if b in s and P in s]


def test_grouped_top_k_equals_top_k():
    """The recommender's grouped top-k returns lax.top_k's values, at indices holding them."""
    rng = np.random.default_rng(0)
    x = np.round(rng.normal(size=(9, 4000)), 2).astype(np.float32)  # many ties
    x[0, :3990] = -np.inf  # fewer finite values than k
    x[1] = 0.0
    for k in (1, 14, 40):
        want_v, want_i = jax.lax.top_k(jnp.asarray(x), k)
        v, i = jax.jit(recsys._top_k_grouped, static_argnums=1)(jnp.asarray(x), k)
        np.testing.assert_array_equal(np.asarray(v), np.asarray(want_v))
        np.testing.assert_array_equal(np.take_along_axis(x, np.asarray(i), 1), np.asarray(v))
        assert all(len(set(r)) == k for r in np.asarray(i))
        x2 = rng.permutation(4000)[None].astype(np.float32)  # distinct: same indices
        np.testing.assert_array_equal(np.asarray(recsys._top_k_grouped(jnp.asarray(x2), k)[1]),
                                      np.asarray(jax.lax.top_k(jnp.asarray(x2), k)[1]))
