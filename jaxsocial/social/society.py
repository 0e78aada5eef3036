"""The society environment: `reset(key, params) -> state`, `step(key, state, actions, params)
-> (state, info)`.  Pure and jittable; `jax.vmap` works over independent societies (key, state,
actions) and over the float fields of `params` (a sweep; sizes and choices are static).

Not gymnax's contract: the society has no single agent, so `step` returns no observation,
reward or done. Observations are feeds (`observe`), rewards are likes within a horizon, which
the training loop sums from the recorded `StepInfo.like_delta` / `engagement_delta`.

A step: apply the LLM agents' action batch (any size, possibly empty) -> crowd reactions on the
updated state -> freeze horizon likes -> advance the clock.  With recsys="twhin" each applied
batch also updates the users' TwHIN profiles (`actions.update_profiles`).
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import struct

from jaxsocial.social import recsys, search, text_bank
from jaxsocial.social.actions import (
    NUM_REASONS,
    NUM_TYPES,
    ActionBatch,
    ApplyInfo,
    apply_and_update,
    empty_actions,
)
from jaxsocial.social.reactions import CrowdInfo, crowd_step
from jaxsocial.social.state import (
    EMPTY,
    PostKind,
    SocialParams,
    SocialState,
    empty_state,
    normalize,
)
from jaxsocial.social.text_bank import CrowdText, TextBank


@struct.dataclass
class StepInfo:
    """What one tick did.  `agent` is per-row for the LLM agents' batch: `agent.reason`,
    `agent.created_id / created_slot / created_generation` (the posts the agents created).
    `like_delta[slot]` = net likes (agents + crowd) the post *now* in `slot` received this tick
    (0 for a slot overwritten this tick), so that likes within a horizon can be summed even after
    a post is evicted: reward(id) = sum over ticks t in [created, created + H) of
    like_delta_t[id % P] (the slot still holds `id` during those ticks unless evicted).
    `engagement_delta` is the same bookkeeping for likes, reposts and comments (and, with
    `params.engagement_channels=5`, reports and dislikes), and
    `follower_delta` / `crowd_posts` what the training loop's rewards and metrics read."""
    agent: ApplyInfo
    crowd: CrowdInfo
    like_delta: jax.Array  # [P] int32
    tick: jax.Array  # [] int32 the tick this step simulated (state.tick before the step)
    # [P, E] int32 (likes, reposts, comments[, reports, dislikes]) gained this tick by the post
    # now in each slot (a post new in its slot counts from 0); E = params.engagement_channels
    engagement_delta: jax.Array
    follower_delta: jax.Array  # [A] int32 followers gained by each LLM agent (A = num_agents)
    crowd_posts: jax.Array  # [] int32 posts the crowd created this tick


def make_params(**overrides) -> SocialParams:
    """`SocialParams` with overrides, validated (ValueError names the bad field)."""
    fields = SocialParams.__dataclass_fields__
    for name in overrides:
        if name not in fields:
            raise ValueError(f"unknown SocialParams field {name!r}")
    return SocialParams(**overrides).validate()


def _follow_targets(key, n, shape, power):
    """Targets drawn with P(popularity rank r) ~ r^-power over ranks [1, n] (continuous inverse
    CDF), mapped to users through a random permutation.  Gives a heavy-tailed in-degree."""
    k_u, k_perm = jax.random.split(key)
    u = jax.random.uniform(k_u, shape)
    a = jnp.asarray(power, jnp.float32)
    a = jnp.where(jnp.abs(1.0 - a) < 1e-3, 1.0 - 1e-3, a)
    x = jnp.power((jnp.power(jnp.float32(n), 1.0 - a) - 1.0) * u + 1.0, 1.0 / (1.0 - a))
    rank = jnp.clip(jnp.floor(x).astype(jnp.int32) - 1, 0, n - 1)
    return jax.random.permutation(k_perm, n).astype(jnp.int32)[rank]


