"""The paper setting: 196 LLM agents (Llama-3-8B-Instruct), likes as reward, PPO defaults.

    python launch/train.py --config=configs/general.py \
        --config.model.checkpoint=/path/to/Meta-Llama-3-8B-Instruct
    python launch/train.py --config=configs/general.py:smoke   # tiny shapes (tests, CPU)

PPO defaults from the spec: lr 3e-6, clip 0.2/0.2, gamma 1, lambda 0.95, 4 epochs, KL k1 0.05,
temperature 0.7. The crowd is on by default (one machine reaches OASIS scale with it); set
--config.society.crowd=False for an LLM-agents-only society like the blog's.
"""
from jaxsocial.train import config as run_config


def get_config(arg=None):
    c = run_config.base_config()
    c.name = "general"
    c.model.preset = "llama3_8b"
    c.model.checkpoint = ""
    c.model.require_checkpoint = True
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "bfloat16"
    c.model.remat = True  # see docs/scaling.md: activations dominate without it
    c.model.attention_chunk = 256  # query blocks: no [rows, heads, T, S] scores (docs/scaling.md)
    # The 32 layers as one lax.scan: each layer's weight gathers stay in its iteration under any
    # XLA scheduler, and the program compiles once per layer body (docs/scaling.md).
    c.model.scan_layers = True
    c.agents.num_agents = 196
    c.society.update(num_users=100_000, num_personas=32, embed_dim=64, post_capacity=65_536,
                     content_len=96, num_seed_posts=4096, feed_size=5, pool_size=512,
                     max_active=8192, crowd_budget=16_384)
    # OASIS-style activation: 96 of the 196 agents act each simulated hour, drawn by their
    # heavy-tailed daily activity profiles; 320 hourly ticks (~13 days) give 30,720
    # interactions per epoch, the blog's ~30k per stage.
    c.agents.active_per_tick = 96
    c.agents.activation.enabled = True
    c.rollout.ticks_per_epoch = 320
    c.rollout.max_new_tokens = 128
    c.rollout.temperature = 0.7
    c.reward.horizon = 8
    c.rl.learning_rate = 3e-6
    c.rl.ppo_epochs = 4
    c.rl.num_minibatches = 4
    c.rl.micro_batch = 8  # 7,680-row minibatches, accumulated over 960 micro-batches of 8
    c.rl.kl_coef = 0.05
    c.train.epochs = 2
    c.mesh.shape = (-1, 1, 1)
    if arg == "smoke":
        run_config.smoke(c)
    elif arg:
        raise ValueError(f"unknown general variant {arg!r}; use configs/general.py or :smoke")
    return c
