"""Run the social-learning tournament: every baseline over the seeds, then (optionally) LLM agents.

    python launch/tournament.py --config=configs/social_learning.py --workdir=runs/sl
    python launch/tournament.py --config=configs/social_learning.py:tiny_llm --workdir=runs/sl
    python launch/tournament.py --config=configs/social_learning.py \
        --config.llm.enabled=True --config.llm.checkpoint=/path/to/hf_llama --workdir=runs/sl

Prints a table (J, dJ(C*) vs solo with SEM and p, distinct arms, completion) and writes
`results.json` to --workdir. The reference policy (solo UCB1) plays in a solo population; every
other baseline plays in a social one; populations are matched by seed (same arm means, same
forced-search schedule). LLM agents are compared with the same model with observation disabled.

The config is checked before anything runs (`check_config`): a bad value is one line,
`error: ...`, naming its `--config.` key, exit status 1, and no workdir is made.
"""
from __future__ import annotations

import json
import math
import os
import sys

import jax
from absl import app, flags
from ml_collections import config_flags

from jaxsocial import cli
from jaxsocial.envs import baselines, metrics
from jaxsocial.envs import social_learning as sl

FLAGS = flags.FLAGS


def env_params(env_cfg, **overrides) -> sl.EnvParams:
    """EnvParams from the config's `env` block (`cli.env_params`: validated, errors name the
    `--config.` key, e.g. env.num_rounds)."""
    return cli.env_params(sl.EnvParams, env_cfg, **overrides)


def _positive_int(value, key: str, lo: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{key}={value!r} must be an integer >= {lo}")
    return value


def check_config(config) -> None:
    """Raise ValueError naming the first bad `--config.` key (seed counts, baselines, the env
    block, the LLM block when enabled). Cheap: nothing is compiled, loaded or written."""
    _positive_int(config.num_seeds, "num_seeds")
    if not config.baselines:
        raise ValueError("baselines is empty: give at least one baseline")
    for name in list(config.baselines) + [config.reference]:
        try:
            baselines.get(name)
        except ValueError as e:
            key = "reference" if name == config.reference else "baselines"
            raise ValueError(f"{key}: {e}") from None
    env_params(config.env, social=True)
    lc = config.llm
    if not lc.enabled:
        return
    _positive_int(lc.num_seeds, "llm.num_seeds")
    if lc.num_seeds > config.num_seeds:
        raise ValueError(f"llm.num_seeds={lc.num_seeds} > num_seeds={config.num_seeds}: the LLM "
                         "populations are the first llm.num_seeds of the baselines' seeds")
    for f in ("num_agents", "num_arms", "num_rounds"):
        _positive_int(getattr(lc, f), f"llm.{f}", lo=0)
    over = {f: getattr(lc, f) for f in ("num_agents", "num_arms", "num_rounds") if getattr(lc, f)}
    try:
        env_params(config.env, **over)
    except ValueError as e:
        raise ValueError(f"{e} (with the llm.* overrides {over})") from None
    for f in ("max_learn_tokens", "max_pull_tokens"):
        _positive_int(getattr(lc, f), f"llm.{f}")
    if not float(lc.temperature) >= 0:
        raise ValueError(f"llm.temperature={lc.temperature} must be >= 0")
    if not 0 < float(lc.top_p) <= 1:
        raise ValueError(f"llm.top_p={lc.top_p} must be in (0, 1]")
    if not lc.checkpoint:
        raise ValueError("llm.checkpoint is empty: give a Llama checkpoint directory or 'tiny'")


def _row(name: str, summary: dict, cmp: dict | None) -> dict:
    row = {
        "J_mean": summary["J"]["mean"], "J_sem": summary["J"]["sem"],
        "C_mean": summary["C"]["mean"],
        "distinct_arms": summary["distinct_arms"]["mean"],
        "distinct_arms_sem": summary["distinct_arms"]["sem"],
        "completion": summary["completion"]["mean"],
        "reward_per_token": summary["reward_per_token"]["mean"],
        "regret": summary["regret"]["mean"],
        "diversity": summary["diversity"]["mean"],
        "observe_rate": summary["observe_rate"]["mean"],
        "innovate_rate": summary["innovate_rate"]["mean"],
        "revise_rate": summary["revise_rate"]["mean"],
        "skip_rate": summary["skip_rate"]["mean"],
        "deployed_from_copy": summary["deployed_from_copy"]["mean"],
        "copied_beats_own": summary["copied_beats_own"]["mean"],
        "summary": summary,
    }
    if cmp is not None:
        row.update({"dJ_C": cmp["dJ_C"], "dJ_C_sem": cmp["dJ_C_sem"], "dJ_C_p": cmp["dJ_C_p"],
                    "dJ_final": cmp["dJ_final"], "dJ_final_sem": cmp["dJ_final_sem"],
                    "dJ_final_p": cmp["dJ_final_p"], "dJ_C_per_seed": cmp["per_seed"]})
    return row


def run_baselines(config) -> dict:
    """Every configured baseline over `num_seeds` matched seeds. -> {name: row dict}."""
    keys = jax.random.split(jax.random.key(config.seed), config.num_seeds)
    k = config.env.num_arms
    runs = {}
    for name in config.baselines:
        policy = baselines.get(name)
        params = env_params(config.env, social=(name != config.reference))
        runs[name] = sl.rollout_batch(keys, policy, params, fast_compile=config.fast_compile)
    if config.reference not in runs:
        ref = env_params(config.env, social=False)
        runs[config.reference] = sl.rollout_batch(keys, baselines.get(config.reference), ref,
                                                  fast_compile=config.fast_compile)
    solo_traj = runs[config.reference][1]
    rows = {}
    for name, (states, traj) in runs.items():
        summary = metrics.summarize(metrics.seed_metrics(states, traj, k))
        cmp = None if name == config.reference else metrics.compare(traj, solo_traj)
        rows[name] = _row(name, summary, cmp)
    return rows


def run_llm(config) -> dict:
    """LLM agents (social and solo populations of the same model). -> {name: row dict}."""
    from jaxsocial.envs import llm_agent

    lc = config.llm
    over = {f: getattr(lc, f) for f in ("num_agents", "num_arms", "num_rounds") if getattr(lc, f)}
    params = env_params(config.env, **over)
    if lc.num_seeds > config.num_seeds:
        raise ValueError(f"llm.num_seeds={lc.num_seeds} > num_seeds={config.num_seeds}: the LLM "
                         "populations are the first llm.num_seeds of the baselines' seeds")
    agent = llm_agent.LLMAgent.load(lc.checkpoint, llm_agent.LLMAgentConfig.from_config(lc))
    # The baselines' first seeds: without env overrides, the LLM populations play the same
    # worlds (arm means, forced-search schedule) as the baselines' first llm.num_seeds rows.
    keys = jax.random.split(jax.random.key(config.seed), config.num_seeds)[:lc.num_seeds]
    social = agent.run(keys, params.replace(social=True))
    solo = agent.run(keys, params.replace(social=False))
    rows = {}
    for name, res, ref in (("llm_social", social, solo), ("llm_solo", solo, None)):
        summary = metrics.summarize(metrics.seed_metrics(res.states, res.traj, params.num_arms))
        cmp = None if ref is None else metrics.compare(res.traj, ref.traj)
        row = _row(name, summary, cmp)
        pulls = lc.num_seeds * params.num_agents * params.num_rounds
        row.update(malformed_learn=res.malformed_learn, malformed_pull=res.malformed_pull,
                   truncated=res.truncated, asked_learn=res.asked_learn, asked_pull=pulls,
                   malformed_rate=(res.malformed_learn + res.malformed_pull)
                   / max(res.asked_learn + pulls, 1),
                   num_seeds=lc.num_seeds, num_rounds=params.num_rounds)
        rows[name] = row
    return rows


def _fmt(m, s=None, digits=2):
    if m is None or (isinstance(m, float) and math.isnan(m)):
        return "-"
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} +- {s:.{digits}f}"


