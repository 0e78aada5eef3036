"""Throughput of the social-learning tournament: populations x rounds per second.

    python benchmarks/tournament.py [--seeds 1000] [--python-pops 20] [--repeats 3]
    python benchmarks/tournament.py --llm=smol [--llm-seeds 2 --llm-rounds 3]   # + LLM agents

Every baseline runs vectorised over `--seeds` populations of 10 agents x 25 arms x 100 rounds
(one jitted `rollout_batch` call, compile excluded, best of `--repeats`). The peer, measured in
the same run, is a straightforward pure-Python solo UCB1 written here (lists, `random.gauss`,
one agent and arm at a time: the way the paper's experiment code plays the bandit), timed by
the same rule: best of `--repeats` runs of `--python-pops` populations. It runs on one core by
nature; the JAX rows use every core of the process. Prints a table and the ratio, one JSON
object, then `result: <file>` (benchmarks/results/) and the machine line, last.

`--llm` (a checkpoint path, a preset such as `tiny`, or `smol` for the packaged
SmolLM2-135M-Instruct) adds a row for LLM agents playing social populations of the same size
(`--llm-seeds` populations x `--llm-rounds` rounds, two generations per agent and round): one
untimed run compiles every prompt bucket, the same run is then timed. Its population-rounds/s
is not comparable to the algorithmic rows' (a model answers every decision); generated tokens/s
is printed beside it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
from common import NO_RECORD_HELP, finish  # noqa: E402  benchmarks/: the result file

from jaxsocial.envs import baselines  # noqa: E402
from jaxsocial.envs import social_learning as sl  # noqa: E402


def python_solo_ucb(seed: int, n: int = 10, k: int = 25, t_max: int = 100) -> float:
    """One solo-UCB1 population in plain Python; returns the cumulative per-agent mean reward."""
    rng = random.Random(seed)
    mu = [rng.expovariate(1.0) for _ in range(k)]
    counts = [[0] * k for _ in range(n)]
    sums = [[0.0] * k for _ in range(n)]
    total = 0.0
    for _ in range(t_max):
        for i in range(n):
            untried = [a for a in range(k) if counts[i][a] == 0]
            if untried:
                arm = rng.choice(untried)
            else:
                tot = sum(counts[i])
                arm = max(range(k), key=lambda a: sums[i][a] / counts[i][a]
                          + math.sqrt(2 * math.log(tot) / counts[i][a]))
            r = rng.gauss(mu[arm], 1.0)
            counts[i][arm] += 1
            sums[i][arm] += r
            total += r
    return total / n


def llm_rate(args, params) -> dict:
    """LLM agents (social populations, `params`' agents and arms): compile run, then timed run."""
    from jaxsocial.envs import llm_agent

    ckpt = args.llm
    if ckpt == "smol":
        from jaxsocial.models import zoo
        ckpt = zoo.smollm2_135m_instruct()
    agent = llm_agent.LLMAgent.load(ckpt, llm_agent.LLMAgentConfig(max_learn_tokens=16,
                                                                   max_pull_tokens=16))
    p = params.replace(num_rounds=args.llm_rounds, social=True)
    keys = jax.random.split(jax.random.key(0), args.llm_seeds)
    agent.run(keys, p)  # compiles every prompt bucket this run meets
    t0 = time.perf_counter()
    run = agent.run(keys, p)
    dt = time.perf_counter() - t0
    return {"checkpoint": args.llm, "seeds": args.llm_seeds, "rounds": args.llm_rounds,
            "seconds": round(dt, 2), "pop_rounds_per_s": round(args.llm_seeds * args.llm_rounds
                                                               / dt, 4),
            "gen_tokens_per_s": round(float(run.traj.tokens.sum()) / dt, 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--python-pops", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--llm", default="", help="checkpoint path, preset, or 'smol'")
    ap.add_argument("--llm-seeds", type=int, default=2)
    ap.add_argument("--llm-rounds", type=int, default=3)
    ap.add_argument("--no_record", action="store_true", help=NO_RECORD_HELP)
    args = ap.parse_args()
    params = sl.EnvParams()  # 10 agents x 25 arms x 100 rounds
    keys = jax.random.split(jax.random.key(0), args.seeds)
    pop_rounds = args.seeds * params.num_rounds
    rates = {}
    for name, policy in baselines.BASELINES.items():
        p = params.replace(social=(name != "solo_ucb"))
        jax.block_until_ready(sl.rollout_batch(keys, policy, p))  # compile
        best = math.inf
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(sl.rollout_batch(keys, policy, p))
            best = min(best, time.perf_counter() - t0)
        rates[name] = pop_rounds / best
    py_best = math.inf
    for _ in range(args.repeats):  # the same rule as the JAX rows: best of --repeats
        t0 = time.perf_counter()
        for s in range(args.python_pops):
            python_solo_ucb(s, params.num_agents, params.num_arms, params.num_rounds)
        py_best = min(py_best, time.perf_counter() - t0)
    py_rate = args.python_pops * params.num_rounds / py_best
    print(f"social-learning tournament, {params.num_agents} agents x {params.num_arms} arms x "
          f"{params.num_rounds} rounds, backend {jax.default_backend()}, {os.cpu_count()} CPUs")
    print(f"{'policy':<34}{'population-rounds/s':>22}")
    for name, r in rates.items():
        print(f"{'jax ' + name + f' x{args.seeds}':<34}{r:>22,.0f}")
    print(f"{'python solo_ucb loop':<34}{py_rate:>22,.0f}")
    llm = llm_rate(args, params) if args.llm else None
    if llm:
        name = f"llm {args.llm} x{args.llm_seeds} ({args.llm_rounds} rounds)"
        print(f"{name:<34}{llm['pop_rounds_per_s']:>22,.3f}   ({llm['gen_tokens_per_s']:.1f} "
              f"generated tok/s, {llm['seconds']:.1f} s)")
    ratio = rates["solo_ucb"] / py_rate
    print(f"solo UCB1: vectorised JAX / pure-Python loop = {ratio:.1f}x")
    figures = {"llm": llm, "benchmark": "social_learning_tournament", "seeds": args.seeds,
               "agents": params.num_agents, "arms": params.num_arms,
               "rounds": params.num_rounds,
               "jax_pop_rounds_per_s": {k: round(v, 1) for k, v in rates.items()},
               "python_solo_ucb_pop_rounds_per_s": round(py_rate, 1),
               "speedup_solo_ucb": round(ratio, 2)}
    print(json.dumps(figures))
    finish("tournament", figures, record=not args.no_record)


if __name__ == "__main__":
    main()
