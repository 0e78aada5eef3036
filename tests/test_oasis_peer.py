"""OASIS's own code (camel-oasis) as the reference for our reddit recommender, and the pieces of
benchmarks/society_scale.py that feed it: the post table in the form OASIS's recommenders take
(`oasis_post_table`), the per-user agreement check up to ties (`reddit_agreement`, with negative
controls), and our NumPy rendering of OASIS's formulas.

The tests against OASIS's code run where camel-oasis is importable: in this interpreter, or in
the one named by $JAXSOCIAL_OASIS_PYTHON (camel-oasis pins transformers<5, so it usually lives in
its own venv: benchmarks/oasis-requirements.txt); otherwise they skip saying so."""
import datetime
import importlib.metadata
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.social import recsys, society
from jaxsocial.social.state import PostKind

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)
import society_scale as ss  # noqa: E402  benchmarks/society_scale.py

# OASIS's post table columns (its social_platform/schema/post.sql), in its order
POST_COLUMNS = ["post_id", "user_id", "original_post_id", "content", "quote_content",
                "created_at", "num_likes", "num_dislikes", "num_shares", "num_reports"]
N, K = 200, 20


def _oasis_in_this_python() -> bool:
    try:
        importlib.metadata.version("camel-oasis")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def _oasis_python():
    if _oasis_in_this_python():
        return sys.executable
    py = os.environ.get(ss.OASIS_ENV)
    return py if py and os.path.exists(py) else None


needs_oasis = pytest.mark.skipif(
    _oasis_python() is None,
    reason=f"camel-oasis is not installed here and ${ss.OASIS_ENV} names no interpreter with it "
           f"(install: {ss.OASIS_INSTALL})")


def _society(seed=0):
    """N users x N posts with many ties in the hot score (likes 0-3, dislikes 0-2, 30 ticks);
    params with OASIS's semantics: one list for every user (no own / seen / muted filters)."""
    params = society.make_params(
        num_users=N, post_capacity=N, num_seed_posts=N, embed_dim=8, content_len=2,
        recsys="reddit", feed_size=K, pool_size=64, overfetch=4, seen_memory=10, max_muted=3,
        max_following=8, init_following=4, in_network=0, max_active=64, crowd_budget=N,
        seed_max_age=30, exclude_own=False, seen_policy="none", explore_frac=0.0)
    state = society.reset(jax.random.key(seed), params)
    rng = np.random.default_rng(seed)
    posts = state.posts.replace(likes=jnp.asarray(rng.integers(0, 4, N), jnp.int32),
                                dislikes=jnp.asarray(rng.integers(0, 3, N), jnp.int32))
    return params, state.replace(posts=posts)


def _table(params, state):
    s = jax.device_get(state)
    live = (s.posts.id >= 0) & (s.posts.kind != PostKind.COMMENT)
    return dict(post_id=s.posts.id[live].astype(np.int64), author=s.posts.author[live],
                created_seconds=np.asarray(recsys.post_seconds(
                    s, params, s.posts.created_at[live].astype(np.int64))),
                likes=s.posts.likes[live].astype(np.int64),
                dislikes=s.posts.dislikes[live].astype(np.int64))


def _our_feeds(params, state):
    users = jnp.arange(N, dtype=jnp.int32)
    return np.asarray(recsys.recommend(jax.random.key(1), state, users, params).ids)


# ------------------------------------------------------------------------------------------------
# without OASIS: the input builder, the agreement check, our rendering


def test_post_table_is_oasis_form():
    ids = np.array([7, 3, 5])
    sec = np.array([1_700_000_000, 1_700_003_600, 1_699_996_400])
    rows = ss.oasis_post_table(ids, np.array([1, 2, 3]), sec, np.array([4, 0, 2]),
                               np.array([1, 0, 0]), original=np.array([-1, 7, -1]))
    assert [r["post_id"] for r in rows] == [3, 5, 7]  # SELECT * order
    assert all(list(r) == POST_COLUMNS for r in rows)
    by_id = {r["post_id"]: r for r in rows}
    assert by_id[3]["original_post_id"] == 7 and by_id[7]["original_post_id"] is None
    assert (by_id[7]["num_likes"], by_id[7]["num_dislikes"], by_id[7]["user_id"]) == (4, 1, 1)
    assert all(type(r["num_likes"]) is int and type(r["post_id"]) is int for r in rows)
    epoch = datetime.datetime(1970, 1, 1)
    for p, x in zip(ids, sec):
        c = by_id[int(p)]["created_at"]
        assert c.endswith(".000000")  # the format rec_sys_reddit parses first
        t = datetime.datetime.strptime(c, "%Y-%m-%d %H:%M:%S.%f")
        assert (t - epoch).total_seconds() == x
    assert by_id[7]["created_at"] == "2023-11-14 22:13:20.000000"


