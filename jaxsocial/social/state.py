"""The society as one pytree of fixed-shape arrays.

Sizes (all static): N users, d embedding dims, F followee slots per user, M mute slots, P post
slots (ring buffer), L content tokens per post, R reaction records per user, S seen records per
user.  Nothing is N x N or N x P: the follow graph is padded adjacency `[N, F]`, reactions live in
per-user records `[N, R]` whose entries are reused once their post has left the buffer.

Post ids are *global* and monotone: the k-th post ever created has id k and lives in slot
`k % P`; its generation is `k // P`.  `posts.id[slot]` holds the id currently in a slot, so an id
is alive iff `0 <= id < next_id and posts.id[id % P] == id` -- a stale id that points at an
overwritten slot is detected by that comparison.  (int32 ids: 2**31 posts per society.)
"""
from __future__ import annotations

import enum

import jax
import jax.numpy as jnp
from flax import struct

EMPTY = -1  # padding value for every id array (users, posts, records)
PAD_TOKEN = -1  # right padding of post content tokens: never a real token id (in Llama-3
#                  id 0 is "!"); a position holds a token iff `tokens >= 0`


class PostKind(enum.IntEnum):
    POST = 0
    COMMENT = 1
    REPOST = 2
    QUOTE = 3


class ReactionKind(enum.IntEnum):
    """Kinds stored in the per-user reaction ring (like and dislike are independent, as in
    OASIS's separate `like` / `dislike` tables)."""
    NONE = 0
    LIKE = 1
    DISLIKE = 2
    REPOST = 3
    REPORT = 4


RECSYS_NAMES = ("random", "reddit", "twitter", "twhin")  # the built-ins


# name -> fn(user [B], candidates [B, C], state) -> scores [B, C]: the recommenders users
# registered (`jaxsocial.social.recsys.register` fills it; here so that params can check names).
REGISTERED_RECSYS: dict = {}


def recsys_names() -> tuple[str, ...]:
    """The recommenders `SocialParams.recsys` accepts: the built-ins, then the registered ones
    (`jaxsocial.social.recsys.register`)."""
    return RECSYS_NAMES + tuple(REGISTERED_RECSYS)


def _static(default):
    return struct.field(pytree_node=False, default=default)


