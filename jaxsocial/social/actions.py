"""OASIS's action vocabulary as arrays, and `apply_actions`: a whole batch in one pass.

Semantics (see docs/society.md for the full rules):
- Interactions resolve against the state *before* the batch; then new posts are written.  A
  like on a post created in the same batch is therefore `MISSING_POST`.
- Many actions on one post are all counted (scatter-add = segment sum over the batch).
- Conflicts: for each key (actor, family, effective target) -- families: like (like/unlike),
  dislike (dislike/undo), repost, report, follow (follow/unfollow), mute (mute/unmute) -- only the
  first valid action in batch order is applied; later ones are `CONFLICT_IN_BATCH`.  With no
  conflicting keys, the batch result equals applying its actions one at a time in batch order.
- A like/dislike/report/repost of a *repost* applies to its original post (OASIS semantics); a
  quote is its own post.  Comments take like_comment & co; post actions on a comment are
  `WRONG_KIND`.
- New posts (create_post, repost, quote_post, create_comment) get consecutive ids in batch order.
- Rejected actions never change state; `ApplyInfo.reason` says why, `invalid_counts` counts.
"""
from __future__ import annotations

import enum

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxsocial.social.state import (
    EMPTY,
    PAD_TOKEN,
    PostKind,
    ReactionKind,
    SocialParams,
    SocialState,
    normalize,
)


class ActionType(enum.IntEnum):
    DO_NOTHING = 0
    CREATE_POST = 1
    LIKE_POST = 2
    UNLIKE_POST = 3
    DISLIKE_POST = 4
    UNDO_DISLIKE_POST = 5
    REPORT_POST = 6
    REPOST = 7
    QUOTE_POST = 8
    CREATE_COMMENT = 9
    LIKE_COMMENT = 10
    UNLIKE_COMMENT = 11
    DISLIKE_COMMENT = 12
    UNDO_DISLIKE_COMMENT = 13
    FOLLOW = 14
    UNFOLLOW = 15
    MUTE = 16
    UNMUTE = 17
    REFRESH = 18
    MALFORMED = 19  # an agent output that did not parse: counted, never applied
    # Read-only actions (no state change in `apply_actions`): their results become the acting
    # LLM agent's next feed (`search.deliver`, from `society.step`).  `embedding` is the query.
    SEARCH_POSTS = 20  # top-K posts by cos(query, post embedding)
    SEARCH_USER = 21  # the latest posts of the top-K users by cos(query, user interest)
    TREND = 22  # the most-liked posts of the last `trend_window` ticks


NUM_TYPES = len(ActionType)


class Reason(enum.IntEnum):
    OK = 0
    PADDING = 1  # valid=False rows: no action, not an error
    MALFORMED = 2
    BAD_TYPE = 3
    BAD_ACTOR = 4
    MISSING_POST = 5  # id never existed (negative or >= next_id)
    STALE_POST = 6  # id was evicted from the ring buffer (or a repost whose original was)
    WRONG_KIND = 7  # post action on a comment, comment action on a post, comment on a comment
    BAD_USER = 8
    SELF_TARGET = 9  # follow / mute oneself
    DUPLICATE = 10  # liked / disliked / reposted / reported twice, followed or muted twice
    NOTHING_TO_UNDO = 11  # unlike without like, unfollow a stranger, unmute a non-muted user
    CONFLICT_IN_BATCH = 12  # same (actor, family, target) already acted on earlier in the batch
    MEMORY_FULL = 13  # all R reaction records of the user point at live posts
    FOLLOWING_FULL = 14
    MUTE_FULL = 15


NUM_REASONS = len(Reason)
INVALID_REASONS = tuple(r for r in Reason if r not in (Reason.OK, Reason.PADDING))

T = ActionType
_POST_TARGET = (T.LIKE_POST, T.UNLIKE_POST, T.DISLIKE_POST, T.UNDO_DISLIKE_POST, T.REPORT_POST,
                T.REPOST, T.QUOTE_POST, T.CREATE_COMMENT)
