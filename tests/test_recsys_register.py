"""Your own recommender (`recsys.register`): docs/society.md's example run as written, its feeds
against NumPy, a registered copy of twitter's formula against twitter itself, malformed
functions and unknown names refused in one line -- each with a negative control."""
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_no_users_by_posts, load_launcher

from jaxsocial.social import recsys, society
from jaxsocial.social.state import PostKind

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "<!-- tests/test_recsys_register.py runs the next block, as written -->"
rec = jax.jit(recsys.recommend, static_argnums=3)


@pytest.fixture(scope="module")
def example():
    """docs/society.md's example, run as written, then two more ticks (seen rings, likes)."""
    with open(os.path.join(ROOT, "docs", "society.md")) as f:
        text = f.read()
    block = re.search(re.escape(MARK) + r"\n```python\n(.*?)```", text, flags=re.S).group(1)
    ns = {}
    exec(compile(block, "docs/society.md", "exec"), ns)  # noqa: S102 -- the docs' own code
    params, state = ns["params"], ns["state"]
    tick = jax.jit(lambda k, s: society.step(k, s, None, params))
    for t in (2, 3):
        state, _ = tick(jax.random.key(t), state)
    return ns["newest_liked"], params, state


def np_newest_liked(s, u, slots):
    """The example's score, from its comment and formula, in NumPy (float64)."""
    p = s.posts
    kin = s.users.persona[p.author[slots]] == s.users.persona[u]
    return 100.0 * (p.likes[slots] > 0) + 10.0 * kin - (int(s.tick) - p.created_at[slots])


def mismatches(feed, s, params, users, score=np_newest_liked, use_seen=True, use_muted=True):
    """Users whose feed is not the NumPy rule's up to ties: every live non-comment post not by
    the user or an author it muted, not in its seen ring, scored by `score`, the top K; the
    feed must hold K (or all) distinct such posts whose scores are the top K's, in order."""
    p, k = s.posts, params.feed_size
    ids, valid, fscore = (np.asarray(x) for x in (feed.ids, feed.valid, feed.score))
    bad = []
    for row, u in enumerate(users):
        ok = (p.id >= 0) & (p.kind != PostKind.COMMENT) & (p.author != u)
        if use_muted:
            ok &= ~np.isin(p.author, s.graph.muted[u][s.graph.muted[u] >= 0])
        if use_seen:
            ok &= ~np.isin(p.id, s.memory.seen[u])
        slots = np.flatnonzero(ok)
        want = np.sort(score(s, u, slots))[::-1][:k]
        got_ids = ids[row][valid[row]]
        got = score(s, u, got_ids % p.id.shape[0])
        if not (len(got_ids) == len(want) and len(set(got_ids.tolist())) == len(got_ids)
                and np.isin(got_ids, p.id[slots]).all() and np.allclose(got, want)
                and np.allclose(fscore[row][valid[row]], got)):
            bad.append(int(u))
    return bad


def test_example_feeds_equal_numpy(example):
    """The example's feeds (whole buffer as the pool, no exploration) equal NumPy's rule; the
    check rejects a reference that ranks oldest first or ignores seen posts or mutes, and a
    feed with one post swapped for a worse one."""
    fn, params, state = example
    params = params.replace(pool_size=params.post_capacity, in_network=0, explore_frac=0.0)
    s = jax.device_get(state)
    seen = (s.memory.seen >= 0).any(axis=1)
    users = np.concatenate([np.flatnonzero(seen)[:150], np.flatnonzero(~seen)[:50]])
    assert len(users) == 200 and seen[users].sum() >= 100
    # every other user mutes the author of the post NumPy ranks first for it
    muted = np.full((params.num_users, params.max_muted), -1, np.int32)
    for u in users[::2]:
        ok = (s.posts.id >= 0) & (s.posts.kind != PostKind.COMMENT) & (s.posts.author != u)
        ok &= ~np.isin(s.posts.id, s.memory.seen[u])
        sc = np.where(ok, np_newest_liked(s, u, np.arange(params.post_capacity)), -np.inf)
        muted[u, 1] = s.posts.author[np.argmax(sc)]
    state = state.replace(graph=state.graph.replace(muted=jnp.asarray(muted)))
    s = jax.device_get(state)
    feed = rec(jax.random.key(0), state, jnp.asarray(users, jnp.int32), params)
    assert np.asarray(feed.valid).all()
    assert mismatches(feed, s, params, users) == []
    # negative controls: wrong references ...
    oldest = lambda s, u, sl: -np_newest_liked(s, u, sl)  # noqa: E731
    assert len(mismatches(feed, s, params, users, score=oldest)) == len(users)
    assert len(mismatches(feed, s, params, users, use_seen=False)) >= 50
    # (fewer than the 100 muting users: where a tie of equal score takes the muted post's
    # place, the reference without mutes still agrees up to ties)
    assert len(mismatches(feed, s, params, users, use_muted=False)) >= 25
    # ... and a feed with its best post replaced by a live post it ranks last
    ids = np.asarray(feed.ids).copy()
    row = 7
    sc = np_newest_liked(s, users[row], np.arange(params.post_capacity))
    ok = (s.posts.id >= 0) & (s.posts.author != users[row])
    ids[row, 0] = s.posts.id[np.flatnonzero(ok)[np.argmin(sc[ok])]]
    assert mismatches(feed.replace(ids=jnp.asarray(ids)), s, params, users) == [users[row]]


