"""apply_actions against an independent pure-Python model of OASIS's action semantics."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.social import society
from jaxsocial.social.actions import ActionType as T
from jaxsocial.social.actions import Reason, apply_actions, empty_actions, make_actions
from jaxsocial.social.state import PostKind, ReactionKind

N, P, F, B = 6, 32, 4, 8
PARAMS = society.make_params(
    num_users=N, post_capacity=P, num_seed_posts=16, init_following=1, max_following=F,
    max_muted=2, reaction_memory=64, content_len=3, embed_dim=4, pool_size=4, in_network=0,
    crowd=False, max_active=4, crowd_budget=8)


@pytest.fixture(scope="module")
def apply1():
    return jax.jit(functools.partial(apply_actions, params=PARAMS))


@pytest.fixture(scope="module")
def state0():
    return society.reset(jax.random.key(0), PARAMS)


# ------------------------------------------------------------------------------------------
# Reference: one action at a time on Python dicts and sets.

POST_T = {T.LIKE_POST, T.UNLIKE_POST, T.DISLIKE_POST, T.UNDO_DISLIKE_POST, T.REPORT_POST,
          T.REPOST, T.QUOTE_POST, T.CREATE_COMMENT}
COMMENT_T = {T.LIKE_COMMENT, T.UNLIKE_COMMENT, T.DISLIKE_COMMENT, T.UNDO_DISLIKE_COMMENT}
USER_T = {T.FOLLOW, T.UNFOLLOW, T.MUTE, T.UNMUTE}
REACT = {T.LIKE_POST: ("like", 1), T.UNLIKE_POST: ("like", -1), T.LIKE_COMMENT: ("like", 1),
         T.UNLIKE_COMMENT: ("like", -1), T.DISLIKE_POST: ("dislike", 1),
         T.UNDO_DISLIKE_POST: ("dislike", -1), T.DISLIKE_COMMENT: ("dislike", 1),
         T.UNDO_DISLIKE_COMMENT: ("dislike", -1), T.REPOST: ("repost", 1),
         T.REPORT_POST: ("report", 1)}
NEW_KIND = {T.CREATE_POST: "post", T.REPOST: "repost", T.QUOTE_POST: "quote",
            T.CREATE_COMMENT: "comment"}
KIND_NAME = {int(PostKind.POST): "post", int(PostKind.COMMENT): "comment",
             int(PostKind.REPOST): "repost", int(PostKind.QUOTE): "quote"}


class Reference:

    def __init__(self, state):
        s = jax.device_get(state)
        self.next_id = int(s.posts.next_id)
        self.posts = {}
        for slot in range(P):
            i = int(s.posts.id[slot])
            if i >= 0:
                self.posts[i] = dict(kind=KIND_NAME[int(s.posts.kind[slot])],
                                     parent=int(s.posts.parent[slot]), like=0, dislike=0,
                                     repost=0, quote=0, comment=0, report=0)
        self.follow = {u: {int(v) for v in s.graph.following[u] if v >= 0} for u in range(N)}
        self.mute = {u: set() for u in range(N)}
        self.react = set()  # (user, post, family)

    def alive(self, i):
        return i in self.posts and i >= self.next_id - P

    def apply(self, typ, actor, target, valid=True):
        if not valid:
            return Reason.PADDING
        if not 0 <= typ < len(T):
            return Reason.BAD_TYPE
        typ = T(typ)
        if typ == T.MALFORMED:
            return Reason.MALFORMED
        if not 0 <= actor < N:
            return Reason.BAD_ACTOR
        eff = target
        if typ in POST_T or typ in COMMENT_T:
            if not 0 <= target < self.next_id:
                return Reason.MISSING_POST
            if not self.alive(target):
                return Reason.STALE_POST
            kind = self.posts[target]["kind"]
            if typ in POST_T and kind == "repost":
                eff = self.posts[target]["parent"]
                if not self.alive(eff):
                    return Reason.STALE_POST
            if typ in POST_T and kind == "comment":
                return Reason.WRONG_KIND
            if typ in COMMENT_T and kind != "comment":
                return Reason.WRONG_KIND
        if typ in USER_T:
            if not 0 <= target < N:
                return Reason.BAD_USER
            if target == actor:
                return Reason.SELF_TARGET
            rel = self.follow if typ in (T.FOLLOW, T.UNFOLLOW) else self.mute
            cap = F if rel is self.follow else PARAMS.max_muted
            if typ in (T.FOLLOW, T.MUTE):
                if target in rel[actor]:
                    return Reason.DUPLICATE
                if len(rel[actor]) >= cap:
                    return Reason.FOLLOWING_FULL if rel is self.follow else Reason.MUTE_FULL
                rel[actor].add(target)
            else:
                if target not in rel[actor]:
                    return Reason.NOTHING_TO_UNDO
                rel[actor].remove(target)
        if typ in REACT:
            fam, sign = REACT[typ]
            key = (actor, eff, fam)
            if sign > 0 and key in self.react:
                return Reason.DUPLICATE
            if sign < 0 and key not in self.react:
                return Reason.NOTHING_TO_UNDO
            (self.react.add if sign > 0 else self.react.remove)(key)
            self.posts[eff][fam] += sign
        if typ == T.QUOTE_POST:
            self.posts[eff]["quote"] += 1
        if typ == T.CREATE_COMMENT:
            self.posts[eff]["comment"] += 1
        if typ in NEW_KIND:
            new = self.next_id
            self.posts.pop(new - P, None)
            self.posts[new] = dict(kind=NEW_KIND[typ], parent=-1 if typ == T.CREATE_POST else eff,
                                   like=0, dislike=0, repost=0, quote=0, comment=0, report=0)
            self.next_id += 1
        return Reason.OK


def _random_stream(rng, length, next_id):
    types = rng.choice(len(T) + 1, size=length)  # len(T) = one out-of-range type
    out = []
    for typ in types:
        actor = int(rng.integers(-1, N + 1)) if rng.random() < 0.05 else int(rng.integers(0, N))
        if typ in USER_T:
            target = int(rng.integers(-1, N + 1))
        else:
            target = int(rng.integers(-2, next_id + 2))
        valid = rng.random() > 0.05
        out.append((int(typ), actor, target, valid))
        next_id += int(typ in NEW_KIND)
    return out


def _post_table(state):
    """{alive id: (kind, parent, likes, dislikes, reposts, quotes, comments, reports)}."""
    s = jax.device_get(state.posts)
    return {int(s.id[k]): (KIND_NAME[int(s.kind[k])], int(s.parent[k]), int(s.likes[k]),
                           int(s.dislikes[k]), int(s.reposts[k]), int(s.quotes[k]),
                           int(s.comments[k]), int(s.reports[k]))
            for k in range(P) if s.id[k] >= 0}


def _ref_table(ref):
    return {i: (p["kind"], p["parent"], p["like"], p["dislike"], p["repost"], p["quote"],
                p["comment"], p["report"]) for i, p in ref.posts.items() if ref.alive(i)}


def _records(state):
    """Set of (user, post, kind) reaction records that point at alive posts."""
    m = jax.device_get(state.memory)
    alive = set(_post_table(state))
    fam = {ReactionKind.LIKE: "like", ReactionKind.DISLIKE: "dislike",
           ReactionKind.REPOST: "repost", ReactionKind.REPORT: "report"}
    out = []
    for u in range(N):
        for r in range(m.react_post.shape[1]):
            if m.react_post[u, r] in alive:
                out.append((u, int(m.react_post[u, r]), fam[int(m.react_kind[u, r])]))
    return out


def _records_of(state):
    m = jax.device_get(state.memory)
    return {(u, int(p), int(k)) for u in range(m.react_post.shape[0])
            for p, k in zip(m.react_post[u], m.react_kind[u]) if p >= 0}


def mk(params, type, actor, target=None, content=None, embedding=None, valid=None, size=B):
    """make_actions padded with valid=False rows to a fixed batch size (one compile)."""
    n = len(type)
    def pad(x, v):
        return None if x is None else np.concatenate(
            [np.asarray(x), np.full((size - n,) + np.shape(x)[1:], v, np.asarray(x).dtype)])
    valid = np.ones(n, bool) if valid is None else valid
    emb = np.ones((n, params.embed_dim)) if embedding is None else embedding
    return make_actions(params, pad(type, 0), pad(actor, 0), pad(target, -1), pad(content, 0),
                        pad(emb, 0.0), pad(valid, False))


def _one(a):
    return make_actions(PARAMS, type=[a[0]], actor=[a[1]], target=[a[2]], valid=[a[3]],
                        embedding=np.ones((1, 4)))


def test_sequential_matches_reference_model(apply1, state0):
    rng = np.random.default_rng(0)
    ref = Reference(state0)
    state = state0
    stream = _random_stream(rng, 400, int(state0.posts.next_id))
    seen_reasons = set()
    like_events = {}
    for a in stream:
        want = ref.apply(*a)
        state, info = apply1(state, _one(a))
        got = Reason(int(info.reason[0]))
        assert got == want, (a, got, want)
        seen_reasons.add(got)
        if got == Reason.OK and a[0] in (T.LIKE_POST, T.UNLIKE_POST, T.LIKE_COMMENT,
                                         T.UNLIKE_COMMENT):
            e = int(info.effective_target[0])
            like_events[e] = like_events.get(e, 0) + (1 if a[0] in (T.LIKE_POST,
                                                                    T.LIKE_COMMENT) else -1)
    assert _post_table(state) == _ref_table(ref)
    # Like count = accepted likes - unlikes, for every post still alive.
    for pid, row in _post_table(state).items():
        assert row[2] == like_events.get(pid, 0)
    # Nobody reacts twice; records are exactly the model's reactions on alive posts.
    recs = _records(state)
    assert len(recs) == len(set(recs))
    assert set(recs) == {r for r in ref.react if ref.alive(r[1])}
    # Follower counts = in-degrees of the graph; following counts = out-degrees.
    g = np.asarray(state.graph.following)
    indeg = np.bincount(g[g >= 0], minlength=N)
    np.testing.assert_array_equal(np.asarray(state.users.num_followers), indeg)
    np.testing.assert_array_equal(np.asarray(state.users.num_following), (g >= 0).sum(1))
    assert {u: set(g[u][g[u] >= 0].tolist()) for u in range(N)} == ref.follow
    # The stream exercised the interesting paths.
    for r in (Reason.OK, Reason.PADDING, Reason.MISSING_POST, Reason.STALE_POST,
              Reason.WRONG_KIND, Reason.SELF_TARGET, Reason.DUPLICATE, Reason.NOTHING_TO_UNDO,
              Reason.BAD_ACTOR, Reason.BAD_TYPE, Reason.MALFORMED, Reason.BAD_USER):
        assert r in seen_reasons, r


def test_batch_equals_one_at_a_time_without_conflicts(apply1, state0):
    """Distinct (actor, family, target) keys: order does not matter, batch == sequential."""
    rng = np.random.default_rng(1)
    kinds = np.asarray(state0.posts.kind)
    fams = {T.LIKE_POST: 0, T.UNLIKE_POST: 0, T.DISLIKE_POST: 1, T.REPOST: 2, T.REPORT_POST: 3,
            T.FOLLOW: 4, T.UNFOLLOW: 4, T.MUTE: 5, T.UNMUTE: 5, T.CREATE_POST: None,
            T.QUOTE_POST: None, T.CREATE_COMMENT: None, T.REFRESH: None, T.DO_NOTHING: None}
    acts, keys = [], set()
    while len(acts) < 32:
        typ = list(fams)[rng.integers(len(fams))]
        actor = int(rng.integers(N))
        target = int(rng.integers(N)) if typ in USER_T else int(rng.integers(16))
        if typ not in USER_T and kinds[target] == PostKind.REPOST:
            continue
        key = (actor, fams[typ], target)
        if fams[typ] is not None and key in keys:
            continue
        keys.add(key)
        acts.append((int(typ), actor, target, True))
    # Make some undo actions valid: like / follow first (one batch), then the mixed stream.
    pre = [(int(T.LIKE_POST), a[1], a[2], True) for a in acts if a[0] == T.UNLIKE_POST]
    pre += [(int(T.FOLLOW), a[1], a[2], True) for a in acts if a[0] == T.UNFOLLOW]
    state = state0
    for a in pre:
        state, _ = apply1(state, _one(a))
    seq, reasons = state, []
    for a in acts:
        seq, info = apply1(seq, _one(a))
        reasons.append(int(info.reason[0]))
    bat, info = apply1(state, mk(PARAMS, *zip(*[a[:3] for a in acts]), size=32))
    np.testing.assert_array_equal(np.asarray(info.reason), reasons)
    assert (np.asarray(info.reason) == Reason.OK).sum() > 15
    for name in ("id", "kind", "author", "parent", "likes", "dislikes", "reposts", "quotes",
                 "comments", "reports", "tokens", "next_id"):
        np.testing.assert_array_equal(getattr(seq.posts, name), getattr(bat.posts, name), name)
    for name in ("num_followers", "num_following", "last_post"):
        np.testing.assert_array_equal(getattr(seq.users, name), getattr(bat.users, name), name)
    def as_sets(g):
        return [set(r[r >= 0].tolist()) for r in np.asarray(g)]
    assert as_sets(seq.graph.following) == as_sets(bat.graph.following)
    assert as_sets(seq.graph.muted) == as_sets(bat.graph.muted)
    assert _records_of(seq) == _records_of(bat)


def test_many_likes_on_one_post_in_one_batch_all_count(apply1, state0):
    batch = mk(PARAMS, [T.LIKE_POST] * N, np.arange(N), [2] * N)
    state, info = apply1(state0, batch)
    assert int(state.posts.likes[2]) == N
    assert int(info.like_delta[2]) == N
    assert int(info.type_counts[T.LIKE_POST]) == N
    # The same batch again: every like is a duplicate and nothing changes.
    state2, info2 = apply1(state, batch)
    assert (np.asarray(info2.reason[:N]) == Reason.DUPLICATE).all()
    assert int(info2.invalid_counts[Reason.DUPLICATE]) == N
    assert int(info2.invalid_counts[Reason.PADDING]) == B - N
    jax.tree.map(np.testing.assert_array_equal, state2, state)


def test_conflicts_in_batch_resolve_to_first(apply1, state0):
    follows = 4 in np.asarray(state0.graph.following[2])
    batch = mk(PARAMS, [T.LIKE_POST, T.UNLIKE_POST, T.LIKE_POST, T.FOLLOW, T.FOLLOW],
               [1, 1, 1, 2, 2], [3, 3, 3, 4, 4])
    state, info = apply1(state0, batch)
    np.testing.assert_array_equal(
        info.reason[:5], [Reason.OK, Reason.CONFLICT_IN_BATCH, Reason.CONFLICT_IN_BATCH,
                          Reason.DUPLICATE if follows else Reason.OK, Reason.CONFLICT_IN_BATCH])
    assert int(state.posts.likes[3]) == 1


def test_invalid_only_batch_changes_nothing(apply1, state0):
    stranger = [u for u in range(1, N) if u not in np.asarray(state0.graph.following[0])][0]
    batch = mk(PARAMS, [T.FOLLOW, T.UNFOLLOW, T.LIKE_POST, T.MALFORMED, 99, T.LIKE_POST,
                        T.FOLLOW, T.LIKE_POST],
               [0, 0, N, 1, 1, 1, 1, 1], [0, stranger, 1, 1, 1, 1000, N, 5],
               valid=[True] * 7 + [False])
    state, info = apply1(state0, batch)
    np.testing.assert_array_equal(info.reason, [
        Reason.SELF_TARGET, Reason.NOTHING_TO_UNDO, Reason.BAD_ACTOR, Reason.MALFORMED,
        Reason.BAD_TYPE, Reason.MISSING_POST, Reason.BAD_USER, Reason.PADDING])
    jax.tree.map(np.testing.assert_array_equal, state, state0)
    assert int(info.type_counts.sum()) == 0
    assert int(info.invalid_counts[Reason.PADDING]) == 1


def test_ring_buffer_wraparound_evicts_and_rejects_stale(apply1, state0):
    state = state0
    ids = []
    for _ in range(4):  # 4 * 6 = 24 creations on top of 16 seeds > P = 32
        batch = mk(PARAMS, [T.CREATE_POST] * N, np.arange(N), content=np.full((N, 3), 7))
        state, info = apply1(state, batch)
        created = np.asarray(info.created_id[:N])
        ids += created.tolist()
        np.testing.assert_array_equal(info.created_slot[:N], created % P)
        np.testing.assert_array_equal(info.created_generation[:N], created // P)
        assert (np.asarray(info.created_id[N:]) == -1).all()
    assert ids == list(range(16, 40))
    assert int(state.posts.next_id) == 40
    np.testing.assert_array_equal(np.sort(np.asarray(state.posts.id)), np.arange(8, 40))
    # Likes on evicted ids are STALE; on never-created ids MISSING; alive ones apply.
    batch = mk(PARAMS, [T.LIKE_POST] * 4, [0, 1, 2, 3], [0, 7, 8, 40])
    state2, info = apply1(state, batch)
    np.testing.assert_array_equal(info.reason[:4], [Reason.STALE_POST, Reason.STALE_POST,
                                                    Reason.OK, Reason.MISSING_POST])
    assert int(state2.posts.likes[8 % P]) == 1
    # Recycled slots hold the new content and fresh counters.
    recycled = np.arange(32, 40) % P
    assert (np.asarray(state.posts.tokens)[recycled] == 7).all()
    assert (np.asarray(state.posts.likes)[recycled] == 0).all()
    assert (np.asarray(state.posts.created_at)[recycled] == 0).all()


def test_repost_and_quote_like_semantics(apply1, state0):
    # user 1 reposts post 0, user 2 quotes post 0 -> ids 16 (repost) and 17 (quote)
    state, info = apply1(state0, mk(PARAMS, [T.REPOST, T.QUOTE_POST], [1, 2], [0, 0]))
    assert np.asarray(info.created_id[:2]).tolist() == [16, 17]
    assert int(state.posts.reposts[0]) == 1 and int(state.posts.quotes[0]) == 1
    assert int(state.posts.parent[16]) == 0 and int(state.posts.parent[17]) == 0
    np.testing.assert_array_equal(state.posts.tokens[16], state.posts.tokens[0])
    state, info = apply1(state, mk(PARAMS, [T.LIKE_POST, T.LIKE_POST, T.LIKE_POST, T.REPOST],
                                   [3, 4, 3, 5], [16, 17, 0, 16]))
    # A like of the repost counts for the original; the same user liking the original in the
    # same batch is the same key -> conflict.  Reposting a repost reposts the original.
    np.testing.assert_array_equal(info.reason[:4], [Reason.OK, Reason.OK,
                                                    Reason.CONFLICT_IN_BATCH, Reason.OK])
    assert int(state.posts.likes[0]) == 1 and int(state.posts.likes[16]) == 0
    assert int(state.posts.likes[17]) == 1
    assert int(state.posts.reposts[0]) == 2
    assert int(state.posts.parent[int(info.created_id[3])]) == 0


def test_comment_actions(apply1, state0):
    state, info = apply1(state0, mk(PARAMS, [T.CREATE_COMMENT], [1], [0]))
    cid = int(info.created_id[0])
    assert int(state.posts.comments[0]) == 1 and int(state.posts.kind[cid]) == PostKind.COMMENT
    state, info = apply1(state, mk(PARAMS, [T.LIKE_COMMENT, T.LIKE_POST, T.LIKE_COMMENT,
                                            T.CREATE_COMMENT], [2, 2, 3, 3], [cid, cid, 0, cid]))
    np.testing.assert_array_equal(info.reason[:4], [Reason.OK, Reason.WRONG_KIND,
                                                    Reason.WRONG_KIND, Reason.WRONG_KIND])
    assert int(state.posts.likes[cid]) == 1


def test_bad_shapes_raise(state0):
    bad = empty_actions(3, PARAMS).replace(content=jnp.zeros((3, 5), jnp.int32))
    with pytest.raises(ValueError, match="content"):
        apply_actions(state0, bad, PARAMS)
    with pytest.raises(ValueError, match="post_capacity"):
        apply_actions(state0, empty_actions(P + 1, PARAMS), PARAMS)
    with pytest.raises(ValueError, match="num_users"):
        society.make_params(num_users=1)
    with pytest.raises(ValueError, match="nonsense"):
        society.make_params(nonsense=3)


def test_reaction_memory_full_is_counted_not_corrupting():
    params = PARAMS.replace(reaction_memory=2)
    state = society.reset(jax.random.key(0), params)
    apply = jax.jit(functools.partial(apply_actions, params=params))
    state, info = apply(state, mk(params, [T.LIKE_POST] * 3, [0, 0, 0], [1, 2, 3]))
    np.testing.assert_array_equal(info.reason[:3], [Reason.OK, Reason.OK, Reason.MEMORY_FULL])
    assert int(state.posts.likes[3]) == 0
    # Unlike frees a record; the next like fits, and a repeated like is still caught.
    state, info = apply(state, mk(params, [T.UNLIKE_POST], [0], [1]))
    state, info = apply(state, mk(params, [T.LIKE_POST, T.LIKE_POST], [0, 0], [3, 2]))
    np.testing.assert_array_equal(info.reason[:2], [Reason.OK, Reason.DUPLICATE])
    assert int(state.posts.likes[3]) == 1