_COMMENT_TARGET = (T.LIKE_COMMENT, T.UNLIKE_COMMENT, T.DISLIKE_COMMENT, T.UNDO_DISLIKE_COMMENT)
_USER_TARGET = (T.FOLLOW, T.UNFOLLOW, T.MUTE, T.UNMUTE)
CREATING_TYPES = (T.CREATE_POST, T.REPOST, T.QUOTE_POST, T.CREATE_COMMENT)
SEARCH_TYPES = (T.SEARCH_POSTS, T.SEARCH_USER, T.TREND)

# Families for conflict resolution / state memory.
FAM_NONE, FAM_LIKE, FAM_DISLIKE, FAM_REPOST, FAM_REPORT, FAM_FOLLOW, FAM_MUTE = range(7)
_NUM_FAM = 8


def _table(mapping, default=0, dtype=np.int32):
    out = np.full((NUM_TYPES,), default, dtype)
    for k, v in mapping.items():
        out[int(k)] = v
    return out


_NEEDS_POST = _table({t: 1 for t in _POST_TARGET})
_NEEDS_COMMENT = _table({t: 1 for t in _COMMENT_TARGET})
_NEEDS_USER = _table({t: 1 for t in _USER_TARGET})
_FAMILY = _table({
    T.LIKE_POST: FAM_LIKE, T.UNLIKE_POST: FAM_LIKE, T.LIKE_COMMENT: FAM_LIKE,
    T.UNLIKE_COMMENT: FAM_LIKE, T.DISLIKE_POST: FAM_DISLIKE, T.UNDO_DISLIKE_POST: FAM_DISLIKE,
    T.DISLIKE_COMMENT: FAM_DISLIKE, T.UNDO_DISLIKE_COMMENT: FAM_DISLIKE, T.REPOST: FAM_REPOST,
    T.REPORT_POST: FAM_REPORT, T.FOLLOW: FAM_FOLLOW, T.UNFOLLOW: FAM_FOLLOW, T.MUTE: FAM_MUTE,
    T.UNMUTE: FAM_MUTE})
# +1 adds a relation (record / edge), -1 removes one.
_DIRECTION = _table({
    T.LIKE_POST: 1, T.UNLIKE_POST: -1, T.LIKE_COMMENT: 1, T.UNLIKE_COMMENT: -1,
    T.DISLIKE_POST: 1, T.UNDO_DISLIKE_POST: -1, T.DISLIKE_COMMENT: 1,
    T.UNDO_DISLIKE_COMMENT: -1, T.REPOST: 1, T.REPORT_POST: 1, T.FOLLOW: 1, T.UNFOLLOW: -1,
    T.MUTE: 1, T.UNMUTE: -1})
_REACT_KIND = np.zeros((_NUM_FAM,), np.int32)
_REACT_KIND[[FAM_LIKE, FAM_DISLIKE, FAM_REPOST, FAM_REPORT]] = [
    ReactionKind.LIKE, ReactionKind.DISLIKE, ReactionKind.REPOST, ReactionKind.REPORT]
_CREATES = _table({t: 1 for t in CREATING_TYPES})
_NEW_KIND = _table({T.CREATE_POST: PostKind.POST, T.REPOST: PostKind.REPOST,
                    T.QUOTE_POST: PostKind.QUOTE, T.CREATE_COMMENT: PostKind.COMMENT})
_INT_MAX = np.iinfo(np.int32).max


@struct.dataclass
class ActionBatch:
    """B actions.  `target` is a global post id for post/comment actions, a user id for
    follow/mute; ignored otherwise.  `content` and `embedding` are read for create_post,
    quote_post and create_comment (the caller embeds tokens with a frozen encoder; a repost copies
    its original's).  `valid=False` rows are padding: ignored and not counted as invalid; an
    unparsable agent output should be `type=MALFORMED` (counted)."""
    type: jax.Array  # [B] int32 ActionType
    actor: jax.Array  # [B] int32 user id
    target: jax.Array  # [B] int32
    content: jax.Array  # [B, L] int32 token ids, right-padded with PAD_TOKEN
    embedding: jax.Array  # [B, d] float32
    valid: jax.Array  # [B] bool

    @property
    def size(self) -> int:
        return self.type.shape[0]


