"""Crowd-only society at OASIS's million-agent scale (no LLM agents).

    python launch/simulate.py --config=configs/million.py --workdir=runs/million
    python launch/simulate.py --config=configs/million.py:small --workdir=runs/small  # 1e4, seconds
    python launch/simulate.py --config=configs/million.py:tiny --workdir=/tmp/t        # tests

`society` holds `jaxsocial.social.state.SocialParams` fields (checked by name at start-up).
Sizes scale with the user count: as many post slots as users, ~5% of users active per tick.
"""
import ml_collections


def society_config(num_users: int) -> ml_collections.ConfigDict:
    n = int(num_users)
    rate = 0.05
    max_active = int(1.2 * rate * n) + 64  # activations ~ Binomial: 20% headroom is plenty
    return ml_collections.ConfigDict(dict(
        num_users=n, num_agents=0, num_personas=64, embed_dim=32,
        max_following=32, max_muted=4, init_following=12,
        post_capacity=n, content_len=8, num_seed_posts=n // 2, seed_max_age=48,
        reward_horizon=8, reaction_memory=32, seen_memory=20,
        recsys="twitter", feed_size=10, pool_size=192, pool_random=64, in_network=8,
        overfetch=4,
        recency="exp", seen_policy="exclude", crowd=True,
        # Crowd actions per tick: at 1e6 the 48 ticks of this config draw at most 78,512 (1.6 per
        # active user; none over budget), so 2 x max_active (120,128) leaves half again.
        max_active=max_active, crowd_budget=min(n, 2 * max_active),
        content_budget=min(n, 2 * max_active, max_active // 4),  # posts, quotes, comments
        activation_rate=rate, activity_sigma=1.0, like_bias=-4.0, like_sim=3.0, like_pop=0.1,
        p_post=0.1, p_repost=0.02, p_quote=0.005, p_comment=0.03, p_follow=0.03,
        explore_frac=0.05))


def get_config(arg=None):
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.ticks = 48
    c.metrics_every = 1   # ticks between metric records (JSONL lines)
    sizes = {None: 1_000_000, "": 1_000_000, "million": 1_000_000, "small": 10_000,
             "tiny": 600}
    if arg not in sizes:
        raise ValueError(f"unknown million.py variant {arg!r}; use '', 'small' or 'tiny'")
    c.society = society_config(sizes[arg])
    if arg == "small":
        c.ticks = 24
    if arg == "tiny":
        c.ticks = 4
        c.society.update(pool_size=64, pool_random=16, num_personas=8, embed_dim=8)
    return c