@struct.dataclass
class SocialParams:
    """Every knob of a society.  Sizes and choices are static (part of the compiled program);
    rates and weights are float leaves (can be traced, e.g. vmapped over a sweep).

    Reading order: population -> graph -> posts -> memory -> recsys -> crowd.
    """
    # --- population
    num_users: int = _static(1000)
    num_agents: int = _static(0)  # LLM agents are users [0, num_agents); the crowd is the rest
    num_personas: int = _static(16)
    embed_dim: int = _static(32)
    # --- graph
    max_following: int = _static(32)  # F
    max_muted: int = _static(4)  # M
    init_following: int = _static(8)  # mean out-degree at reset (capped at F)
    # --- posts
    post_capacity: int = _static(4096)  # P
    content_len: int = _static(16)  # L
    num_seed_posts: int = _static(1024)
    seed_max_age: int = _static(24)  # seed posts are created in ticks [-seed_max_age, 0)
    start_seconds: int = _static(1_700_000_000)  # wall clock of tick 0 (reddit hot uses seconds)
    seconds_per_tick: int = _static(3600)
    reward_horizon: int = _static(8)  # H: posts.likes_h freezes the likes of a post at age H
    # StepInfo.engagement_delta's channels: 3 = (likes, reposts, comments); 5 adds (reports,
    # dislikes), for rewards that weigh them (a training run sets it from its reward weights)
    engagement_channels: int = _static(3)
    # --- memory
    reaction_memory: int = _static(64)  # R
    seen_memory: int = _static(32)  # S
    # --- recommender
    recsys: str = _static("twitter")  # one of recsys_names(): RECSYS_NAMES or a registered one
    feed_size: int = _static(10)  # K
    pool_size: int = _static(256)  # C: shared out-of-network candidates (top by prior)
    pool_random: int = _static(0)  # + this many uniformly drawn live posts (twitter)
    in_network: int = _static(8)  # I: followees sampled per user for in-network candidates
    overfetch: int = _static(4)  # keep K + overfetch candidates before the muted/dup filter
    recency: str = _static("exp")  # "exp" | "oasis_clipped" (twitter; twhin is always OASIS's)
    # twhin: a uniform random set of this many live posts is scored per tick (OASIS: 4,000);
    # clamped to post_capacity (a smaller ring is scored whole)
    twhin_candidates: int = _static(4000)
    exclude_own: bool = _static(True)
    seen_policy: str = _static("exclude")  # "exclude" | "downweight" | "none"
    # --- the agents' feed as OASIS composes it (society.observe; the crowd's feeds are the
    # recommender's alone)
    # followees' most-liked recent posts per agent feed (OASIS: following_post_count = 3);
    # 0 = the recommender's K posts only.  > 0 keeps each post's `prev_by_author` link.
    feed_following: int = _static(0)
    following_depth: int = _static(4)  # posts walked back per followee (its author chain)
    following_window: int = _static(24)  # ticks: a followee's post is "recent" when younger
    # comments shown per agent feed post (newest first; 0 = the prompt's `newest_comment`
    # style); > 1 keeps each comment's `prev_comment` link
    feed_comments: int = _static(0)
    # trend action: the most-liked posts created in the last trend_window ticks
    trend_window: int = _static(24)
    # --- crowd
    crowd: bool = _static(True)
    max_active: int = _static(256)  # capacity of the active-crowd batch per tick
    crowd_budget: int = _static(2048)  # capacity of the crowd action batch per tick
    # capacity of the batch rows that create content (post / quote / comment); their text or
    # embedding is drawn for these rows only. 0: every row of the batch (no bound).
    content_budget: int = _static(0)
    # float leaves ------------------------------------------------------------------------------
    # population
    interest_noise: float = 0.5  # interest = normalize(persona_center + noise * z)
    follow_power: float = 0.9  # target popularity ~ rank^-follow_power (scale-free-ish in-degree)
    activation_rate: float = 0.1  # mean per-tick activation probability of a crowd user
    activity_sigma: float = 1.0  # log-normal spread of per-user activity (heavy tail)
    # recsys: score = w_sim cos + w_rec decay(age) + w_pop log1p(likes) + w_in [in-network]
    w_sim: float = 1.0
    w_rec: float = 1.0
    w_pop: float = 0.3
    w_in: float = 0.5
    recency_tau: float = 24.0  # ticks, for decay = exp(-age / tau)
    seen_penalty: float = 2.0  # subtracted when seen_policy == "downweight"
    explore_frac: float = 0.0  # share of feed slots swapped for uniform random posts
    # crowd reactions: p = sigmoid(bias + sim_w cos + pop_w log1p(likes) + follow_w [follows]
    #                              + activity_w log(activity / activation_rate))
    like_bias: float = -2.5
    like_sim: float = 3.0
    like_pop: float = 0.3
    like_follow: float = 1.0
    like_activity: float = 0.3
    dislike_bias: float = -5.0
    dislike_sim: float = 3.0  # p_dislike = sigmoid(dislike_bias - dislike_sim * cos)
    p_post: float = 0.1
    p_repost: float = 0.03
    p_quote: float = 0.01
    p_comment: float = 0.05
    p_follow: float = 0.05
    post_noise: float = 0.3  # crowd post embedding = normalize(interest + post_noise * z)

    def validate(self) -> "SocialParams":
        """Raise ValueError naming the first inconsistent size."""
        checks = [
            ("num_users", self.num_users, self.num_users >= 2),
            ("num_agents", self.num_agents, 0 <= self.num_agents <= self.num_users),
            ("post_capacity", self.post_capacity, self.post_capacity >= 1),
            ("num_seed_posts", self.num_seed_posts, 0 <= self.num_seed_posts <= self.post_capacity),
            ("max_following", self.max_following, self.max_following >= 1),
            ("init_following", self.init_following,
             0 <= self.init_following <= self.max_following),
            ("max_muted", self.max_muted, self.max_muted >= 1),
            ("reaction_memory", self.reaction_memory, self.reaction_memory >= 1),
            ("seen_memory", self.seen_memory, self.seen_memory >= 1),
            ("feed_size", self.feed_size, self.feed_size >= 1),
            ("pool_size", self.pool_size, 1 <= self.pool_size <= self.post_capacity),
            ("pool_random", self.pool_random, self.pool_random >= 0),
        ("overfetch", self.overfetch, self.overfetch >= 0),
        ("reward_horizon", self.reward_horizon, self.reward_horizon >= 1),
        ("engagement_channels", self.engagement_channels, self.engagement_channels in (3, 5)),
        ("in_network", self.in_network, 0 <= self.in_network <= self.max_following),
            ("recsys", self.recsys, self.recsys in recsys_names()),
            ("twhin_candidates", self.twhin_candidates, self.twhin_candidates >= 1),
            ("recency", self.recency, self.recency in ("exp", "oasis_clipped")),
            ("seen_policy", self.seen_policy,
             self.seen_policy in ("exclude", "downweight", "none")),
            ("feed_following", self.feed_following,
             0 <= self.feed_following <= self.feed_size),
            ("following_depth", self.following_depth, self.following_depth >= 1),
            ("following_window", self.following_window, self.following_window >= 1),
            ("feed_comments", self.feed_comments, self.feed_comments >= 0),
            ("trend_window", self.trend_window, self.trend_window >= 1),
            ("max_active", self.max_active, self.max_active >= 1),
            ("crowd_budget", self.crowd_budget,
             1 <= self.crowd_budget <= self.post_capacity),
            ("content_budget", self.content_budget,
             0 <= self.content_budget <= self.crowd_budget),
            ("num_users * 8", self.num_users * 8, self.num_users * 8 < 2**31),
        ]
        choices = {"recsys": recsys_names()}
        more = {"recsys": "; jaxsocial.social.recsys.register adds your own"}
        for name, value, ok in checks:
            if not ok:
                hint = (f" (expected one of {', '.join(map(repr, choices[name]))}"
                        f"{more.get(name, '')})" if name in choices else "")
                raise ValueError(f"invalid SocialParams.{name}={value!r}{hint}")
        return self


