"""Metrics of the social-learning tournament (spec `social_learning.md`, "Metrics").

Per population (one seed) from a `RoundRecord` ([T, N] arrays) and the final `EnvState`:
J_t = sum_{s <= t} mean_i r_{s,i} (cumulative per-agent mean reward), C_t = cumulative
population tokens, reward per token, completion rate, regret, distinct independently discovered
arms, diversity, the learning-action mix (skip / innovate / revise / observe rates of the
performed actions), lineage shares. Across seeds: mean +- SEM and the paired social-advantage at
matched cost dJ(C*) with a one-sample Student t-test.

Everything is NumPy on host (metrics are computed once per run); the Student-t CDF uses
`jax.scipy.special.betainc`, so scipy is not needed.
"""
from __future__ import annotations

import math

import jax
import numpy as np
from jax.scipy.special import betainc

from jaxsocial.envs import social_learning as sl


def curves(traj: sl.RoundRecord) -> tuple[np.ndarray, np.ndarray]:
    """Cost/reward curves with the origin prepended.

    traj [..., T, N] -> (C [..., T+1], J [..., T+1]) with

    J_t = sum_{s<=t} mean_i r_{s,i};  C_t = sum_{s<=t} sum_i tokens_{s,i}.
    """
    r = np.asarray(traj.reward, np.float64).mean(-1)
    c = np.asarray(traj.tokens, np.float64).sum(-1)
    zero = np.zeros(r.shape[:-1] + (1,))
    return (np.concatenate([zero, np.cumsum(c, -1)], -1),
            np.concatenate([zero, np.cumsum(r, -1)], -1))


def reward_at_cost(cost: np.ndarray, reward: np.ndarray, c_star: float) -> float:
    """J(C*) on one curve: linear interpolation of reward against cumulative cost.

    cost [T+1] non-decreasing from 0, reward [T+1]. Where the curve is flat in cost (rounds that
    spent no tokens) J(C) is the LAST reward reached at that cost (all reward obtainable without
    spending more). Beyond the last cost: the final reward.
    """
    cost = np.asarray(cost, np.float64)
    reward = np.asarray(reward, np.float64)
    if cost.ndim != 1 or cost.shape != reward.shape:
        raise ValueError(f"cost and reward must be equal 1-D curves, got {cost.shape} and "
                         f"{reward.shape}")
    if np.any(np.diff(cost) < 0):
        raise ValueError("cost curve must be non-decreasing")
    i = int(np.searchsorted(cost, c_star, side="right")) - 1  # last point with cost <= C*
    if i < 0:
        return float(reward[0])
    if i == len(cost) - 1 or cost[i] == c_star:
        return float(reward[i])
    frac = (c_star - cost[i]) / (cost[i + 1] - cost[i])
    return float(reward[i] + frac * (reward[i + 1] - reward[i]))


def matched_cost_advantage(social: sl.RoundRecord, solo: sl.RoundRecord) -> np.ndarray:
    """dJ(C*) per seed [S]: C* = min(final C social, final C solo), J's interpolated at C*.

    social, solo: trajectories with leading seed axis [S, T, N], paired by seed.
    """
    cs, js = curves(social)
    co, jo = curves(solo)
    if cs.shape != co.shape:
        raise ValueError(f"paired trajectories differ in shape: {cs.shape} vs {co.shape}")
    out = []
    for s in range(cs.shape[0]):
        c_star = min(cs[s, -1], co[s, -1])
        out.append(reward_at_cost(cs[s], js[s], c_star) - reward_at_cost(co[s], jo[s], c_star))
    return np.asarray(out)


def student_t_sf2(t: float, df: float) -> float:
    """Two-sided p-value P(|T| >= |t|), T ~ Student t(df): I_{df/(df+t^2)}(df/2, 1/2)."""
    if df <= 0:
        raise ValueError(f"df must be > 0, got {df}")
    if not math.isfinite(t):
        return 0.0 if not math.isnan(t) else float("nan")
    x = df / (df + t * t)
    return float(betainc(df / 2.0, 0.5, x))


def mean_sem(x) -> tuple[float, float]:
    """(mean, standard error = std(ddof=1)/sqrt(n)); SEM is nan for n < 2."""
    x = np.asarray(x, np.float64)
    if x.size < 2:
        return float(x.mean()) if x.size else float("nan"), float("nan")
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size))


def one_sample_ttest(x) -> tuple[float, float]:
    """(t, two-sided p) for H0: mean(x) = 0. t = mean / SEM with n-1 degrees of freedom."""
    x = np.asarray(x, np.float64)
    m, se = mean_sem(x)
    if x.size < 2:
        return float("nan"), float("nan")
    if se == 0:
        return (0.0, 1.0) if m == 0 else (math.copysign(math.inf, m), 0.0)
    t = m / se
    return t, student_t_sf2(t, x.size - 1)


