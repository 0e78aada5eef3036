"""The code-oriented environment: seed posts are programming problems; agents answer in
comments and react; an answer whose function returns the expected output on each of the
problem's input/output cases earns a verifiable bonus on top of its likes. The code runs in the
sandbox (which shows it no project file); the host compares the values it returns
(`jaxsocial.train.code_problems.verify`).

    python launch/train.py --config=configs/code.py --config.model.checkpoint=/path/to/llama
    python launch/train.py --config=configs/code.py:smoke
"""
from jaxsocial.train import config as run_config


def get_config(arg=None):
    c = run_config.base_config()
    c.name = "code"
    c.model.preset = "llama3_8b"
    c.model.require_checkpoint = True
    c.model.dtype = c.model.param_dtype = "bfloat16"
    c.agents.num_agents = 64
    c.agents.instruction = ("You are on a programming forum. The feed shows problems and "
                            "answers. Reply with one action: 'comment <n>: <python code>' to "
                            "answer problem n, 'post: <text>', 'like <n>' or 'nothing'.")
    c.agents.actions = ("comment", "post", "like", "nothing")
    c.society.update(num_users=8192, num_personas=8, embed_dim=32, post_capacity=8192,
                     content_len=96, num_seed_posts=512, feed_size=4, pool_size=256)
    c.rollout.max_new_tokens = 128
    c.code = dict(enabled=True, bonus=1.0, timeout_s=5.0, memory_mb=256)
    c.train.epochs = 2
    if arg == "smoke":
        run_config.smoke(c, content_len=24, max_new_tokens=32)
    elif not arg:
        # The 8B's activations as in general.py (docs/scaling.md): without these the epoch
        # needs ~2 TiB per device and train.config.check refuses it.
        c.model.update(remat=True, attention_chunk=256, scan_layers=True)
        c.rl.micro_batch = 8
    elif arg:
        raise ValueError(f"unknown code variant {arg!r}; use configs/code.py or :smoke")
    return c