@struct.dataclass
class Users:
    persona: jax.Array  # [N] int32
    interest: jax.Array  # [N, d] float32, unit norm
    activity: jax.Array  # [N] float32, per-tick activation probability (heavy-tailed)
    num_followers: jax.Array  # [N] int32 (= in-degree of the follow graph)
    num_following: jax.Array  # [N] int32 (= non-empty entries of graph.following[u])
    last_post: jax.Array  # [N] int32 global id of the user's latest post/repost/quote or -1
    # TwHIN profile (maintained only when recsys == "twhin"; see actions.update_profiles): the
    # running mean of the bio (= interest at reset) and the embeddings of every post the user
    # created (post / repost / quote) or liked, stored as sum + count.  Profile mean =
    # profile_sum / profile_count; the bio's weight in it is 1 / profile_count.
    profile_sum: jax.Array  # [N, d] float32
    profile_count: jax.Array  # [N] int32, 1 + number of posts created or liked


@struct.dataclass
class Graph:
    following: jax.Array  # [N, F] int32 followee ids, EMPTY holes anywhere in a row
    muted: jax.Array  # [N, M] int32 muted user ids, EMPTY holes


@struct.dataclass
class Posts:
    """Ring buffer of P slots; fields indexed by slot = id % P."""
    id: jax.Array  # [P] int32 global id in the slot, EMPTY if never used
    kind: jax.Array  # [P] int32 PostKind
    author: jax.Array  # [P] int32 user id
    parent: jax.Array  # [P] int32 global id: original (repost/quote), commented post, or EMPTY
    created_at: jax.Array  # [P] int32 tick
    tokens: jax.Array  # [P, L] int32 content token ids, right-padded with PAD_TOKEN (a repost
    #                    copies its original's)
    embedding: jax.Array  # [P, d] float32 unit norm, computed once at creation
    likes: jax.Array  # [P] int32
    dislikes: jax.Array  # [P] int32
    reposts: jax.Array  # [P] int32
    quotes: jax.Array  # [P] int32
    comments: jax.Array  # [P] int32
    reports: jax.Array  # [P] int32
    likes_h: jax.Array  # [P] int32 likes received while age < reward_horizon, then frozen
    last_comment: jax.Array  # [P] int32 global id of the newest comment on the post, or EMPTY
    #                          (may since have been evicted: check `alive`)
    # Links, kept only when a feed needs them (else EMPTY): a post's comments newest first are
    # last_comment, prev_comment[last_comment], ... (feed_comments > 1); an author's posts /
    # reposts / quotes newest first are users.last_post, prev_by_author[last_post], ...
    # (feed_following > 0).  Ids only decrease along a chain, so the first id that is not
    # `alive` ends it (everything older was evicted too).
    prev_comment: jax.Array  # [P] int32 the previous comment on the same post, or EMPTY
    prev_by_author: jax.Array  # [P] int32 the author's previous post / repost / quote, or EMPTY
    next_id: jax.Array  # [] int32 id the next created post gets

    @property
    def capacity(self) -> int:
        return self.id.shape[-1]

    def slot(self, ids: jax.Array) -> jax.Array:
        """Slot of global ids (`ids % P`; EMPTY maps to a valid slot, mask with `alive`)."""
        return jnp.maximum(ids, 0) % self.capacity

    def generation(self, ids: jax.Array) -> jax.Array:
        return jnp.maximum(ids, 0) // self.capacity

    def alive(self, ids: jax.Array) -> jax.Array:
        """True where `ids` names a post still in the ring buffer (not missing, not evicted)."""
        return (ids >= 0) & (ids < self.next_id) & (self.id[self.slot(ids)] == ids)