def test_registered_twitter_copy_gives_twitter_feeds(example):
    """twitter's formula registered as a function gives twitter's feeds on twitter's path
    (pool cut, random pool posts, in-network posts, seen rings, mutes, exploration), up to
    float near-ties; the same function with the in-network bonus left out does not."""
    _, params, state = example
    params = params.replace(recsys="twitter", pool_size=128, pool_random=32, in_network=8,
                            explore_frac=0.2)
    c0 = params.pool_size + params.pool_random

    def twitter_copy(user, candidates, state, w_in=params.w_in):
        post = state.posts.slot(candidates)
        cos = jnp.einsum("bd,bcd->bc", state.users.interest[user], state.posts.embedding[post])
        age = (state.tick - state.posts.created_at[post]).astype(jnp.float32)
        in_net = (jnp.arange(candidates.shape[1]) >= c0)[None]
        return recsys._personalized_from_cos(
            cos, age, state.posts.likes[post], in_net, params.w_sim, params.w_rec,
            params.w_pop, w_in, params.recency, params.recency_tau)

    recsys.register("twitter_copy", twitter_copy)
    recsys.register("twitter_copy_no_w_in", lambda u, c, s: twitter_copy(u, c, s, w_in=0.0))
    users = jnp.arange(params.num_users, dtype=jnp.int32)
    key = jax.random.key(4)
    want = rec(key, state, users, params)

    def differ(name):
        got = rec(key, state, users, params.replace(recsys=name))
        a, b = np.asarray(want.ids), np.asarray(got.ids)
        sa, sb = np.asarray(want.score), np.asarray(got.score)
        tie = np.isclose(sa, sb, rtol=0, atol=1e-5) & (sa > -1e8)  # exploration: -1e9
        return np.flatnonzero(((a != b) & ~tie).any(axis=1)
                              | (np.asarray(want.valid) != np.asarray(got.valid)).any(axis=1))

    assert np.asarray(want.valid).mean() > 0.95
    assert (np.asarray(want.score) == -1e9).sum() > 100  # exploration swaps
    assert len(differ("twitter_copy")) == 0
    assert len(differ("twitter_copy_no_w_in")) >= 100  # negative control


def bad_shape(user, candidates, state):
    return jnp.zeros(candidates.shape[:1])


def bad_dtype(user, candidates, state):
    return candidates > 0


def log_likes(user, candidates, state):
    return jnp.log(state.posts.likes[state.posts.slot(candidates)].astype(jnp.float32))