def test_agreement_accepts_ties_and_rejects_changes():
    ids = np.arange(10, 20)
    hot = np.array([5.0, 4.0, 4.0, 3.0, 2.0, 2.0, 2.0, 1.0, 0.5, 0.0])
    top = [10, 11, 12, 13, 14]
    feeds = np.array([top, [10, 12, 11, 13, 14], [10, 11, 12, 13, 16]])  # ties swapped
    a = ss.reddit_agreement(feeds, top, ids, hot)
    assert a == dict(users=3, equal_up_to_ties=3, exact_order=1, max_gap=0.0, tol=1e-4)
    # negative controls: a lower post, a duplicate, an unknown id, a score off by 1e-3
    bad = np.array([[10, 11, 12, 13, 17], [10, 11, 11, 13, 14], [10, 11, 12, 13, 99]])
    b = ss.reddit_agreement(bad, top, ids, hot)
    assert b["equal_up_to_ties"] == 0 and b["max_gap"] == np.inf
    off = hot.copy()
    off[6] += 1e-3  # post 16, tied with 14 in the third row
    c = ss.reddit_agreement(feeds, top, ids, off)
    assert c["equal_up_to_ties"] == 2 and c["max_gap"] == pytest.approx(1e-3)


def test_numpy_rendering_equals_ours():
    params, state = _society()
    t = _table(params, state)
    top, rec, hot = ss._oasis_reddit(ss.oasis_created_at(t["created_seconds"]), t["likes"],
                                     t["dislikes"], t["post_id"].tolist(), N, K)
    assert len(rec) == N and rec[0] == top
    feeds = _our_feeds(params, state)
    a = ss.reddit_agreement(feeds, top, t["post_id"], hot)
    assert a["equal_up_to_ties"] == N, a
    # negative control: ours with a post outside the top k pushed up by 10,000 likes
    out = np.setdiff1d(t["post_id"], top)[0]
    slot = int(out) % N
    bumped = state.replace(posts=state.posts.replace(likes=state.posts.likes.at[slot].add(10_000)))
    b = ss.reddit_agreement(_our_feeds(params, bumped), top, t["post_id"], hot)
    assert b["equal_up_to_ties"] == 0


@pytest.mark.skipif(_oasis_in_this_python(), reason="camel-oasis is importable here")
def test_worker_skips_with_install_line_without_oasis():
    params, state = _society()
    o = ss.run_oasis(sys.executable, "reddit", _table(params, state), N, K, calls=1)
    assert "camel-oasis not importable" in o["skipped"] and "pip install" in o["skipped"]
    assert ss.OASIS_PIN in o["skipped"]


# ------------------------------------------------------------------------------------------------
# against OASIS's own code


@needs_oasis
def test_reddit_equals_oasis_code():
    params, state = _society()
    t = _table(params, state)
    o = ss.run_oasis(_oasis_python(), "reddit", t, N, K, calls=1)
    assert "skipped" not in o, o.get("skipped")
    assert o["function"] == "oasis.social_platform.recsys.rec_sys_reddit"
    assert o["users"] == N and o["same_list_for_all"] and o["rows_k_distinct_posts"] == N
    # OASIS's calculate_hot_score of every post == ours (in our reference form)
    now = int(recsys.post_seconds(state, params, int(state.tick)))
    ours = np.asarray(recsys.reddit_hot_score(t["likes"], t["dislikes"], t["created_seconds"],
                                              reference_seconds=now), np.float64)
    order = np.argsort(t["post_id"])
    assert o["hot_ids"] == t["post_id"][order].tolist()
    theirs = np.asarray(o["hot"]) - (now - 1134028003) / 45000
    np.testing.assert_allclose(ours[order], theirs, atol=1e-5)
    with pytest.raises(AssertionError):  # negative control: one score off by 1e-4
        np.testing.assert_allclose(ours[order] + (np.arange(N) == N // 2) * 1e-4, theirs,
                                   atol=1e-5)
    # every user's feed == OASIS's list up to ties (many ties here)
    feeds = _our_feeds(params, state)
    a = ss.reddit_agreement(feeds, o["top"], o["hot_ids"], o["hot"])
    assert a["equal_up_to_ties"] == N, a
    # negative controls against OASIS's output: its list with the last post replaced by the
    # lowest-scored post; our feeds from a post outside OASIS's list pushed up by 10,000 likes
    low = o["hot_ids"][int(np.argmin(o["hot"]))]
    wrong = o["top"][:-1] + [low]
    assert ss.reddit_agreement(feeds, wrong, o["hot_ids"], o["hot"])["equal_up_to_ties"] == 0
    out = np.setdiff1d(t["post_id"], o["top"])[0]
    bumped = state.replace(posts=state.posts.replace(
        likes=state.posts.likes.at[int(out) % N].add(10_000)))
    b = ss.reddit_agreement(_our_feeds(params, bumped), o["top"], o["hot_ids"], o["hot"])
    assert b["equal_up_to_ties"] == 0


@needs_oasis
def test_random_oasis_code_rows():
    params, state = _society()
    t = _table(params, state)
    o = ss.run_oasis(_oasis_python(), "random", t, N, K, calls=1)
    assert o["function"] == "oasis.social_platform.recsys.rec_sys_random"
    assert o["users"] == N and o["rows_k_distinct_posts"] == N