@jax.jit
def reset(key: jax.Array, params: SocialParams, text: CrowdText | None = None,
          interests: TextBank | None = None, agent_interest: jax.Array | None = None
          ) -> SocialState:
    """Initial population: personas (cluster ids) with interest embeddings around persona centres,
    log-normal activity rates, a scale-free-ish follow graph (out-degree log-normal around
    `init_following`, in-degree ~ Zipf(follow_power)), and `num_seed_posts` seed posts by random
    users created over the last `seed_max_age` ticks.  Cost O(N F + S d).  Jitted: the float
    fields of `params` are traced (one program for any values), sizes and choices are static;
    `params.validate()` runs at trace time.

    Grounded in text (all optional, see `text_bank`):
    - `interests` (descriptions' embeddings [Nd, d] + topics): each user draws a description
      uniformly, `persona` = its topic, interest = normalize(embedding + interest_noise z/sqrt(d))
      (instead of random persona centres);
    - `agent_interest` [num_agents, d]: the LLM agents' interests (their persona embeddings);
    - `text` (`CrowdText`): kept in `state.text`; seed posts copy the tokens and embedding of a
      bank post drawn by the author's interest (or entry `id % Nb` when `text.by_id`).
    """
    p = params.validate()
    n, d, f = p.num_users, p.embed_dim, p.max_following
    state = empty_state(p)
    ks = jax.random.split(key, 9)
    noise = p.interest_noise * jax.random.normal(ks[2], (n, d)) / jnp.sqrt(jnp.float32(d))
    if interests is None:
        persona = jax.random.randint(ks[0], (n,), 0, p.num_personas)
        centers = normalize(jax.random.normal(ks[1], (p.num_personas, d)))
        interest = normalize(centers[persona] + noise)
    else:
        chex.assert_shape(interests.embedding, (None, d))
        desc = jax.random.randint(ks[0], (n,), 0, interests.size)
        persona = interests.topic[desc]
        interest = normalize(interests.embedding[desc] + noise)
    if agent_interest is not None:
        a = p.num_agents
        chex.assert_shape(agent_interest, (a, d))
        interest = interest.at[:a].set(normalize(agent_interest))
        if interests is not None:  # an agent's persona = topic of its nearest description
            near = jnp.argmax(interest[:a] @ interests.embedding.T, axis=1)
            persona = persona.at[:a].set(interests.topic[near])
    z = jax.random.normal(ks[3], (n,))
    activity = jnp.clip(p.activation_rate * jnp.exp(p.activity_sigma * z
                                                     - 0.5 * p.activity_sigma ** 2), 0.0, 1.0)

    following = jnp.full((n, f), EMPTY, jnp.int32)
    if p.init_following > 0:
        outdeg = jnp.clip(jnp.round(p.init_following * jnp.exp(
            0.5 * jax.random.normal(ks[4], (n,)) - 0.125)), 1, f).astype(jnp.int32)
        cand = _follow_targets(ks[5], n, (n, f), p.follow_power)
        cand = jnp.where((jnp.arange(f)[None] < outdeg[:, None])
                         & (cand != jnp.arange(n)[:, None]), cand, EMPTY)
        cand = jnp.sort(cand, axis=1)
        dup = jnp.concatenate([jnp.zeros((n, 1), bool), cand[:, 1:] == cand[:, :-1]], axis=1)
        following = jnp.where(dup, EMPTY, cand)
    has = following >= 0
    num_following = jnp.sum(has, axis=1, dtype=jnp.int32)
    num_followers = jnp.zeros((n,), jnp.int32).at[jnp.where(has, following, n)].add(
        1, mode="drop")

    s = p.num_seed_posts
    posts = state.posts
    last_post = state.users.last_post
    if s > 0:
        author = jax.random.randint(ks[6], (s,), 0, n)
        created = jnp.sort(jax.random.randint(ks[7], (s,), -p.seed_max_age, 0))
        ids = jnp.arange(s, dtype=jnp.int32)
        tokens = posts.tokens[:s]
        if text is None:
            emb = normalize(interest[author] + p.post_noise * jax.random.normal(ks[8], (s, d))
                            / jnp.sqrt(jnp.float32(d)))
        elif text.by_id:
            tokens, emb = text_bank.by_id(text, ids)
        else:
            tokens, emb, _ = text_bank.draw_posts(ks[8], text, interest[author])
        posts = posts.replace(
            id=posts.id.at[:s].set(ids), kind=posts.kind.at[:s].set(PostKind.POST),
            author=posts.author.at[:s].set(author), created_at=posts.created_at.at[:s].set(created),
            tokens=posts.tokens.at[:s].set(tokens), embedding=posts.embedding.at[:s].set(emb),
            next_id=jnp.int32(s))
        last_post = last_post.at[author].max(ids)
        if p.feed_following > 0:  # each seed post's link to its author's previous one
            sa, sid = jax.lax.sort((author, ids), num_keys=2)
            prev = jnp.where(jnp.concatenate([jnp.zeros((1,), bool), sa[1:] == sa[:-1]]),
                             jnp.concatenate([jnp.full((1,), EMPTY, jnp.int32), sid[:-1]]),
                             EMPTY)
            posts = posts.replace(prev_by_author=posts.prev_by_author.at[sid].set(prev))
    return state.replace(
        users=state.users.replace(persona=persona, interest=interest, activity=activity,
                                  num_followers=num_followers, num_following=num_following,
                                  last_post=last_post, profile_sum=interest,
                                  profile_count=jnp.ones((n,), jnp.int32)),
        graph=state.graph.replace(following=following), posts=posts, text=text)