def _exp_entropy(counts: np.ndarray) -> float:
    tot = counts.sum()
    if tot == 0:
        return 0.0
    p = counts[counts > 0] / tot
    return float(np.exp(-(p * np.log(p)).sum()))


def population_metrics(state: sl.EnvState, traj: sl.RoundRecord, num_arms: int) -> dict:
    """Scalar metrics of ONE population (no seed axis). See module doc."""
    reward = np.asarray(traj.reward, np.float64)
    tokens = np.asarray(traj.tokens, np.float64)
    pulled = np.asarray(traj.pulled)
    arms = np.asarray(traj.arm)
    kinds = np.asarray(traj.learn_kind)
    origin = np.asarray(state.origin)
    independent = (origin == sl.ORIGIN_INNOVATED) | (origin == sl.ORIGIN_REVISED) | (
        origin == sl.ORIGIN_MISCOPIED)
    total_tokens = tokens.sum()
    counts = np.bincount(arms[pulled].ravel(), minlength=num_arms)
    last = pulled[-1]
    copied = np.asarray(traj.copied_pull)
    roots = np.asarray(traj.deployed_root)[-1][last]
    return dict(
        J=float(reward.mean(-1).sum()),
        C=float(total_tokens),
        reward_per_token=float(reward.sum() / total_tokens) if total_tokens > 0 else float("nan"),
        completion=float(pulled.mean()),
        regret=float(np.asarray(traj.regret, np.float64).mean(-1).sum()),
        distinct_arms=int(independent.any(0).sum()),
        known_arms=int(np.asarray(state.known).any(0).sum()),
        diversity=_exp_entropy(counts),
        final_diversity=_exp_entropy(np.bincount(arms[-1][last], minlength=num_arms)),
        observe_rate=float((kinds == sl.OBSERVE).mean()),
        innovate_rate=float((kinds == sl.INNOVATE).mean()),
        revise_rate=float((kinds == sl.REVISE).mean()),
        skip_rate=float((kinds == sl.SKIP).mean()),
        deployed_from_copy=float(np.asarray(traj.deployed_via_copy)[-1][last].mean())
        if last.any() else float("nan"),
        founding_lineages=int(len(np.unique(roots))) if last.any() else 0,
        copied_pulls=int(copied.sum()),
        copied_beats_own=float(np.asarray(traj.copied_beats_own).sum() / copied.sum())
        if copied.sum() else float("nan"),
        invalid_learn=int(np.asarray(traj.learn_invalid).sum()),
    )


def _index(tree, i):
    return jax.tree.map(lambda x: np.asarray(x)[i], tree)


def seed_metrics(states: sl.EnvState, trajs: sl.RoundRecord, num_arms: int) -> list[dict]:
    """`population_metrics` for every seed of a batched rollout (leading axis S)."""
    n = np.asarray(trajs.reward).shape[0]
    return [population_metrics(_index(states, i), _index(trajs, i), num_arms) for i in range(n)]


def summarize(per_seed: list[dict]) -> dict:
    """{metric: {"mean", "sem"}} over seeds (nan-aware: nan seeds are dropped)."""
    out = {}
    for k in per_seed[0]:
        x = np.asarray([d[k] for d in per_seed], np.float64)
        x = x[~np.isnan(x)]
        m, se = mean_sem(x) if x.size else (float("nan"), float("nan"))
        out[k] = {"mean": m, "sem": se}
    return out


def compare(social: sl.RoundRecord, solo: sl.RoundRecord) -> dict:
    """Paired social-vs-solo comparison over seeds.

    -> {"dJ_C": mean, "dJ_C_sem", "dJ_C_t", "dJ_C_p", "dJ_final": mean, "dJ_final_sem",
        "dJ_final_p", "per_seed": [...]}; dJ(C*) at matched cost, dJ_final at the last round.
    """
    d = matched_cost_advantage(social, solo)
    _, js = curves(social)
    _, jo = curves(solo)
    dfin = js[:, -1] - jo[:, -1]
    m, se = mean_sem(d)
    t, p = one_sample_ttest(d)
    mf, sef = mean_sem(dfin)
    _, pf = one_sample_ttest(dfin)
    return {"dJ_C": m, "dJ_C_sem": se, "dJ_C_t": t, "dJ_C_p": p, "dJ_final": mf,
            "dJ_final_sem": sef, "dJ_final_p": pf, "per_seed": d.tolist()}
