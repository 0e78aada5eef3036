"""Seeds x arms studies of a training config: per-run thirds, per-arm statistics, the table.

`launch/study.py` runs `launch/train.py` once per (arm, seed) and hands the runs'
metrics.jsonl records to these functions:

    runs = {arm: {seed: study.read_metrics(f"{workdir}/{arm}-seed{seed}/metrics.jsonl")}}
    result = study.analyze(runs, control="control")
    text = study.markdown(result, command)      # the table the docs paste
    study.plot(result, "study.png")             # per-epoch curves of every arm

A run's number for a metric is the mean of its per-epoch values over the first third of its
epochs (`third`: floor(E/3) epochs, at least 1), over the last third, and their change
(last - first). Seeds are the independent samples: an arm's mean and 95% confidence interval
are over its seeds (t-distribution, n - 1 degrees of freedom; one seed has no interval). An arm
is compared with the control arm by the difference of their mean changes, with Welch's 95%
interval (Welch-Satterthwaite degrees of freedom) and Welch's t-test p-value.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from scipy import stats

# Per-epoch metrics of a study, in table order: the blog's four numbers, then total likes
# (avg_likes_per_post * total_posts), the crowd's interest similarity and the share of answers
# that did nothing.
METRICS = ("avg_likes_per_post", "zero_like_share", "positive_engagement_share", "total_posts",
           "total_likes", "crowd_interest_sim", "do_nothing_share")
# A cohort study's table (`cohort_runs`) adds each cohort's share of all the cohorts' likes,
# how far its posts' topics are from the other cohorts' and its posts' length.
COHORT_METRICS = METRICS + ("likes_share", "topic_distance", "post_words")
LABELS = {"avg_likes_per_post": "likes/post", "zero_like_share": "zero-like share",
          "positive_engagement_share": "engaged share", "total_posts": "posts",
          "total_likes": "total likes", "crowd_interest_sim": "crowd interest sim",
          "do_nothing_share": "do_nothing share", "likes_share": "share of likes",
          "topic_distance": "topic distance to the others", "post_words": "words per post"}
LEVEL = 0.95
POSTS_KEPT = 0.8  # learning criterion: last-third posts >= 80% of the first third's
CONTROL = "control"

_ARM_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_KEY = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
# A comma starts the next override only when `key=` follows it, so a value may hold commas
# (a tuple such as `crowd_text.topics=('cooking', 'travel')`).
_NEXT_OVERRIDE = re.compile(r",\s*(?=[A-Za-z_][\w.]*=)")


def parse_arm(spec: str) -> Tuple[str, List[Tuple[str, str]]]:
    """`NAME:key=value,key=value` -> (NAME, [(key, value), ...]); `NAME:` is the config as
    given. The values stay strings: train.py's config flags parse them. Raises ValueError."""
    usage = f"--arm={spec!r}: expected NAME:key=value[,key=value...]"
    name, sep, rest = spec.partition(":")
    if not sep or not _ARM_NAME.fullmatch(name):
        raise ValueError(f"{usage} (NAME: letters, digits, '_', '-', '.')")
    pairs = []
    for item in _NEXT_OVERRIDE.split(rest) if rest.strip() else []:
        key, eq, value = item.strip().partition("=")
        if not eq or not _KEY.fullmatch(key):
            raise ValueError(f"{usage}; {item.strip()!r} is not key=value with a config key")
        pairs.append((key, value))
    return name, pairs


def read_metrics(path: str) -> List[dict]:
    """The records of a metrics.jsonl, one per epoch in epoch order (a repeated epoch keeps its
    last record; a torn last line, left by a killed run, is ignored). [] if there is no file."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    by_epoch = {}
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}: line {i + 1} is not JSON") from None
        by_epoch[int(record["epoch"])] = record
    return [by_epoch[e] for e in sorted(by_epoch)]


def _num(x) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def epoch_values(record: dict, metrics: Sequence[str] = METRICS) -> Dict[str, float]:
    """The study's metrics of one metrics.jsonl record (NaN where the record lacks one)."""
    out = {k: _num(record.get(k)) for k in metrics}
    posts = out["total_posts"]
    out["total_likes"] = 0.0 if posts == 0 else out["avg_likes_per_post"] * posts
    mix = record.get("action_mix")
    if isinstance(mix, dict):
        answers = _num(record.get("interactions"))
        if not answers > 0:
            answers = float(sum(_num(v) for v in mix.values()))
        nothing = _num(mix.get("do_nothing", 0))
        out["do_nothing_share"] = nothing / answers if answers > 0 else math.nan
    return out