def _empty_crowd_info(state: SocialState) -> CrowdInfo:
    z = jnp.zeros((), jnp.int32)
    e = jnp.zeros((0,), jnp.int32)
    return CrowdInfo(
        apply=ApplyInfo(reason=e, effective_target=e, created_id=e, created_slot=e,
                        created_generation=e, type_counts=jnp.zeros((NUM_TYPES,), jnp.int32),
                        invalid_counts=jnp.zeros((NUM_REASONS,), jnp.int32),
                        like_delta=jnp.zeros_like(state.posts.likes)),
        num_active=z, active_overflow=z, event_overflow=z, feed_fill=jnp.zeros((), jnp.float32))


def step(key: jax.Array, state: SocialState, actions: ActionBatch | None, params: SocialParams
         ) -> tuple[SocialState, StepInfo]:
    """One tick: agents' actions, then the crowd (if `params.crowd`), then the clock.

    `actions` may be None (no agents this tick).  Returns `(state, StepInfo)`.
    """
    if actions is None:
        actions = empty_actions(0, params)
    before = state
    tick = state.tick
    state, agent = apply_and_update(state, actions, params)
    state = search.deliver(state, actions, agent, params)
    if params.crowd:
        state, crowd = crowd_step(key, state, params)
    else:
        crowd = _empty_crowd_info(state)
    posts = state.posts
    young = (posts.id >= 0) & (tick - posts.created_at < params.reward_horizon)
    posts = posts.replace(likes_h=jnp.where(young, posts.likes, posts.likes_h))
    state = state.replace(posts=posts, tick=tick + 1)
    record = _engagement_record(before, state, params)
    return state, StepInfo(agent=agent, crowd=crowd, like_delta=record["engagement_delta"][:, 0],
                           tick=tick, **record)


def _engagement_record(before: SocialState, after: SocialState, params: SocialParams) -> dict:
    """StepInfo's engagement_delta [P, E], follower_delta [A] and crowd_posts [] from the
    states before and after a tick."""
    def counters(p):
        kept = [p.likes, p.reposts, p.comments]
        if params.engagement_channels == 5:
            kept += [p.reports, p.dislikes]
        return jnp.stack(kept, axis=-1)
    new = after.posts.id != before.posts.id
    delta = counters(after.posts) - jnp.where(new[:, None], 0, counters(before.posts))
    a = params.num_agents
    return dict(
        engagement_delta=delta,
        follower_delta=after.users.num_followers[:a] - before.users.num_followers[:a],
        crowd_posts=jnp.sum(new & (after.posts.author >= a)).astype(jnp.int32))


def feed(key: jax.Array, state: SocialState, users: jax.Array, params: SocialParams
         ) -> recsys.Feed:
    """Feeds `[B, K]` (ids, slots, valid, score) for `users [B]` (distinct); pure (nothing
    marked seen, the inbox kept).  Token ids of the shown posts:
    `state.posts.tokens[feed.slots]` `[B, K, L]`.

    As OASIS composes a feed: the recommender's posts, with `feed_following > 0` the followees'
    most-liked recent posts among them (`recsys.compose_following`); an LLM agent with pending
    search / trend results (`state.inbox`) sees those instead."""
    f = recsys.recommend(key, state, users, params)
    if params.feed_following > 0:
        f = recsys.compose_following(state, users, f, params)
    return _inbox_feed(state, users, f, params)


def _inbox_feed(state: SocialState, users: jax.Array, f: recsys.Feed, params: SocialParams
                ) -> recsys.Feed:
    """Rows of agents with pending results show the results (those still alive) instead."""
    a = params.num_agents
    if a == 0:
        return f
    is_agent = (users >= 0) & (users < a)
    row = jnp.clip(users, 0, a - 1)
    use = is_agent & state.inbox.pending[row]
    ids = state.inbox.ids[row]
    ok = state.posts.alive(ids)
    ids = jnp.where(ok, ids, EMPTY)
    u = use[:, None]
    return recsys.Feed(ids=jnp.where(u, ids, f.ids),
                       slots=jnp.where(u, jnp.where(ok, state.posts.slot(ids), 0), f.slots),
                       valid=jnp.where(u, ok, f.valid),
                       score=jnp.where(u, jnp.where(ok, 0.0, -jnp.inf), f.score))


def observe(key: jax.Array, state: SocialState, users: jax.Array, params: SocialParams
            ) -> tuple[SocialState, recsys.Feed]:
    """`feed` + mark the shown posts as seen (the agents' "refresh") + clear the shown users'
    pending search results."""
    f = feed(key, state, users, params)
    state = recsys.mark_seen(state, users, f, params)
    a = params.num_agents
    if a > 0:
        row = jnp.where((users >= 0) & (users < a), users, a)
        state = state.replace(inbox=state.inbox.replace(
            pending=state.inbox.pending.at[row].set(False, mode="drop")))
    return state, f