def test_malformed_functions_are_refused_in_one_line(example):
    """Another shape or dtype: refused when traced; non-finite scores (log of 0 likes): refused
    by `check` on the real state; each in one line naming the function. A finite function
    (the example's) passes `check`."""
    fn, params, state = example
    users = jnp.arange(16, dtype=jnp.int32)
    for f, what in ((bad_shape, r"float32 of shape \(16,\); expected real scores \[B, C\] = "
                     r"\(16, \d+\)"), (bad_dtype, r"bool of shape \(16, \d+\)")):
        recsys.register(f.__name__, f)
        with pytest.raises(ValueError, match=rf"recsys '{f.__name__}': .*\.{f.__name__}\(user "
                                             rf"\[B\], candidates \[B, C\], state\) returned "
                                             rf"{what}") as e:
            rec(jax.random.key(0), state, users, params.replace(recsys=f.__name__))
        assert "\n" not in str(e.value)
    recsys.register("log_likes", log_likes)
    p = params.replace(recsys="log_likes")
    with pytest.raises(ValueError, match=r"recsys 'log_likes': .*\.log_likes returned \d+ "
                                         r"non-finite scores of \d+ on the candidates of 64 "
                                         r"sampled users \(first: -inf for user") as e:
        recsys.check(state, p)
    assert "\n" not in str(e.value)
    recsys.check(state, params)  # the example's function: finite
    recsys.check(state, params.replace(recsys="twitter"))  # built-ins: nothing to check


def test_register_refuses_bad_names_and_functions():
    for name, fn, msg in (("twitter", bad_shape, "'twitter' is a built-in recommender"),
                          ("my recsys", bad_shape, "must be an identifier"),
                          ("mine", None, "needs a callable")):
        with pytest.raises(ValueError, match=msg):
            recsys.register(name, fn)
    assert "mine" not in recsys.registered()


def test_config_checks_accept_registered_names_and_list_them(example, tmp_path):
    """make_params and launch/simulate.py's config check accept a registered name; an unknown
    one is refused in one line listing the built-in and registered names; launch/simulate.py
    refuses non-finite scores after `reset`, before it makes the workdir."""
    assert "newest_liked" in recsys.registered()
    assert society.make_params(recsys="newest_liked").recsys == "newest_liked"
    with pytest.raises(ValueError, match=r"invalid SocialParams.recsys='newest_likd' \(expected "
                                         r"one of 'random', 'reddit', 'twitter', 'twhin', "
                                         r"'newest_liked'.*recsys.register adds your own\)"):
        society.make_params(recsys="newest_likd")
    sim = load_launcher("launch/simulate.py")
    from ml_collections import config_dict
    config = config_dict.ConfigDict(dict(ticks=2, metrics_every=1, seed=0, society=dict(
        num_users=100, post_capacity=100, num_seed_posts=50, pool_size=16, crowd_budget=64,
        recsys="newest_liked")))
    assert sim.check_config(config).recsys == "newest_liked"
    config.society.recsys = "newest_likd"
    with pytest.raises(ValueError, match=r"invalid society.recsys='newest_likd' \(expected one "
                                         r"of .*'newest_liked'"):
        sim.check_config(config)
    recsys.register("log_likes", log_likes)
    config.society.recsys = "log_likes"
    with pytest.raises(ValueError, match=r"recsys 'log_likes': .* non-finite scores"):
        sim.run(config, str(tmp_path / "run"), progress=False)
    assert not (tmp_path / "run").exists()


def test_no_users_by_posts_intermediate(example):
    """A registered recommender's tick, like twitter's, never builds a [B, P] array."""
    assert_no_users_by_posts(society.make_params(
        num_users=37, post_capacity=101, num_seed_posts=101, pool_size=16, in_network=3,
        crowd_budget=64, recsys="newest_liked"))



def test_a_training_run_refuses_non_finite_scores_before_it_compiles(example, tmp_path):
    """runner.train checks a registered recommender on the run's own society before the epoch
    is compiled and before config.json or a log is written (launch/train.py then removes the
    workdir it made, as for every refusal at start); the example's finite function passes."""
    from conftest import load_config_file

    from jaxsocial.train import run as run_lib
    from jaxsocial.train import runner
    recsys.register("log_likes", log_likes)
    c = load_config_file("configs/demo.py", "smoke")
    c.society.recsys = "log_likes"
    with pytest.raises(ValueError, match=r"recsys 'log_likes': .* non-finite scores"):
        runner.train(c, str(tmp_path / "run"))
    assert not [n for n in ("config.json", "metrics.jsonl") if (tmp_path / "run" / n).exists()]
    c.society.recsys = "newest_liked"  # control: the example's finite scores pass
    run = run_lib.build_run(c)
    recsys.check(run.init_state().society, run.setup.social_params)
