"""The reddit recommender's sorted-pool path (`recsys._reddit_fast`) against the per-user top-k
path it replaced (`recsys._recommend(..., sorted_pool=False)`, kept as the reference): the same
feeds -- ids, order, scores, validity -- on a society with likes, comments, reposts, mutes,
seen rings and own posts, with and without exploration, through the sparse path and its dense
fallbacks.  Negative controls: broken variants the comparison rejects."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_no_users_by_posts

from jaxsocial.social import recsys, society
from jaxsocial.social.state import PostKind

N, P, K = 300, 400, 20
BASE = dict(num_users=N, post_capacity=P, num_seed_posts=P // 2, embed_dim=8, content_len=2,
            recsys="reddit", feed_size=K, pool_size=120, overfetch=4, seen_memory=10,
            max_muted=3, max_following=8, init_following=4, in_network=0, max_active=64,
            crowd_budget=400, activation_rate=0.08, seed_max_age=30, explore_frac=0.0)


@functools.lru_cache(maxsize=None)
def _jitted(params, sorted_pool):
    return jax.jit(lambda k, s, u: recsys._recommend(k, s, u, params, sorted_pool=sorted_pool))


def _feeds(params, state, users, key, sorted_pool):
    return jax.device_get(_jitted(params, sorted_pool)(key, state, users))


@pytest.fixture
def patch(monkeypatch):
    """monkeypatch.setattr on recsys, with the jit cache cleared so the patch is traced."""
    def setattr(name, value):
        monkeypatch.setattr(recsys, name, value)
        _jitted.cache_clear()
    yield setattr
    _jitted.cache_clear()


def _mismatch(params, state, users, keys):
    """Fields where the sorted-pool feeds differ from the reference, over `keys`."""
    bad = []
    for key in keys:
        got = _feeds(params, state, users, key, True)
        want = _feeds(params, state, users, key, False)
        for name in ("ids", "slots", "valid", "score"):
            if not np.array_equal(getattr(got, name), getattr(want, name)):
                bad.append(name)
    return sorted(set(bad))


@pytest.fixture(scope="module")
def world():
    """A society after 3 crowd ticks (likes, dislikes, comments, reposts, own posts), one or two
    muted authors per user, and seen rings holding each user's first feed."""
    params = society.make_params(**BASE)
    state = society.reset(jax.random.key(0), params)
    step = jax.jit(lambda k, s: society.step(k, s, None, params)[0])
    for t in range(3):
        state = step(jax.random.key(10 + t), state)
    rng = np.random.default_rng(0)
    muted = np.full((N, 3), -1, np.int32)
    muted[:, 0] = rng.integers(0, N, N)
    muted[::2, 2] = rng.integers(0, N, N // 2)
    state = state.replace(graph=state.graph.replace(muted=jnp.asarray(muted)))
    users = jnp.arange(N, dtype=jnp.int32)
    first = _feeds(params, state, users, jax.random.key(1), False)
    state = recsys.mark_seen(state, users, first, params)
    s = jax.device_get(state)
    live = s.posts.id >= 0
    assert (s.posts.kind[live] == PostKind.COMMENT).any()  # comments in the ring, not in feeds
    assert (s.posts.likes > 0).sum() > 20 and (s.memory.seen >= 0).mean() > 0.9
    return params, state


KEYS = [jax.random.key(i) for i in (2, 3)]


@pytest.mark.parametrize("over", [
    {},
    {"explore_frac": 0.05},  # sparse exploration check
    {"explore_frac": 0.6},  # rows of more than E swaps: the dense check
    {"explore_frac": 0.05, "seen_policy": "none"},
    {"explore_frac": 0.2, "exclude_own": False, "overfetch": 0},
    {"pool_size": 16},  # fewer pool entries than K + overfetch + margin: the whole pool
])
def test_sorted_pool_equals_topk_path(world, over, patch):
    params, state = world
    params = params.replace(**over)
    users = jnp.asarray([-1, N, 0, 7] + list(range(9, N, 3)), jnp.int32)  # incl. out of range
    assert _mismatch(params, state, users, KEYS) == []
    feed = _feeds(params, state, users, KEYS[0], True)
    assert feed.valid[2:].mean() > (0.2 if "pool_size" in over else 0.5)
    assert not feed.valid[:2].any()
    if "pool_size" not in over:  # the lookup path ran, not its dense fallback: garbage there
        broken = recsys._reddit_feed_dense  # changes nothing
        patch("_reddit_feed_dense", lambda *a: jax.tree.map(lambda x: x * 0, broken(*a)))
        assert _mismatch(params, state, users, KEYS[:1]) == []


def test_fallbacks_to_the_dense_pool_scan(world, patch):
    """Cuts past the indexed head, and authors with more head posts than are looked up, take
    the dense path; the feeds still equal the reference's (and do depend on that path)."""
    params, state = world
    params = params.replace(explore_frac=0.05)
    users = jnp.arange(0, N, 2, dtype=jnp.int32)
    # user 0 authors the 12 hottest posts; user 2 mutes the author of the next 8
    pslot, _ = recsys._pool(jax.random.key(0), state, params)
    pslot = np.asarray(pslot)
    author = np.asarray(state.posts.author).copy()
    author[pslot[:12]] = 0
    author[pslot[12:20]] = 5
    muted = np.asarray(state.graph.muted).copy()
    muted[2, 1] = 5
    state = state.replace(posts=state.posts.replace(author=jnp.asarray(author)),
                          graph=state.graph.replace(muted=jnp.asarray(muted)))
    for margin in (8, 0):  # 0: the seen ring alone can push the cut past the head
        patch("_REDDIT_MARGIN", margin)
        assert _mismatch(params, state, users, KEYS) == []
    broken = recsys._reddit_feed_dense
    patch("_reddit_feed_dense", lambda *a: jax.tree.map(lambda x: x * 0, broken(*a)))
    assert "ids" in _mismatch(params, state, users, KEYS[:1])  # the fallback ran


@pytest.mark.parametrize("broken", ["no_exclusions", "no_dedupe", "draws"])
def test_comparison_rejects_broken_variants(world, broken, patch):
    """Negative controls: each deliberately wrong sorted-pool variant differs from the
    reference somewhere on this society."""
    params, state = world
    params = params.replace(explore_frac=0.1)
    users = jnp.arange(N, dtype=jnp.int32)
    if broken == "no_exclusions":  # the per-user filters skipped
        patch("_nth_kept", lambda excluded, j, none: j + 0 * excluded[:, :1])
    elif broken == "no_dedupe":  # a post both seen and muted counted twice
        patch("_dedupe", lambda d, none: d)
    elif broken == "draws":  # exploration uniforms one element off
        real = recsys._uniform_at
        patch("_uniform_at", lambda key, flat: real(key, flat + 1))
    assert _mismatch(params, state, users, KEYS[:1]) != []


@pytest.mark.parametrize("shape", [(7, 13), (300, 20), (1, 1)])
def test_uniform_at_reproduces_jax_random_uniform(shape):
    for seed in range(3):
        key = jax.random.split(jax.random.key(seed), 4)[2]
        assert recsys._uniform_at_ok(key)
        flat = jnp.arange(np.prod(shape), dtype=jnp.int32).reshape(shape)
        np.testing.assert_array_equal(np.asarray(recsys._uniform_at(key, flat)),
                                      np.asarray(jax.random.uniform(key, shape)))
        pick = flat[:, ::2]
        np.testing.assert_array_equal(np.asarray(recsys._uniform_at(key, pick)),
                                      np.asarray(jax.random.uniform(key, shape))[:, ::2])
    assert not recsys._uniform_at_ok(jax.random.key(0, impl="rbg"))


def test_nth_kept_and_dedupe():
    none = 2 ** 30
    d = jnp.asarray([[5, 2, 5, none, 9], [none] * 5], jnp.int32)
    dd = recsys._dedupe(d, none)
    np.testing.assert_array_equal(np.asarray(dd), [[5, 2, none, none, 9], [none] * 5])
    got = recsys._nth_kept(dd, jnp.arange(8, dtype=jnp.int32)[None], none)
    want0 = [p for p in range(20) if p not in (2, 5, 9)][:8]
    np.testing.assert_array_equal(np.asarray(got), [want0, list(range(8))])


def test_no_users_by_posts_intermediate():
    """The sorted-pool path never materialises a [B, P] array (B users, P posts)."""
    params = society.make_params(**{**BASE, "num_users": 37, "post_capacity": 101,
                                    "num_seed_posts": 101, "pool_size": 40, "feed_size": 5,
                                    "explore_frac": 0.1, "crowd_budget": 64})
    assert_no_users_by_posts(params)
