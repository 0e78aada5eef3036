"""Crowd like-dynamics: the vectorized reaction model of the non-LLM users.

Each tick every crowd user u activates with its own probability `activity[u]` (log-normal across
users: a few very active accounts, a long tail of lurkers).  The active ones (at most
`max_active`; the rest are counted as overflow) read their recommended feed `[A, K]` and, in one
vectorized draw:

  p_like[a, k]    = sigmoid(like_bias + like_sim cos(u_a, e_k) + like_pop log1p(likes_k)
                            + like_follow [a follows author_k]
                            + like_activity log(activity_a / activation_rate))
  p_dislike[a, k] = sigmoid(dislike_bias - dislike_sim cos(u_a, e_k))   (only if not liked)

and, once per user: create a post (p_post), repost / quote / comment (p_repost, p_quote,
p_comment) the feed item argmax_k(cos + Gumbel), follow that item's author (p_follow) if not
followed yet and the user's followee row has room.  Posts already liked/disliked by the user are
not reacted to again.  The events are compacted into one `ActionBatch` of `crowd_budget` rows
(overflow counted) and applied with `apply_actions`, so the crowd obeys exactly the rules the
LLM agents do.  With `content_budget` > 0, the text or embedding of created posts is drawn for
at most that many rows (the batch's first creating rows; later ones are dropped and counted as
overflow) instead of for every row of the batch: at 1e6 users about 7,000 of 120,128 rows.

Text: with a `text_bank.CrowdText` in `state.text`, a crowd post copies the tokens and embedding
of a bank post drawn by its author's interest, a comment / quote those of a comment-bank entry
drawn by interest + parent embedding (`text_bank.draw_posts / draw_replies`), so its embedding
is the encoder's embedding of the tokens agents read.  Without one (`state.text is None`, e.g.
launch/simulate.py) crowd posts carry no tokens (all PAD_TOKEN) and their embedding is
normalize(interest + post_noise z/sqrt(d)) (a quote / comment mixes in its parent's embedding).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxsocial.social import recsys, text_bank
from jaxsocial.social.actions import ActionBatch, ActionType, ApplyInfo, apply_and_update
from jaxsocial.social.state import (
    EMPTY,
    PAD_TOKEN,
    ReactionKind,
    SocialParams,
    SocialState,
    normalize,
)

T = ActionType


@struct.dataclass
class CrowdInfo:
    apply: ApplyInfo  # of the crowd's action batch
    num_active: jax.Array  # [] int32 crowd users that acted this tick
    active_overflow: jax.Array  # [] int32 activations dropped (more than max_active)
    event_overflow: jax.Array  # [] int32 crowd actions dropped (over crowd_budget or
    #                            content_budget)
    feed_fill: jax.Array  # [] float32 mean share of valid feed slots among active users


def activate(key: jax.Array, state: SocialState, params: SocialParams):
    """Crowd users acting this tick: (`users [max_active]` with EMPTY padding, count, overflow)."""
    n = params.num_users
    draw = jax.random.uniform(key, (n,)) < state.users.activity
    draw = draw & (jnp.arange(n) >= params.num_agents)
    total = jnp.sum(draw, dtype=jnp.int32)
    (users,) = jnp.nonzero(draw, size=params.max_active, fill_value=EMPTY)
    count = jnp.minimum(total, params.max_active)
    return users.astype(jnp.int32), count, total - count


def crowd_step(key: jax.Array, state: SocialState, params: SocialParams
               ) -> tuple[SocialState, CrowdInfo]:
    """One tick of crowd behaviour (activation, feeds, reactions, apply).  Pure, jittable."""
    posts = state.posts
    k = params.feed_size
    k_act, k_feed, k_draw, k_emb = jax.random.split(key, 4)
    users, num_active, act_over = activate(k_act, state, params)
    a = users.shape[0]
    uok = users >= 0
    u = jnp.maximum(users, 0)

    feed = recsys.recommend(k_feed, state, users, params)
    state = recsys.mark_seen(state, users, feed, params)

    interest = state.users.interest[u]  # [A, d]
    sim = jnp.einsum("ad,akd->ak", interest, posts.embedding[feed.slots])  # [A, K]
    author = posts.author[feed.slots]
    likes = posts.likes[feed.slots].astype(jnp.float32)
    follows = jnp.any(author[:, :, None] == state.graph.following[u][:, None, :], axis=2)
    reacted = jnp.any((feed.ids[:, :, None] == state.memory.react_post[u][:, None, :])
                      & (state.memory.react_kind[u][:, None, :] != ReactionKind.NONE), axis=2)
    usable = feed.valid & ~reacted
    act_bonus = jnp.log(jnp.maximum(state.users.activity[u], 1e-6) /
                        jnp.maximum(params.activation_rate, 1e-6))
    like_logit = (params.like_bias + params.like_sim * sim + params.like_pop * jnp.log1p(likes)
                  + params.like_follow * follows + params.like_activity * act_bonus[:, None])
    ks = jax.random.split(k_draw, 8)
    like = usable & (jax.random.uniform(ks[0], (a, k)) < jax.nn.sigmoid(like_logit))
    dislike = usable & ~like & (jax.random.uniform(ks[1], (a, k)) < jax.nn.sigmoid(
        params.dislike_bias - params.dislike_sim * sim))

    # One favourite feed item per user for repost / quote / comment / follow.
    fav_score = jnp.where(feed.valid, sim + jax.random.gumbel(ks[2], (a, k)), -jnp.inf)
    fav = jnp.argmax(fav_score, axis=1)
    has_fav = jnp.any(feed.valid, axis=1) & uok
    fav_id = jnp.take_along_axis(feed.ids, fav[:, None], axis=1)[:, 0]
    fav_author = jnp.take_along_axis(author, fav[:, None], axis=1)[:, 0]
    fav_followed = jnp.take_along_axis(follows, fav[:, None], axis=1)[:, 0]
    coin = jax.random.uniform(ks[3], (5, a))
    do_post = uok & (coin[0] < params.p_post)
    do_repost = has_fav & (coin[1] < params.p_repost)
    do_quote = has_fav & (coin[2] < params.p_quote)
    do_comment = has_fav & (coin[3] < params.p_comment)
    do_follow = (has_fav & (coin[4] < params.p_follow) & ~fav_followed & (fav_author != u)
                 & (state.users.num_following[u] < params.max_following))

    # Flatten candidate events, then compact the drawn ones into the fixed-size batch.
    def rep(x):
        return jnp.repeat(x, k)
    ev_type = jnp.concatenate([
        jnp.full((a * k,), T.LIKE_POST), jnp.full((a * k,), T.DISLIKE_POST),
        jnp.full((a,), T.CREATE_POST), jnp.full((a,), T.REPOST), jnp.full((a,), T.QUOTE_POST),
        jnp.full((a,), T.CREATE_COMMENT), jnp.full((a,), T.FOLLOW)]).astype(jnp.int32)
    ev_actor = jnp.concatenate([rep(u), rep(u), u, u, u, u, u])
    ev_target = jnp.concatenate([feed.ids.reshape(-1), feed.ids.reshape(-1),
                                 jnp.full((a,), EMPTY, jnp.int32), fav_id, fav_id, fav_id,
                                 fav_author])
    ev_on = jnp.concatenate([like.reshape(-1), dislike.reshape(-1), do_post, do_repost, do_quote,
                             do_comment, do_follow])
    budget = params.crowd_budget
    total = jnp.sum(ev_on, dtype=jnp.int32)
    (sel,) = jnp.nonzero(ev_on, size=budget, fill_value=0)
    valid = jnp.arange(budget) < total
    btype, bactor, btarget = ev_type[sel], ev_actor[sel], ev_target[sel]

    has_parent = (btype == T.QUOTE_POST) | (btype == T.CREATE_COMMENT)
    creates = valid & ((btype == T.CREATE_POST) | has_parent)
    rows = params.content_budget
    content_over = jnp.zeros((), jnp.int32)
    if 0 < rows < budget:  # draw content for the creating rows only; the rest are dropped
        rank = jnp.cumsum(creates, dtype=jnp.int32) - 1
        keep = ~creates | (rank < rows)
        content_over = jnp.sum(~keep, dtype=jnp.int32)
        valid = valid & keep
        (crow,) = jnp.nonzero(creates & keep, size=rows, fill_value=budget)
        c = jnp.minimum(crow, budget - 1)
        c_content, c_emb = _crowd_content(k_emb, state, params, btype[c], bactor[c],
                                          has_parent[c], posts.embedding[posts.slot(btarget[c])])
        content = jnp.full((budget, params.content_len), PAD_TOKEN, jnp.int32).at[crow].set(
            c_content, mode="drop")
        emb = jnp.zeros((budget, params.embed_dim), jnp.float32).at[crow].set(c_emb, mode="drop")
    else:
        parent_emb = posts.embedding[posts.slot(btarget)]
        content, emb = _crowd_content(k_emb, state, params, btype, bactor, has_parent,
                                      parent_emb)
    batch = ActionBatch(type=btype, actor=bactor, target=btarget, content=content,
                        embedding=emb, valid=valid)
    finish = None
    if state.text is not None and state.text.by_id:
        def finish(s, i):
            return _text_by_id(s, i.created_id, btype)
    state, info = apply_and_update(state, batch, params, finish)
    fill = jnp.sum(feed.valid & uok[:, None]) / jnp.maximum(num_active * k, 1)
    return state, CrowdInfo(apply=info, num_active=num_active, active_overflow=act_over,
                            event_overflow=jnp.maximum(total - budget, 0) + content_over,
                            feed_fill=fill.astype(jnp.float32))


def _crowd_content(key, state: SocialState, params: SocialParams, btype, bactor, has_parent,
                   parent_emb):
    """Tokens [B, L] and embeddings [B, d] of the crowd batch's rows (read for create_post,
    quote_post and create_comment rows only)."""
    budget, interest = btype.shape[0], state.users.interest[bactor]
    text = state.text
    if text is None:  # no text: interest (+ parent) + noise, no tokens
        emb = (interest + jnp.where(has_parent[:, None], parent_emb, 0.0)
               + params.post_noise * jax.random.normal(key, (budget, params.embed_dim))
               / jnp.sqrt(jnp.float32(params.embed_dim)))
        return jnp.full((budget, params.content_len), PAD_TOKEN, jnp.int32), normalize(emb)
    if text.by_id:  # filled after apply, once the ids are known (`_text_by_id`)
        return (jnp.full((budget, params.content_len), PAD_TOKEN, jnp.int32),
                jnp.zeros((budget, params.embed_dim), jnp.float32))
    k_post, k_reply = jax.random.split(key)
    p_tok, p_emb, _ = text_bank.draw_posts(k_post, text, interest)
    r_tok, r_emb, _ = text_bank.draw_replies(k_reply, text, interest, parent_emb)
    reply = has_parent[:, None]
    return jnp.where(reply, r_tok, p_tok), jnp.where(reply, r_emb, p_emb)


def _text_by_id(state: SocialState, created_id, btype) -> SocialState:
    """`by_id` banks: every post the crowd batch created (except reposts, which keep their
    original's text) gets post-bank entry `id % Nb` (tokens and embedding)."""
    posts = state.posts
    own = (created_id >= 0) & (btype != T.REPOST)
    slot = jnp.where(own, posts.slot(created_id), posts.capacity)  # out of range -> dropped
    tokens, emb = text_bank.by_id(state.text, created_id)
    return state.replace(posts=posts.replace(
        tokens=posts.tokens.at[slot].set(tokens, mode="drop"),
        embedding=posts.embedding.at[slot].set(emb, mode="drop")))
