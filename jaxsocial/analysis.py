"""Analysis of a training run's files (metrics.jsonl, samples.jsonl): tables and plots.

The notebook `notebooks/analyze_run.ipynb` is a thin shell over these functions:

    run = analysis.load_run(analysis.resolve_workdir())   # $JAXSOCIAL_WORKDIR or runs/demo
    analysis.summary_table(run)            # before/after like the blog
    analysis.plot_run(run, "run.png")      # likes distribution, zero-like share, reward curves
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Tuple

import numpy as np

WORKDIR_ENV = "JAXSOCIAL_WORKDIR"
DEFAULT_WORKDIR = os.path.join("runs", "demo")


def repo_root() -> str:
    """The checkout this package was installed from (editable install), else the current
    directory: where the README's commands run."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return here if os.path.exists(os.path.join(here, "setup.py")) else os.getcwd()


def resolve_workdir(workdir: Optional[str] = None) -> str:
    """The run directory to analyze: `workdir`, else $JAXSOCIAL_WORKDIR, else runs/demo.

    Jupyter runs a notebook's kernel in the notebook's own folder, so a relative path is looked
    up where the user typed the command ($PWD, which the kernel inherits), then in the
    repository root (where the README's commands run), then in the current directory; the
    first that holds a metrics.jsonl wins, else the repository-root path is returned (and
    `load_run` names it in its error)."""
    workdir = workdir or os.environ.get(WORKDIR_ENV) or DEFAULT_WORKDIR
    if os.path.isabs(workdir):
        return workdir
    bases = [b for b in (os.environ.get("PWD"), repo_root(), os.getcwd()) if b]
    for base in bases:
        if os.path.exists(os.path.join(base, workdir, "metrics.jsonl")):
            return os.path.join(base, workdir)
    return os.path.join(repo_root(), workdir)


def _read_jsonl(path: str) -> List[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_run(workdir: str) -> Dict[str, List[dict]]:
    """{'metrics': [...per epoch...], 'samples': [...]} of a run directory.

    Raises FileNotFoundError naming the file when metrics.jsonl is missing."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no metrics.jsonl in {workdir!r} (is it a launch/train.py "
                                f"workdir?)")
    metrics = sorted(_read_jsonl(path), key=lambda r: r["epoch"])
    return {"metrics": metrics, "samples": _read_jsonl(os.path.join(workdir, "samples.jsonl"))}


def curves(run: Dict[str, List[dict]]) -> Dict[str, np.ndarray]:
    """Per-epoch arrays: epoch, avg_likes_per_post, zero_like_share, positive_engagement_share,
    total_posts, reward_mean, reward_std, parse_failures."""
    keys = ("epoch", "avg_likes_per_post", "zero_like_share", "positive_engagement_share",
            "total_posts", "reward_mean", "reward_std", "parse_failures")
    return {k: np.asarray([r.get(k, np.nan) for r in run["metrics"]], float) for k in keys}


def likes_distribution(run: Dict[str, List[dict]], max_likes: Optional[int] = None) -> np.ndarray:
    """[epochs, max_likes + 1] share of the epoch's posts with exactly k likes (from likes_hist;
    the last column also holds every post with more likes)."""
    hists = [r.get("likes_hist") or [0] for r in run["metrics"]]
    width = max_likes + 1 if max_likes is not None else max(len(h) for h in hists)
    out = np.zeros((len(hists), width))
    for i, h in enumerate(hists):
        h = np.asarray(h, float)
        out[i, :min(len(h), width)] = h[:width]
        if len(h) > width:
            out[i, -1] += h[width:].sum()
        total = out[i].sum()
        if total:
            out[i] /= total
    return out


def cascade_ccdf(run: Dict[str, List[dict]], epoch: Optional[int] = None
                 ) -> Tuple[np.ndarray, np.ndarray]:
    """(sizes [k], share [k]): the share of the society's original posts whose cascade
    (reposts + quotes, `social.cascades`) has at least that size, for sizes >= 1, at the end of
    `epoch` (default: the last epoch that recorded cascades). Empty arrays when none did."""
    rows = [r for r in run["metrics"] if (r.get("cascades") or {}).get("size_hist")]
    if epoch is not None:
        rows = [r for r in rows if r["epoch"] == epoch]
    if not rows:
        return np.zeros(0), np.zeros(0)
    hist = np.asarray(rows[-1]["cascades"]["size_hist"], float)
    at_least = hist[::-1].cumsum()[::-1] / hist.sum()
    sizes = np.arange(len(hist))
    keep = (sizes >= 1) & (hist > 0)  # the sizes that occur, where a log-log plot has a point
    return sizes[keep], at_least[keep]


def summary_table(run: Dict[str, List[dict]]) -> str:
    """First vs last epoch for the blog's statistics."""
    c = curves(run)
    if not len(c["epoch"]):
        return "no epochs"
    rows = [("metric", f"epoch {int(c['epoch'][0])}", f"epoch {int(c['epoch'][-1])}", "change")]
    for k in ("avg_likes_per_post", "zero_like_share", "positive_engagement_share",
              "total_posts", "reward_mean"):
        a, b = c[k][0], c[k][-1]
        rows.append((k, f"{a:.4f}", f"{b:.4f}", f"{b - a:+.4f}"))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(f"{x:>{w[i]}}" if i else f"{x:<{w[i]}}" for i, x in enumerate(r))
                     for r in rows)


def plot_run(run: Dict[str, List[dict]], path: Optional[str] = None):
    """Three panels: likes distribution per epoch, zero-like share, reward mean +- std.
    Saves a PNG at `path` when given. Needs matplotlib (`pip install -e '.[notebook]'`);
    returns the figure."""
    try:
        import matplotlib.pyplot as plt  # optional dependency (plots only)
    except ImportError as e:
        raise ImportError("plot_run needs matplotlib: pip install -e '.[notebook]'") from e
    c = curves(run)
    dist = likes_distribution(run, max_likes=10)
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    im = ax[0].imshow(dist.T, origin="lower", aspect="auto",
                      extent=(c["epoch"][0] - .5, c["epoch"][-1] + .5, -.5, dist.shape[1] - .5))
    ax[0].set(xlabel="epoch", ylabel="likes (last row: 10+)", title="likes per post")
    fig.colorbar(im, ax=ax[0], label="share of posts")
    ax[1].plot(c["epoch"], c["zero_like_share"], marker="o", label="zero-like share")
    ax[1].plot(c["epoch"], c["positive_engagement_share"], marker="o", label="engaged share")
    ax[1].set(xlabel="epoch", title="engagement"), ax[1].legend()
    ax[2].plot(c["epoch"], c["reward_mean"], marker="o", label="reward mean")
    ax[2].fill_between(c["epoch"], c["reward_mean"] - c["reward_std"],
                       c["reward_mean"] + c["reward_std"], alpha=.2)
    ax[2].plot(c["epoch"], c["avg_likes_per_post"], marker="s", label="avg likes per post")
    ax[2].set(xlabel="epoch", title="reward"), ax[2].legend()
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=100)
    return fig
