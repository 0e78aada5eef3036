"""CPU demo: tiny Llama + in-repo tokenizer + crowd reactions; minutes on a 2-core CPU.

    python launch/train.py --config=configs/demo.py --workdir=runs/demo
    python launch/train.py --config=configs/demo.py:smoke      # a few ticks, one update (tests)

Crowd users like posts whose embedding is close to their interests. The embedding is the
society's encoder (`society.encoder`): by default the frozen reference model's pooled hidden
state through a random projection, which for this random model has no semantics;
`--config.society.encoder=minilm --config.society.embed_dim=384` makes it all-MiniLM-L6-v2's
sentence embedding of the post's text. Crowd attention is fixed (active users x feed size), so
rewarding raw likes makes agents post more and dilutes likes per post; with
`reward.non_post_mode="mean"` an answer that creates nothing earns the epoch's mean post score.
Measured on this config (docs/train.md): likes per post rise while the agents fall silent
(posts fall, total likes halve), so that default is under review.
"""
from jaxsocial.train import defaults


def get_config(arg=None):
    c = defaults.base_config()
    c.name = "demo"
    c.model.preset = "tiny"
    c.model.checkpoint = ""          # empty: random init of the preset (seeded)
    c.tokenizer = ""                 # empty: the in-repo tiny tokenizer
    c.agents.num_agents = 16
    # Crowd taste is the signal: one topic (its interest descriptions, embedded by the frozen
    # encoder), likes driven by post-interest similarity (no popularity feedback, so one lucky
    # post does not dominate an epoch's average).
    c.crowd_text.topics = ("cooking",)
    c.society.update(defaults.taste_driven_society(num_users=2048, feed_size=4))
    # Answers that create no post earn the epoch's mean post score: the policy is rewarded for
    # posts that beat the average (what the crowd likes), not for posting more.
    c.reward.non_post_mode = "mean"
    c.rollout.ticks_per_epoch = 16
    c.rollout.max_new_tokens = 16
    c.rollout.temperature = 1.0
    c.rl.algo = "ppo"
    c.rl.lr = 1e-3                   # tiny random model: far above the 8B default (3e-6)
    c.rl.kl_coef = 0.01
    c.rl.ppo_epochs = 4
    c.rl.minibatches = 2
    c.train.epochs = 12
    c.train.checkpoint_every = 2
    if arg == "smoke":
        defaults.smoke(c)
    elif arg:
        raise ValueError(f"unknown demo variant {arg!r}; use configs/demo.py or :smoke")
    return c