def format_table(rows: dict, reference: str) -> str:
    head = f"{'policy':<22}{'J':>18}{'dJ(C*) vs solo':>20}{'p':>10}{'distinct':>10}{'complete':>10}"
    lines = [head, "-" * len(head)]
    for name, r in rows.items():
        dj = _fmt(r.get("dJ_C"), r.get("dJ_C_sem")) if "dJ_C" in r else "(reference)"
        p = r.get("dJ_C_p")
        ps = "-" if p is None or math.isnan(p) else (f"{p:.1e}" if p < 1e-3 else f"{p:.3f}")
        lines.append(f"{name:<22}{_fmt(r['J_mean'], r['J_sem']):>18}{dj:>20}{ps:>10}"
                     f"{r['distinct_arms']:>10.2f}{r['completion']:>10.3f}")
    lines.append(f"(dJ(C*): social minus solo at matched cumulative tokens, paired by seed, mean "
                 f"+- SEM; solo = {reference} in a solo population for the baselines, the same "
                 "model with observation disabled for LLM agents; p: two-sided one-sample t-test)")
    head = (f"{'policy':<22}{'C (tokens)':>12}{'skip':>7}{'innov':>7}{'revise':>7}{'observe':>8}"
            f"{'malformed':>11}")
    lines += ["", head, "-" * len(head)]
    for name, r in rows.items():
        bad = f"{r['malformed_rate']:.3f}" if "malformed_rate" in r else "-"
        lines.append(f"{name:<22}{r['C_mean']:>12,.0f}{r['skip_rate']:>7.2f}"
                     f"{r['innovate_rate']:>7.2f}{r['revise_rate']:>7.2f}{r['observe_rate']:>8.2f}"
                     f"{bad:>11}")
    lines.append("(C: population tokens per seed; action rates: shares of the performed learning "
                 "actions; malformed: share of LLM completions that did not parse, played as "
                 "skip / no pull)")
    return "\n".join(lines)


def run(config, workdir: str) -> dict:
    """Baselines (+ LLM agents if enabled); writes workdir/results.json; returns the results.
    The config is checked first (`check_config`)."""
    check_config(config)
    rows = run_baselines(config)
    if config.llm.enabled:
        rows.update(run_llm(config))
    results = {"config": config.to_dict(), "num_seeds": config.num_seeds,
               "reference": config.reference, "policies": rows}
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "results.json"), "w") as f:
        json.dump(cli.json_safe(results), f, indent=1)
    print(format_table(rows, config.reference))
    return results


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(_ROOT, "configs", "social_learning.py"),
    "Tournament config file (configs/social_learning.py[:variant]).", lock_config=True)
flags.DEFINE_string("workdir", "/tmp/social_learning", "where results.json goes")


def main(argv):
    """Run the tournament; a bad config is one line, `error: ...`, and exit status 1."""
    del argv
    try:
        run(_CONFIG.value, FLAGS.workdir)
    except (ValueError, OSError) as e:
        sys.stderr.write(f"error: {' '.join(str(e).split())}\n")
        sys.exit(1)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
