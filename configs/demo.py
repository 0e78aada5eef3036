"""CPU demo: tiny Llama + in-repo tokenizer + crowd reactions; minutes on a 2-core CPU.

    python launch/train.py --config=configs/demo.py --workdir=runs/demo
    python launch/train.py --config=configs/demo.py:smoke      # a few ticks, one update (tests)

Crowd users like posts whose embedding is close to their interests. The embedding is the
society's encoder: here all-MiniLM-L6-v2 (`society.encoder="minilm"`), so "close to cooking" is
a statement about the posts' text. A random model's byte noise sits far from every topic
(cosine to the crowd's interests about 0.05), so the like curve is steep and shifted for this
space (`like_bias=-4`, `like_sim=20`: about 7 likes per post at the start, a few more per
0.01 of cosine). An answer that creates nothing earns 0 (`reward.non_post_mode="constant"`,
`reward.non_post=0`), chosen by the reward ablation in docs/train.md ("What the demo learns"):
it is the setting under which the agents' posts, and the likes they earn in all, rise beyond
the frozen control's. The `:smoke` variant keeps the reference space (the frozen policy's
pooled states; no encoder in the tests that build it), the curve tuned for it and
`non_post_mode="mean"`. Sized to take
about 5 minutes on an idle 2-core CPU; what it shows, with seeds and a frozen control:
docs/train.md, "What the demo learns".
"""
from jaxsocial.train import config as run_config


def get_config(arg=None):
    c = run_config.base_config()
    c.name = "demo"
    c.model.preset = "tiny"
    c.model.checkpoint = ""          # empty: random init of the preset (seeded)
    c.tokenizer = ""                 # empty: the in-repo tiny tokenizer
    c.agents.num_agents = 16
    # Crowd taste is the signal: one topic (its interest descriptions, embedded by the frozen
    # encoder), likes driven by post-interest similarity (no popularity feedback, so one lucky
    # post does not dominate an epoch's average).
    c.crowd_text.topics = ("cooking",)
    c.society.update(run_config.taste_driven_society(num_users=2048, feed_size=4))
    c.society.update(encoder="minilm", embed_dim=384, like_bias=-4.0, like_sim=20.0)
    # Answers that create no post earn 0: posting pays when a post earns likes. ("mean", the
    # epoch's mean post score, left posting where the frozen control had it: docs/train.md.)
    c.reward.non_post_mode = "constant"
    c.reward.non_post = 0.0
    c.rollout.ticks_per_epoch = 12
    c.rollout.max_new_tokens = 16
    c.rollout.temperature = 1.0
    c.rl.algo = "ppo"
    c.rl.learning_rate = 1e-3                   # tiny random model: far above the 8B default (3e-6)
    c.rl.kl_coef = 0.01
    c.rl.ppo_epochs = 2
    c.rl.num_minibatches = 1
    c.train.epochs = 10
    c.train.checkpoint_every = 2
    if arg == "smoke":
        run_config.smoke(c)  # embed_dim=16
        c.society.update(encoder="reference", like_bias=-5.0, like_sim=8.0)
        c.reward.non_post_mode = "mean"
    elif arg:
        raise ValueError(f"unknown demo variant {arg!r}; use configs/demo.py or :smoke")
    return c