@struct.dataclass
class Memory:
    react_post: jax.Array  # [N, R] int32 global post ids, EMPTY = free; a record of an
    #                        evicted post is free too (reused by the next reaction)
    react_kind: jax.Array  # [N, R] int8 ReactionKind
    seen: jax.Array  # [N, S] int32 global ids shown in the user's recent feeds (FIFO ring)
    seen_head: jax.Array  # [N] int32


@struct.dataclass
class Inbox:
    """Results of the LLM agents' search_posts / search_user / trend actions, waiting to be their
    next feed (`society.observe` shows them instead of the recommender's feed, then clears
    them), as OASIS returns a search's result to the agent that searched."""
    ids: jax.Array  # [A, K] int32 global post ids, EMPTY holes
    pending: jax.Array  # [A] bool: agent a's next feed is ids[a]


@struct.dataclass
class SocialState:
    users: Users
    graph: Graph
    posts: Posts
    memory: Memory
    tick: jax.Array  # [] int32 simulation clock
    inbox: Inbox  # [A, K]: pending search / trend results of the A = num_agents LLM agents
    # Optional `text_bank.CrowdText`: when set, seed and crowd posts / comments / quotes copy
    # tokens + embedding from its banks (chosen by interest); None = text-free society.
    text: object = None


def empty_state(params: SocialParams) -> SocialState:
    """All-empty state with the shapes `params` asks for (no users' attributes drawn yet)."""
    p = params.validate()
    n, d, cap, ln = p.num_users, p.embed_dim, p.post_capacity, p.content_len
    i32 = jnp.int32
    def full(shape):
        return jnp.full(shape, EMPTY, i32)
    def zeros(shape):
        return jnp.zeros(shape, i32)
    users = Users(
        persona=zeros((n,)), interest=jnp.zeros((n, d), jnp.float32),
        activity=jnp.zeros((n,), jnp.float32), num_followers=zeros((n,)),
        num_following=zeros((n,)), last_post=full((n,)),
        profile_sum=jnp.zeros((n, d), jnp.float32), profile_count=zeros((n,)))
    graph = Graph(following=full((n, p.max_following)), muted=full((n, p.max_muted)))
    posts = Posts(
        id=full((cap,)), kind=zeros((cap,)), author=full((cap,)), parent=full((cap,)),
        created_at=zeros((cap,)), tokens=jnp.full((cap, ln), PAD_TOKEN, i32),
        embedding=jnp.zeros((cap, d), jnp.float32), likes=zeros((cap,)),
        dislikes=zeros((cap,)), reposts=zeros((cap,)), quotes=zeros((cap,)),
        comments=zeros((cap,)), reports=zeros((cap,)), likes_h=zeros((cap,)),
        last_comment=full((cap,)), prev_comment=full((cap,)), prev_by_author=full((cap,)),
        next_id=jnp.zeros((), i32))
    memory = Memory(
        react_post=full((n, p.reaction_memory)),
        react_kind=jnp.zeros((n, p.reaction_memory), jnp.int8),
        seen=full((n, p.seen_memory)), seen_head=zeros((n,)))
    inbox = Inbox(ids=full((p.num_agents, p.feed_size)),
                  pending=jnp.zeros((p.num_agents,), bool))
    return SocialState(users=users, graph=graph, posts=posts, memory=memory,
                       tick=jnp.zeros((), i32), inbox=inbox)


def normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / max(||x||, eps) along the last axis."""
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)