def empty_actions(batch: int, params: SocialParams) -> ActionBatch:
    """A no-op batch of `batch` padding rows (batch may be 0)."""
    if batch < 0:
        raise ValueError(f"batch must be >= 0, got {batch}")
    return ActionBatch(
        type=jnp.zeros((batch,), jnp.int32), actor=jnp.zeros((batch,), jnp.int32),
        target=jnp.full((batch,), EMPTY, jnp.int32),
        content=jnp.full((batch, params.content_len), PAD_TOKEN, jnp.int32),
        embedding=jnp.zeros((batch, params.embed_dim), jnp.float32),
        valid=jnp.zeros((batch,), bool))


def make_actions(params: SocialParams, type, actor, target=None, content=None, embedding=None,
                 valid=None) -> ActionBatch:
    """Build a batch from array-likes `[B]` (content `[B, L]` default PAD_TOKEN, embedding
    `[B, d]` default 0)."""
    type = jnp.asarray(type, jnp.int32)
    b = type.shape[0]
    def fill(x, shape, dt, v):
        return (jnp.full(shape, v, dt) if x is None
                                        else jnp.asarray(x, dt).reshape(shape))
    return ActionBatch(
        type=type, actor=fill(actor, (b,), jnp.int32, 0), target=fill(target, (b,), jnp.int32, -1),
        content=fill(content, (b, params.content_len), jnp.int32, PAD_TOKEN),
        embedding=fill(embedding, (b, params.embed_dim), jnp.float32, 0.0),
        valid=fill(valid, (b,), bool, True))


@struct.dataclass
class ApplyInfo:
    reason: jax.Array  # [B] int32 Reason (OK = applied)
    effective_target: jax.Array  # [B] int32 post id after repost redirection, or the user id
    created_id: jax.Array  # [B] int32 global id of the post this action created, else EMPTY
    created_slot: jax.Array  # [B] int32 ring slot (id % P), EMPTY if none
    created_generation: jax.Array  # [B] int32 id // P, EMPTY if none
    type_counts: jax.Array  # [NUM_TYPES] int32 applied actions per ActionType
    invalid_counts: jax.Array  # [NUM_REASONS] int32 rows per Reason (OK and PADDING included)
    like_delta: jax.Array  # [P] int32 net likes this batch per slot, for the post now in the slot

    @property
    def accepted(self) -> jax.Array:
        return self.reason == Reason.OK


def _group_sort(k1, k2, mask):
    """One sort of the batch by (k1, k2, row) over masked rows (the others last).

    Returns (order [B], first [B] bool: the row is the first masked row of its (k1, k2) group in
    batch order)."""
    b = k1.shape[0]
    idx = jnp.arange(b, dtype=jnp.int32)
    s1, s2, order = jax.lax.sort((jnp.where(mask, k1, _INT_MAX), k2, idx), num_keys=3)
    new = jnp.concatenate([jnp.ones((1,), bool), (s1[1:] != s1[:-1]) | (s2[1:] != s2[:-1])])
    return order, jnp.zeros((b,), bool).at[order].set(new) & mask


def _rank_sorted(order, gkey, mask):
    """[B] int32: rank of each masked row among the masked rows of its `gkey` group, counted in
    `order` (groups must be contiguous in `order`)."""
    b = order.shape[0]
    idx = jnp.arange(b, dtype=jnp.int32)
    g = gkey[order]
    m = mask[order].astype(jnp.int32)
    new = jnp.concatenate([jnp.ones((1,), bool), g[1:] != g[:-1]])
    start = jax.lax.cummax(jnp.where(new, idx, 0))
    cs = jnp.cumsum(m)
    rank = cs - 1 - (cs[start] - m[start])
    return jnp.zeros((b,), jnp.int32).at[order].set(rank)


def _kth_free(free, rank):
    """Position of the (rank+1)-th True of each row of `free [B, W]` and whether it exists."""
    c = jnp.cumsum(free, axis=1)
    hit = c == (rank[:, None] + 1)
    return jnp.argmax(hit, axis=1).astype(jnp.int32), jnp.any(hit, axis=1)