def cohort_runs(runs: Dict[str, Dict[int, Sequence[dict]]]) -> Dict[str, Dict[int, List[dict]]]:
    """A cohort study (`agents.cohorts`): {arm: {seed: records}} -> {cohort: {seed: records}}
    ("arm/cohort" when there are several arms), each record the cohort's own metrics
    (`train.host.cohort_metrics`) with `likes_share`, its total likes over all cohorts' (NaN in
    an epoch without likes); `topic_distance`, the total variation distance between its posts'
    topic shares and the other cohorts' posts' pooled (by posts); and `post_words`, its posts'
    mean length (`drift.mean_post_words`). Analyse with `metrics=COHORT_METRICS` and
    `pair_seeds=True`: the cohorts of one run share a society."""
    out: Dict[str, Dict[int, List[dict]]] = {}
    for arm, by_seed in runs.items():
        for seed, records in by_seed.items():
            for r in records:
                cohorts = r.get("cohorts")
                if not isinstance(cohorts, dict):
                    raise ValueError(f"arm {arm!r} seed {seed}: epoch {r.get('epoch')} has no "
                                     f"per-cohort metrics (not a run with agents.cohorts)")
                total = sum(float(c.get("total_likes", 0)) for c in cohorts.values())
                for name, c in cohorts.items():
                    key = name if len(runs) == 1 else f"{arm}/{name}"
                    rec = dict(c, likes_share=(float(c.get("total_likes", 0)) / total
                                               if total > 0 else math.nan),
                               topic_distance=_topic_distance(name, cohorts),
                               post_words=_num((c.get("drift") or {}).get("mean_post_words")))
                    out.setdefault(key, {}).setdefault(seed, []).append(rec)
    return out


def _topic_distance(name: str, cohorts: Dict[str, dict]) -> float:
    """Total variation distance between cohort `name`'s topic shares and the other cohorts'
    pooled by their posts (NaN when either side has no posts)."""
    def shares(cs):
        total: Dict[str, float] = {}
        n = 0.0
        for c in cs:
            posts = float(c.get("total_posts", 0) or 0)
            for topic, share in (c.get("topic_share") or {}).items():
                total[topic] = total.get(topic, 0.0) + posts * float(share)
            n += posts
        return {t: v / n for t, v in total.items()} if n > 0 else None
    mine = shares([cohorts[name]])
    rest = shares([c for k, c in cohorts.items() if k != name])
    if not mine or not rest:
        return math.nan
    return 0.5 * sum(abs(mine.get(t, 0.0) - rest.get(t, 0.0)) for t in set(mine) | set(rest))


