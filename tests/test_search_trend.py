"""search_posts, search_user and trend against brute-force NumPy references,
and their results becoming the searching agent's next feed."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.social import search, society
from jaxsocial.social.actions import ActionType as T
from jaxsocial.social.actions import make_actions
from jaxsocial.social.state import PostKind

PARAMS = society.make_params(num_users=120, num_agents=4, post_capacity=96, num_seed_posts=96,
                             seed_max_age=10, feed_size=5, pool_size=16, embed_dim=8,
                             crowd=False, crowd_budget=32, trend_window=4)


def _world():
    rng = np.random.default_rng(0)
    st = society.reset(jax.random.key(0), PARAMS)
    p = st.posts
    kind = rng.choice([PostKind.POST, PostKind.QUOTE, PostKind.REPOST, PostKind.COMMENT], 96,
                      p=[0.55, 0.15, 0.15, 0.15])
    kind[[3, 7]] = PostKind.POST
    likes = rng.integers(0, 4, 96)  # many ties
    emb = rng.normal(size=(96, 8)).astype(np.float32)
    emb[7] = emb[3]  # identical embeddings (a bank text posted twice)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    st = st.replace(posts=p.replace(kind=jnp.asarray(kind, jnp.int32),
                                    likes=jnp.asarray(likes, jnp.int32),
                                    embedding=jnp.asarray(emb)), tick=jnp.int32(1))
    # users with no live latest post
    last = np.array(st.users.last_post)
    last[rng.choice(120, 20, replace=False)] = -1
    return st.replace(users=st.users.replace(last_post=jnp.asarray(last))), rng


def _ref_top(scores, ok, k):
    """Indices of the top k by score over `ok`, ties towards the lower index."""
    idx = np.flatnonzero(ok)
    order = idx[np.lexsort((idx, -scores[idx]))]
    return order[:k], scores[order[:k]]


def _check_same_ranking(got_ids, got_scores, want_ids, want_scores):
    # equal score sequences; ids equal except among (float-)ties
    np.testing.assert_allclose(got_scores, want_scores, atol=1e-5)
    distinct = np.concatenate([np.abs(np.diff(want_scores)) > 1e-5, [True]])
    distinct &= np.concatenate([[True], np.abs(np.diff(want_scores)) > 1e-5])
    assert np.array_equal(np.asarray(got_ids)[distinct], np.asarray(want_ids)[distinct])


@pytest.mark.parametrize("chunk", [None, 40])  # None: one block; 40: running top-k over chunks
def test_search_posts_and_users_equal_brute_force(chunk, monkeypatch):
    if chunk:
        monkeypatch.setattr(search, "_CHUNK", chunk)
    st, rng = _world()
    k = PARAMS.feed_size
    q = rng.normal(size=(6, 8)).astype(np.float32)
    q[5] = np.asarray(st.posts.embedding[3])  # hits the two identical posts first
    actor = np.asarray([0, 1, 2, 3, 0, 1], np.int32)
    ids, sc = jax.jit(lambda s, q: search.search_posts(s, q, PARAMS, k))(st, jnp.asarray(q))
    uids, usc = jax.jit(lambda s, q, a: search.search_user(s, q, a, PARAMS, k))(
        st, jnp.asarray(q), jnp.asarray(actor))
    p = jax.tree.map(np.asarray, st.posts)
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    ok = (p.id >= 0) & np.isin(p.kind, [PostKind.POST, PostKind.QUOTE])
    u = jax.tree.map(np.asarray, st.users)
    slot_of = p.id >= 0
    for b in range(6):
        top, s = _ref_top(p.embedding @ qn[b], ok, k)
        _check_same_ranking(np.asarray(ids[b]), np.asarray(sc[b]), p.id[top], s)
        live = (u.last_post >= 0) & slot_of[np.maximum(u.last_post, 0) % 96]
        live &= np.arange(120) != actor[b]
        interest = u.interest / np.linalg.norm(u.interest, axis=1, keepdims=True)
        top, s = _ref_top(interest @ qn[b], live, k)
        _check_same_ranking(np.asarray(uids[b]), np.asarray(usc[b]), u.last_post[top], s)
    assert set(np.asarray(ids[5, :2]).tolist()) == {3, 7}


def test_trend_equals_brute_force():
    st, _ = _world()
    got = np.asarray(jax.jit(lambda s: search.trend(s, PARAMS, PARAMS.feed_size))(st))
    p = jax.tree.map(np.asarray, st.posts)
    ok = ((p.id >= 0) & np.isin(p.kind, [PostKind.POST, PostKind.QUOTE])
          & (1 - p.created_at < PARAMS.trend_window))
    idx = np.flatnonzero(ok)
    want = p.id[idx[np.lexsort((-p.id[idx], -p.likes[idx]))]][:PARAMS.feed_size]
    assert got.tolist() == want.tolist()
    assert ok.sum() > PARAMS.feed_size and (p.created_at[~ok & (p.id >= 0)] < -1).any()


def test_results_become_the_agents_next_feed():
    st, rng = _world()
    q = rng.normal(size=(4, 8)).astype(np.float32)
    batch = make_actions(PARAMS, [T.SEARCH_POSTS, T.SEARCH_USER, T.TREND, T.LIKE_POST],
                         [0, 1, 2, 3], [-1, -1, -1, int(st.posts.id[0])], embedding=q)
    agents = jnp.arange(4, dtype=jnp.int32)

    @jax.jit
    def run(st, batch, key):
        st, info = society.step(key, st, batch, PARAMS)
        st2, feed = society.observe(key, st, agents, PARAMS)
        _, feed2 = society.observe(key, st2, agents, PARAMS)
        return st, info, feed, feed2

    after, info, feed, feed2 = run(st, batch, jax.random.key(1))
    assert np.asarray(info.agent.reason).tolist() == [0, 0, 0, 0]
    k = PARAMS.feed_size
    sp, _ = search.search_posts(after, jnp.asarray(q[:1]), PARAMS, k)
    su, _ = search.search_user(after, jnp.asarray(q[1:2]), jnp.asarray([1]), PARAMS, k)
    tr = search.trend(after.replace(tick=after.tick - 1), PARAMS, k)  # as at the search
    ids = np.asarray(feed.ids)
    assert ids[0].tolist() == np.asarray(sp[0]).tolist()
    assert ids[1].tolist() == np.asarray(su[0]).tolist()
    assert ids[2].tolist() == np.asarray(tr).tolist()
    assert np.asarray(after.inbox.pending).tolist() == [True, True, True, False]
    # agent 3 liked: the recommender's feed; the next observe is the recommender's for all
    assert not np.array_equal(ids[3], ids[0])
    assert not np.array_equal(np.asarray(feed2.ids[0]), ids[0])