def _check_batch(state: SocialState, actions: ActionBatch, params: SocialParams):
    if actions.type.ndim != 1:
        raise ValueError(f"actions.type must be [B], got shape {actions.type.shape}")
    b = actions.type.shape[0]
    if b > params.post_capacity:
        raise ValueError(f"action batch of {b} exceeds post_capacity={params.post_capacity}")
    for name, shape in (("actor", (b,)), ("target", (b,)), ("valid", (b,)),
                        ("content", (b, params.content_len)),
                        ("embedding", (b, params.embed_dim))):
        got = getattr(actions, name).shape
        if got != shape:
            raise ValueError(f"actions.{name} has shape {got}, expected {shape}")
    for name in ("type", "actor", "target", "content"):
        if not jnp.issubdtype(getattr(actions, name).dtype, jnp.integer):
            raise ValueError(f"actions.{name} must be integer, got {getattr(actions, name).dtype}")
    if state.posts.id.shape != (params.post_capacity,):
        raise ValueError(f"state.posts has shape {state.posts.id.shape}, params say "
                         f"post_capacity={params.post_capacity}")


def apply_actions(state: SocialState, actions: ActionBatch, params: SocialParams
                  ) -> tuple[SocialState, ApplyInfo]:
    """Apply a batch of B actions at once.  Cost O(B (log B + R + F + M + L + d) + P).

    Returns the new state and an `ApplyInfo` (per-row reason, created ids, counts, per-slot like
    delta).  Pure and jittable; vmappable over societies.
    """
    _check_batch(state, actions, params)
    posts, graph, mem, users = state.posts, state.graph, state.memory, state.users
    n, cap = params.num_users, params.post_capacity
    b = actions.size
    t = actions.type
    actor_raw = actions.actor
    tgt = actions.target

    type_ok = (t >= 0) & (t < NUM_TYPES)
    tc = jnp.clip(t, 0, NUM_TYPES - 1)
    def lookup(table):
        return jnp.asarray(table)[tc]
    needs_post, needs_comment, needs_user = (lookup(_NEEDS_POST) > 0, lookup(_NEEDS_COMMENT) > 0,
                                             lookup(_NEEDS_USER) > 0)
    fam, direction, creates = lookup(_FAMILY), lookup(_DIRECTION), lookup(_CREATES) > 0
    actor_ok = (actor_raw >= 0) & (actor_raw < n)
    actor = jnp.clip(actor_raw, 0, n - 1)

    # --- target resolution against the pre-batch state
    exists = (tgt >= 0) & (tgt < posts.next_id)
    tslot = posts.slot(tgt)
    alive = exists & (posts.id[tslot] == tgt)
    tkind = posts.kind[tslot]
    redirect = needs_post & (tkind == PostKind.REPOST)
    eff_post = jnp.where(redirect, posts.parent[tslot], tgt)
    eff_alive = alive & posts.alive(eff_post)
    user_ok = (tgt >= 0) & (tgt < n)

    reason = jnp.full((b,), Reason.OK, jnp.int32)

    def reject(reason, cond, code):
        return jnp.where((reason == Reason.OK) & cond, jnp.int32(code), reason)

    targets_post = needs_post | needs_comment
    reason = reject(reason, ~actions.valid, Reason.PADDING)
    reason = reject(reason, ~type_ok, Reason.BAD_TYPE)
    reason = reject(reason, t == T.MALFORMED, Reason.MALFORMED)
    reason = reject(reason, ~actor_ok, Reason.BAD_ACTOR)
    reason = reject(reason, targets_post & ~exists, Reason.MISSING_POST)
    reason = reject(reason, targets_post & ~eff_alive, Reason.STALE_POST)
    reason = reject(reason, needs_post & (tkind == PostKind.COMMENT), Reason.WRONG_KIND)
    reason = reject(reason, needs_comment & (tkind != PostKind.COMMENT), Reason.WRONG_KIND)
    reason = reject(reason, needs_user & ~user_ok, Reason.BAD_USER)
    reason = reject(reason, needs_user & (tgt == actor_raw), Reason.SELF_TARGET)
    eff = jnp.where(targets_post, eff_post, jnp.where(needs_user, tgt, EMPTY))

    # --- in-batch conflicts: first row per (actor, family, target) wins
    keyed = (reason == Reason.OK) & (fam != FAM_NONE)
    # Sorted by (actor, family, target): the family ranges of one actor are contiguous, which
    # the insert ranks below reuse (one sort per batch).
    order, first = _group_sort(actor * _NUM_FAM + fam, eff, keyed)
    reason = reject(reason, keyed & ~first, Reason.CONFLICT_IN_BATCH)

    # --- state checks
    is_rec = (fam >= FAM_LIKE) & (fam <= FAM_REPORT)
    rk = jnp.asarray(_REACT_KIND)[fam]
    rrow = mem.react_post[actor]  # [B, R]
    rmatch = (rrow == eff[:, None]) & (mem.react_kind[actor].astype(jnp.int32) == rk[:, None])
    frow = graph.following[actor]  # [B, F]
    fmatch = frow == eff[:, None]
    mrow = graph.muted[actor]  # [B, M]
    mmatch = mrow == eff[:, None]
    match = jnp.where(is_rec, jnp.any(rmatch, 1),
                      jnp.where(fam == FAM_FOLLOW, jnp.any(fmatch, 1), jnp.any(mmatch, 1)))
    keyed = fam != FAM_NONE
    reason = reject(reason, keyed & (direction > 0) & match, Reason.DUPLICATE)
    reason = reject(reason, keyed & (direction < 0) & ~match, Reason.NOTHING_TO_UNDO)

    # --- capacity: rank inserts per (actor, memory), then find their slots
    ins = (reason == Reason.OK) & keyed & (direction > 0)
    mem_id = jnp.where(is_rec, 0, jnp.where(fam == FAM_FOLLOW, 1, 2))
    rank = _rank_sorted(order, actor * 3 + mem_id, ins)
    # Removals first (they free entries), then the r-th free entry of the row for the r-th insert.
    rem = (reason == Reason.OK) & keyed & (direction < 0)
    rem_f, rem_m, rem_r = rem & (fam == FAM_FOLLOW), rem & (fam == FAM_MUTE), rem & is_rec
    def drop_row(m):
        return jnp.where(m, actor, n)  # out-of-bounds row -> scatter dropped
    def first_true(m):
        return jnp.argmax(m, axis=1).astype(jnp.int32)
    following = graph.following.at[drop_row(rem_f), first_true(fmatch)].set(EMPTY, mode="drop")
    muted = graph.muted.at[drop_row(rem_m), first_true(mmatch)].set(EMPTY, mode="drop")
    react_post = mem.react_post.at[drop_row(rem_r), first_true(rmatch)].set(EMPTY, mode="drop")
    # A reaction record is free when empty or when its post left the ring buffer: a record is
    # only ever dropped once it can no longer matter, so "no double like" holds exactly.
    rrow2 = react_post[actor]
    rpos, r_free = _kth_free(~posts.alive(rrow2), rank)
    fpos, f_free = _kth_free(following[actor] == EMPTY, rank)
    mpos, m_free = _kth_free(muted[actor] == EMPTY, rank)
    reason = reject(reason, ins & is_rec & ~r_free, Reason.MEMORY_FULL)
    reason = reject(reason, ins & (fam == FAM_FOLLOW) & ~f_free, Reason.FOLLOWING_FULL)
    reason = reject(reason, ins & (fam == FAM_MUTE) & ~m_free, Reason.MUTE_FULL)

    ok = reason == Reason.OK
    ins = ok & keyed & (direction > 0)
    ins_f, ins_m, ins_r = ins & (fam == FAM_FOLLOW), ins & (fam == FAM_MUTE), ins & is_rec

    # --- relations
    following = following.at[drop_row(ins_f), fpos].set(eff, mode="drop")
    muted = muted.at[drop_row(ins_m), mpos].set(eff, mode="drop")
    dfollow = jnp.where(ins_f, 1, 0) - jnp.where(rem_f, 1, 0)
    num_following = users.num_following.at[actor].add(dfollow)
    num_followers = users.num_followers.at[jnp.clip(eff, 0, n - 1)].add(dfollow)

    react_post = react_post.at[drop_row(ins_r), rpos].set(eff, mode="drop")
    react_kind = mem.react_kind.at[drop_row(ins_r), rpos].set(rk.astype(jnp.int8), mode="drop")

    # --- counters (segment sums over the batch; on the effective post)
    eslot = posts.slot(eff)
    def pdrop(m):
        return jnp.where(m & targets_post, eslot, cap)
    signed = jnp.where(direction > 0, 1, -1)
    like_delta = jnp.zeros((cap,), jnp.int32).at[pdrop(ok & (fam == FAM_LIKE))].add(
        signed, mode="drop")
    dislike_delta = jnp.zeros((cap,), jnp.int32).at[pdrop(ok & (fam == FAM_DISLIKE))].add(
        signed, mode="drop")
    def count(m):
        return jnp.zeros((cap,), jnp.int32).at[pdrop(ok & m)].add(1, mode="drop")
    new_posts = posts.replace(
        likes=posts.likes + like_delta, dislikes=posts.dislikes + dislike_delta,
        reposts=posts.reposts + count(t == T.REPOST),
        quotes=posts.quotes + count(t == T.QUOTE_POST),
        comments=posts.comments + count(t == T.CREATE_COMMENT),
        reports=posts.reports + count(t == T.REPORT_POST))

    # --- creations: consecutive ids in batch order
    cr = ok & creates
    crank = jnp.cumsum(cr.astype(jnp.int32)) - 1
    new_id = posts.next_id + crank
    cslot = jnp.where(cr, new_id % cap, cap)
    is_repost = t == T.REPOST
    parent = jnp.where(cr & (t != T.CREATE_POST), eff, EMPTY)
    tokens = jnp.where(is_repost[:, None], posts.tokens[eslot], actions.content)
    emb = jnp.where(is_repost[:, None], posts.embedding[eslot], normalize(actions.embedding))
    zero = jnp.zeros((b,), jnp.int32)
    # Newest comment of each commented post (ids grow in batch order: max = newest); written
    # before the new posts, so a slot recycled in this batch starts with EMPTY.
    is_comment = cr & (t == T.CREATE_COMMENT)
    last_comment = posts.last_comment.at[jnp.where(is_comment, eslot, cap)].max(
        new_id, mode="drop")
    shows_in_feed = cr & (t != T.CREATE_COMMENT)
    prev_c, prev_a = _links(posts, users, params, cr, is_comment, shows_in_feed, actor, eslot,
                            new_id)
    def put(arr, v):
        return arr.at[cslot].set(v, mode="drop")
    new_posts = new_posts.replace(
        id=put(new_posts.id, new_id), kind=put(new_posts.kind, lookup(_NEW_KIND)),
        author=put(new_posts.author, actor), parent=put(new_posts.parent, parent),
        created_at=put(new_posts.created_at, jnp.broadcast_to(state.tick, (b,))),
        tokens=put(new_posts.tokens, tokens), embedding=put(new_posts.embedding, emb),
        likes=put(new_posts.likes, zero), dislikes=put(new_posts.dislikes, zero),
        reposts=put(new_posts.reposts, zero), quotes=put(new_posts.quotes, zero),
        comments=put(new_posts.comments, zero), reports=put(new_posts.reports, zero),
        likes_h=put(new_posts.likes_h, zero),
        last_comment=put(last_comment, jnp.full((b,), EMPTY, jnp.int32)),
        # (links not kept stay EMPTY: no write, no work in the default tick)
        prev_comment=(put(new_posts.prev_comment, prev_c) if params.feed_comments > 1
                      else new_posts.prev_comment),
        prev_by_author=(put(new_posts.prev_by_author, prev_a) if params.feed_following > 0
                        else new_posts.prev_by_author),
        next_id=posts.next_id + jnp.sum(cr, dtype=jnp.int32))
    overwritten = jnp.zeros((cap,), bool).at[cslot].set(True, mode="drop")
    like_delta = jnp.where(overwritten, 0, like_delta)
    last_post = users.last_post.at[drop_row(shows_in_feed)].max(new_id, mode="drop")

    new_state = state.replace(
        posts=new_posts,
        graph=graph.replace(following=following, muted=muted),
        users=users.replace(num_following=num_following, num_followers=num_followers,
                            last_post=last_post),
        memory=mem.replace(react_post=react_post, react_kind=react_kind))
    created_id = jnp.where(cr, new_id, EMPTY)
    info = ApplyInfo(
        reason=reason, effective_target=eff, created_id=created_id,
        created_slot=jnp.where(cr, new_id % cap, EMPTY),
        created_generation=jnp.where(cr, new_id // cap, EMPTY),
        type_counts=jnp.zeros((NUM_TYPES,), jnp.int32).at[jnp.where(ok, tc, NUM_TYPES)].add(
            1, mode="drop"),
        invalid_counts=jnp.zeros((NUM_REASONS,), jnp.int32).at[reason].add(1),
        like_delta=like_delta)
    return new_state, info


def _links(posts, users, params: SocialParams, cr, is_comment, shows_in_feed, actor, eslot,
           new_id):
    """`prev_comment` / `prev_by_author` of the batch's created rows `[B]` (EMPTY where not
    kept: `params.feed_comments <= 1` / `params.feed_following == 0`).  A row's predecessor is
    the previous creation of its group in the batch (comments: same parent; posts / reposts /
    quotes: same author), else the group's head before the batch (`posts.last_comment` /
    `users.last_post`).  One sort of the batch, only when a link is kept."""
    b = cr.shape[0]
    keep_c, keep_a = params.feed_comments > 1, params.feed_following > 0
    none = jnp.full((b,), EMPTY, jnp.int32)
    if not (keep_c or keep_a):
        return none, none
    n = params.num_users
    key = jnp.where(is_comment, n + eslot, jnp.where(shows_in_feed, actor, _INT_MAX))
    idx = jnp.arange(b, dtype=jnp.int32)
    skey, sid, order = jax.lax.sort((key, new_id, idx), num_keys=2)
    same = jnp.concatenate([jnp.zeros((1,), bool), skey[1:] == skey[:-1]])
    prev_s = jnp.concatenate([none[:1], sid[:-1]])
    in_batch = none.at[order].set(jnp.where(same, prev_s, EMPTY))
    head = jnp.where(is_comment, posts.last_comment[eslot], users.last_post[actor])
    prev = jnp.where(in_batch >= 0, in_batch, head)
    return (jnp.where(is_comment & keep_c, prev, EMPTY),
            jnp.where(shows_in_feed & keep_a, prev, EMPTY))


def update_profiles(before: SocialState, after: SocialState, actions: ActionBatch,
                    info: ApplyInfo, params: SocialParams) -> SocialState:
    """Fold one applied action batch into the TwHIN profiles of `after` (a no-op unless
    recsys == "twhin").

    Every accepted like_post (of the effective post: a repost's original) and every accepted
    create_post / repost / quote_post adds that post's embedding to its actor's `profile_sum`
    and 1 to `profile_count`, so the profile is the running mean over the bio and all those
    posts; the bio keeps weight 1 / profile_count.  Unlikes do not subtract (a running mean of
    what the user engaged with), comments and comment likes do not count (OASIS's profile reads
    the post table).  `before` is the state the batch was applied to (a liked post's embedding
    is read there: it may be overwritten in `after`); `after` must hold the created posts'
    final embeddings.  actions `[B]`; cost O(B d) (a scatter-add into `[N, d]`).
    """
    if params.recsys != "twhin":
        return after
    t = actions.type
    ok = info.reason == Reason.OK
    liked = ok & (t == T.LIKE_POST)
    made = ok & ((t == T.CREATE_POST) | (t == T.REPOST) | (t == T.QUOTE_POST))
    liked_emb = before.posts.embedding[before.posts.slot(info.effective_target)]
    made_emb = after.posts.embedding[after.posts.slot(info.created_id)]
    emb = jnp.where(liked[:, None], liked_emb, made_emb)
    n = params.num_users
    row = jnp.where(liked | made, actions.actor, n)  # out of range -> dropped
    users = after.users
    return after.replace(users=users.replace(
        profile_sum=users.profile_sum.at[row].add(emb, mode="drop"),
        profile_count=users.profile_count.at[row].add(1, mode="drop")))


def apply_and_update(state: SocialState, actions: ActionBatch, params: SocialParams,
                     finish=None) -> tuple[SocialState, ApplyInfo]:
    """`apply_actions`, then `update_profiles` (what every batch of a tick goes through: the
    agents' in `society.step`, the crowd's in `reactions.crowd_step`).  `finish(state, info) ->
    state`, if given, runs between the two (the crowd's by-id text fills created posts' final
    embeddings, which the profiles read)."""
    after, info = apply_actions(state, actions, params)
    if finish is not None:
        after = finish(after, info)
    return update_profiles(state, after, actions, info, params), info


def reason_names() -> list[str]:
    return [r.name.lower() for r in Reason]


def type_names() -> list[str]:
    return [a.name.lower() for a in ActionType]