def third(n_epochs: int) -> int:
    """Epochs in a third of a run: floor(E / 3), at least 1."""
    return max(1, n_epochs // 3)


def run_summary(records: Sequence[dict], metrics: Sequence[str] = METRICS) -> dict:
    """One run: its per-epoch curves and, per metric, the mean over the first third of epochs,
    over the last third and the change (last - first)."""
    if not records:
        raise ValueError("a run without epochs")
    values = [epoch_values(r, metrics) for r in records]
    k = third(len(values))
    curves = {m: [v[m] for v in values] for m in metrics}
    first = {m: float(np.mean(c[:k])) for m, c in curves.items()}
    last = {m: float(np.mean(c[-k:])) for m, c in curves.items()}
    return {"epochs": len(values), "third": k, "curves": curves, "first": first, "last": last,
            "change": {m: last[m] - first[m] for m in metrics}}


def _finite(values) -> np.ndarray:
    a = np.asarray(values, float)
    return a[np.isfinite(a)]


def mean_ci(values, level: float = LEVEL) -> dict:
    """{"mean", "ci", "n"}: the mean of the finite values and the half-width of its confidence
    interval, t_{(1+level)/2, n-1} * s / sqrt(n) (s: sample standard deviation). One value has
    no interval (NaN), nor has none (mean NaN too)."""
    a = _finite(values)
    n = len(a)
    mean = float(a.mean()) if n else math.nan
    if n < 2:
        return {"mean": mean, "ci": math.nan, "n": n}
    half = stats.t.ppf((1 + level) / 2, n - 1) * a.std(ddof=1) / math.sqrt(n)
    return {"mean": mean, "ci": float(half), "n": n}


def welch(a, b, level: float = LEVEL) -> dict:
    """mean(a) - mean(b) with Welch's interval and t-test (unequal variances).

    {"diff", "ci", "dof", "p"}: ci = t_{(1+level)/2, dof} * se with se^2 = s_a^2/n_a + s_b^2/n_b
    and the Welch-Satterthwaite dof = se^4 / ((s_a^2/n_a)^2/(n_a-1) + (s_b^2/n_b)^2/(n_b-1));
    p: scipy.stats.ttest_ind(a, b, equal_var=False). NaN where it is undefined (fewer than two
    values in a group, or no variance in either)."""
    a, b = _finite(a), _finite(b)
    diff = float(a.mean() - b.mean()) if len(a) and len(b) else math.nan
    out = {"diff": diff, "ci": math.nan, "dof": math.nan, "p": math.nan}
    if len(a) < 2 or len(b) < 2:
        return out
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    if va + vb == 0:
        return out
    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    out["dof"] = float(dof)
    out["ci"] = float(stats.t.ppf((1 + level) / 2, dof) * math.sqrt(va + vb))
    with warnings.catch_warnings():  # scipy warns when one group's values are all equal
        warnings.simplefilter("ignore", RuntimeWarning)
        out["p"] = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    return out


def paired(a: Dict[int, float], b: Dict[int, float], level: float = LEVEL) -> dict:
    """mean over the seeds both have of a[seed] - b[seed], with the t interval of that mean and
    the paired t-test (scipy.stats.ttest_1samp of the differences against 0): the comparison of
    two cohorts of the same runs, which share a society per seed. {"diff", "ci", "dof", "p"};
    NaN where it is undefined (fewer than two seeds, or no variance)."""
    d = _finite([a[s] - b[s] for s in sorted(set(a) & set(b))])
    m = mean_ci(d, level)
    out = {"diff": m["mean"], "ci": m["ci"], "dof": float(len(d) - 1) if len(d) > 1 else math.nan,
           "p": math.nan}
    if len(d) >= 2 and d.std(ddof=1) > 0:
        out["p"] = float(stats.ttest_1samp(d, 0.0).pvalue)
    return out


def arm_stats(summaries: Sequence[dict], level: float = LEVEL,
              metrics: Sequence[str] = METRICS) -> dict:
    """{metric: {"first"|"last"|"change": mean_ci over the runs}} of one arm's run summaries."""
    return {m: {part: mean_ci([s[part][m] for s in summaries], level)
                for part in ("first", "last", "change")} for m in metrics}


def _verdict(name: str, label: str, ok: float, per_seed: Sequence[float]) -> dict:
    """A criterion: `ok` on the arm means (NaN: undecidable), and per seed."""
    decided = [x for x in per_seed if not math.isnan(x)]
    return {"name": name, "label": label, "ok": None if math.isnan(ok) else bool(ok),
            "seeds_ok": int(sum(decided)), "seeds": len(decided)}


def _cmp(x: float, y: float, op) -> float:
    """op(x, y) as 1.0 / 0.0, NaN when either is NaN."""
    return math.nan if math.isnan(x) or math.isnan(y) else float(op(x, y))


def criteria(runs: Dict[int, dict], control: Optional[Dict[int, dict]] = None) -> List[dict]:
    """The learning criteria of one arm ({seed: run_summary}), each decided on the arm means
    and counted over seeds: likes/post up, total likes up, posts kept (last third >= 80% of the
    first's), crowd_interest_sim up more than in `control` (per seed: than the control run of
    the same seed). Without a control the last is undecided (ok None, 0 seeds)."""
    seeds = sorted(runs)

    def col(part, m, rs=runs, ss=seeds):
        return [rs[s][part][m] for s in ss]

    def mean(xs):
        a = _finite(xs)
        return float(a.mean()) if len(a) else math.nan

    gt = float.__gt__
    out = [
        _verdict("likes_per_post_up", "likes/post up",
                 _cmp(mean(col("change", "avg_likes_per_post")), 0.0, gt),
                 [_cmp(x, 0.0, gt) for x in col("change", "avg_likes_per_post")]),
        _verdict("total_likes_up", "total likes up",
                 _cmp(mean(col("change", "total_likes")), 0.0, gt),
                 [_cmp(x, 0.0, gt) for x in col("change", "total_likes")]),
        _verdict("posts_kept", f"posts in the last third >= {POSTS_KEPT:.0%} of the first's",
                 _cmp(mean(col("last", "total_posts")),
                      POSTS_KEPT * mean(col("first", "total_posts")), float.__ge__),
                 [_cmp(b, POSTS_KEPT * a, float.__ge__) for a, b in
                  zip(col("first", "total_posts"), col("last", "total_posts"))])]
    label = "crowd_interest_sim up more than in control"
    if control is None:
        out.append(_verdict("crowd_sim_beats_control", label, math.nan, []))
        return out
    paired = [s for s in seeds if s in control]
    out.append(_verdict(
        "crowd_sim_beats_control", label,
        _cmp(mean(col("change", "crowd_interest_sim")),
             mean([c["change"]["crowd_interest_sim"] for c in control.values()]), gt),
        [_cmp(runs[s]["change"]["crowd_interest_sim"],
              control[s]["change"]["crowd_interest_sim"], gt) for s in paired]))
    return out


def analyze(runs: Dict[str, Dict[int, Sequence[dict]]], control: Optional[str] = CONTROL,
            level: float = LEVEL, metrics: Sequence[str] = METRICS,
            pair_seeds: bool = False) -> dict:
    """The study of {arm: {seed: metrics records}}: per-run summaries, per-arm statistics,
    every other arm vs the `control` arm (when it is one of the arms) and the criteria.
    pair_seeds: compare by the per-seed differences (`paired`: the arms are cohorts of the
    same runs), not by Welch's test of independent groups."""
    metrics = tuple(metrics)
    summaries = {arm: {s: run_summary(recs, metrics) for s, recs in sorted(by_seed.items())}
                 for arm, by_seed in runs.items()}
    control = control if control in summaries else None
    ctrl = summaries.get(control) if control else None
    result = {"arms": list(summaries), "control": control, "level": level, "metrics": metrics,
              "paired": bool(pair_seeds), "runs": summaries, "stats": {}, "comparisons": {},
              "criteria": {}}
    for arm, by_seed in summaries.items():
        result["stats"][arm] = arm_stats(list(by_seed.values()), level, metrics)
        result["criteria"][arm] = criteria(by_seed, ctrl if arm != control else None)
        if ctrl is not None and arm != control and pair_seeds:
            result["comparisons"][arm] = {
                m: paired({s: r["change"][m] for s, r in by_seed.items()},
                          {s: r["change"][m] for s, r in ctrl.items()}, level) for m in metrics}
        elif ctrl is not None and arm != control:
            result["comparisons"][arm] = {
                m: welch([r["change"][m] for r in by_seed.values()],
                         [r["change"][m] for r in ctrl.values()], level) for m in metrics}
    return result


def fmt(x: float, signed: bool = False) -> str:
    """A table number: 'n/a' for NaN/None, else as many decimals as its size needs."""
    if x is None or math.isnan(x):
        return "n/a"
    size = abs(x)
    digits = 0 if size >= 100 else 1 if size >= 10 else 2 if size >= 1 else 3
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def fmt_p(p: float) -> str:
    """A p-value: 'n/a', '<0.001' or three decimals."""
    if p is None or math.isnan(p):
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _arm_cell(st: dict) -> str:
    change = st["change"]
    return (f"{fmt(st['first']['mean'])} -> {fmt(st['last']['mean'])} "
            f"({fmt(change['mean'], True)} ± {fmt(change['ci'])})")


def _criteria_line(arm: str, verdicts: Sequence[dict]) -> str:
    parts = []
    for v in verdicts:
        ok = "n/a" if v["ok"] is None else "yes" if v["ok"] else "no"
        seeds = f" ({v['seeds_ok']}/{v['seeds']} seeds)" if v["seeds"] else ""
        parts.append(f"{v['label']}: {ok}{seeds}")
    return f"- **{arm}**: " + "; ".join(parts)


def _design_line(result: dict) -> str:
    """Seeds, epochs and thirds of the study, in one sentence."""
    runs = [r for by_seed in result["runs"].values() for r in by_seed.values()]
    seeds = sorted({s for by_seed in result["runs"].values() for s in by_seed})
    epochs = sorted({r["epochs"] for r in runs})
    thirds = sorted({r["third"] for r in runs})
    pct = f"{result['level']:.0%}"
    text = (f"{len(seeds)} seed(s) per arm ({', '.join(map(str, seeds))}), "
            f"{'/'.join(map(str, epochs))} epochs; first/last = mean over the first/last "
            f"{'/'.join(map(str, thirds))} epoch(s); mean over seeds, ± = {pct} CI "
            f"(t, n-1 dof; n/a with one seed)")
    if result["control"] and result.get("paired"):
        text += (f"; arm - {result['control']}: mean over seeds of the per-seed difference of "
                 f"the changes (the cohorts share each seed's society), {pct} CI (t, n-1 dof) "
                 f"and paired t-test p")
    elif result["control"]:
        text += (f"; arm - {result['control']}: difference of the mean changes, Welch {pct} CI "
                 f"and t-test p")
    return text + "."


def markdown(result: dict, command: Optional[str] = None) -> str:
    """The study as Markdown: a table (rows: metrics; columns: each arm's first -> last
    (change ± CI), then each arm - control ± CI and p), the criteria lines, the command."""
    arms, control = result["arms"], result["control"]
    compared = [a for a in arms if a in result["comparisons"]]
    header = ["metric"] + [f"{a}: first -> last (change ± CI)" for a in arms]
    for a in compared:
        header += [f"{a} - {control} (± CI)", f"p ({a})"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for m in result.get("metrics", METRICS):
        row = [LABELS[m]] + [_arm_cell(result["stats"][a][m]) for a in arms]
        for a in compared:
            c = result["comparisons"][a][m]
            row += [f"{fmt(c['diff'], True)} ± {fmt(c['ci'])}", fmt_p(c["p"])]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", _design_line(result), "", "Learning criteria (on the arm means; seeds that "
              "meet each):", ""]
    lines += [_criteria_line(a, result["criteria"][a]) for a in arms]
    if command:
        lines += ["", "```", command, "```"]
    return "\n".join(lines) + "\n"


FAILURE_KINDS = ("no_json", "unknown_action", "bad_argument")  # agents.tool_calls' kinds


def failure_shares(record: dict) -> Dict[str, float]:
    """Shares of an epoch's answers that failed to parse: "failed" (all of them; free and
    tool_call modes) and, in tool_call mode, one per kind of `FAILURE_KINDS`. {} where the
    record counts no parse failures (constrained mode)."""
    answers = _num(record.get("interactions"))
    if "parse_failures" not in record or not answers > 0:
        return {}
    out = {"failed": _num(record["parse_failures"]) / answers}
    for kind, n in (record.get("parse_failures_by_kind") or {}).items():
        out[kind] = _num(n) / answers
    return out


def failures(runs: Dict[str, Dict[int, Sequence[dict]]], level: float = LEVEL) -> dict:
    """Parse failures of {arm: {seed: metrics records}}: {arm: {"kinds", "curves" {kind:
    [epochs] mean over seeds}, "change" {kind: mean_ci of (last third - first third) over
    seeds}, "rose" {kind: seeds whose share rose}, "seeds"}} for the arms whose runs count
    failures; {} when none does."""
    out = {}
    for arm, by_seed in runs.items():
        shares = {s: [failure_shares(r) for r in recs] for s, recs in sorted(by_seed.items())}
        if not shares or not all(v and all(v) for v in shares.values()):
            continue
        kinds = [k for k in ("failed",) + FAILURE_KINDS
                 if all(k in e for v in shares.values() for e in v)]
        n_ep = min(len(v) for v in shares.values())
        k3 = third(n_ep)
        change = {k: [float(np.mean([e[k] for e in v[n_ep - k3:n_ep]])
                            - np.mean([e[k] for e in v[:k3]])) for v in shares.values()]
                  for k in kinds}
        out[arm] = {"kinds": kinds, "seeds": len(shares), "third": k3,
                    "curves": {k: [float(np.mean([v[e][k] for v in shares.values()]))
                                   for e in range(n_ep)] for k in kinds},
                    "change": {k: mean_ci(c, level) for k, c in change.items()},
                    "rose": {k: int(sum(x > 0 for x in c)) for k, c in change.items()}}
    return out


def failures_markdown(result: dict) -> str:
    """`failures` as Markdown: per arm, a row per epoch (each kind's share of the answers,
    mean over seeds) and the change from the first third of epochs to the last (± CI, seeds
    in which it rose). "" when no arm counts failures."""
    lines = []
    for arm, f in result.items():
        kinds = f["kinds"]
        lines += [f"Parse failures, {arm} ({f['seeds']} seeds; share of answers, mean over "
                  f"seeds):", "", "| epoch | " + " | ".join(kinds) + " |",
                  "|" + "---|" * (len(kinds) + 1)]
        for e in range(len(f["curves"][kinds[0]])):
            lines.append(f"| {e + 1} | " + " | ".join(fmt(f["curves"][k][e]) for k in kinds)
                         + " |")
        lines.append(f"| last {f['third']} - first {f['third']} | " + " | ".join(
            f"{fmt(f['change'][k]['mean'], True)} ± {fmt(f['change'][k]['ci'])} "
            f"(rose in {f['rose'][k]}/{f['seeds']})" for k in kinds) + " |")
        lines.append("")
    return "\n".join(lines)


def _arm_curves(by_seed: Dict[int, dict], metric: str) -> np.ndarray:
    """[seeds, epochs] of one metric, NaN-padded where runs have fewer epochs."""
    rows = [r["curves"][metric] for r in by_seed.values()]
    out = np.full((len(rows), max(len(r) for r in rows)), np.nan)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def plot(result: dict, path: str, cols: int = 4) -> bool:
    """One panel per metric: each arm's per-epoch mean over seeds and its min..max band, one
    colour per arm; saved as a PNG at `path`. False (nothing written) without matplotlib."""
    try:
        from matplotlib.figure import Figure  # optional dependency: the notebook extra
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return False
    metrics = result.get("metrics", METRICS)
    rows = math.ceil(len(metrics) / cols)
    fig = Figure(figsize=(4 * cols, 3.2 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, m in zip(axes, metrics):
        for i, (arm, by_seed) in enumerate(result["runs"].items()):
            c = _arm_curves(by_seed, m)
            if not np.isfinite(c).any():
                continue
            x = np.arange(1, c.shape[1] + 1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # an epoch no seed reached
                mean, lo, hi = np.nanmean(c, 0), np.nanmin(c, 0), np.nanmax(c, 0)
            ax.plot(x, mean, marker="o", ms=3, color=f"C{i}", label=f"{arm} (n={len(c)})")
            ax.fill_between(x, lo, hi, color=f"C{i}", alpha=0.2, linewidth=0)
        ax.set(title=LABELS[m], xlabel="epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[len(metrics):]:
        ax.set_visible(False)
    axes[0].legend(fontsize="small", title="mean, band: min..max over seeds",
                   title_fontsize="x-small")
    fig.savefig(path, dpi=110)
    return True

