r"""Branches of one world side by side: a run and the forks made from it, per epoch.

    python launch/compare.py runs/world runs/world_reddit runs/world_random \
        --out=runs/compare.md --plot=runs/compare.png

Every workdir is a launch/train.py run; a fork (`--config.train.fork_from=W/checkpoints/N`)
holds the epochs up to N it shares with its source, so the table starts at the first fork
point among them (the epoch after it) and shows, per epoch and branch, likes per post, posts,
the likes the agents' posts earned in all, `crowd_interest_sim`, and the society's
`polarisation` (homophily, modularity, exposure diversity) and cascades (share of posts that
spread). The table goes to stdout and `--out`; `--plot` draws one panel per figure (needs
matplotlib: pip install -e '.[notebook]'). Bad input is one `error:` line, exit 1.
"""

import json
import os
import sys
from typing import Dict, List, Optional

from absl import app, flags

from jaxsocial import cli

_OUT = flags.DEFINE_string("out", "", "Write the table (markdown) here too.")
_PLOT = flags.DEFINE_string("plot", "", "Write the per-epoch plot (PNG) here.")

FIGURES = (
    ("likes/post", lambda r: r.get("avg_likes_per_post")),
    ("posts", lambda r: r.get("total_posts")),
    ("total likes", lambda r: int(round((r.get("avg_likes_per_post") or 0)
                                        * (r.get("total_posts") or 0)))),
    ("crowd_interest_sim", lambda r: r.get("crowd_interest_sim")),
    ("homophily", lambda r: (r.get("polarisation") or {}).get("homophily")),
    ("modularity", lambda r: (r.get("polarisation") or {}).get("modularity")),
    ("exposure diversity", lambda r: (r.get("polarisation") or {}).get("exposure_diversity")),
    ("spread share", lambda r: (r.get("cascades") or {}).get("spread_share")),
)


def load_branch(workdir: str) -> Dict[str, object]:
    """{"name", "workdir", "metrics" (sorted by epoch), "fork_from", "fork_epoch"} of a run."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        raise ValueError(f"{workdir}: no metrics.jsonl (is it a launch/train.py workdir?)")
    with open(path, encoding="utf-8") as f:
        metrics = sorted((json.loads(line) for line in f if line.strip()),
                         key=lambda r: r["epoch"])
    fork, epoch = "", None
    cfg_path = os.path.join(workdir, "config.json")
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            fork = (json.load(f).get("train") or {}).get("fork_from", "") or ""
        if fork:
            epoch = int(os.path.basename(fork.rstrip("/")))
    return {"name": os.path.basename(os.path.abspath(workdir)), "workdir": workdir,
            "metrics": metrics, "fork_from": fork, "fork_epoch": epoch}


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def table(branches: List[Dict[str, object]]) -> str:
    """Markdown: one row per (epoch, branch) from the first fork point on (all epochs when no
    branch is a fork), one column per figure."""
    points = [b["fork_epoch"] for b in branches if b["fork_epoch"] is not None]
    start = min(points) + 1 if points else 1
    lines = [f"Branches from epoch {start} on"
             + (f" (forked at epoch {start - 1})" if points else "") + ":", "",
             "| epoch | branch | " + " | ".join(name for name, _ in FIGURES) + " |",
             "|---:|---|" + "---:|" * len(FIGURES)]
    epochs = sorted({r["epoch"] for b in branches for r in b["metrics"] if r["epoch"] >= start})
    for e in epochs:
        for b in branches:
            row = next((r for r in b["metrics"] if r["epoch"] == e), None)
            if row is not None:
                lines.append(f"| {e} | {b['name']} | "
                             + " | ".join(_fmt(get(row)) for _, get in FIGURES) + " |")
    return "\n".join(lines) + "\n"


def plot(branches: List[Dict[str, object]], path: str):
    """One panel per figure, one line per branch (the shared epochs included)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ValueError("--plot needs matplotlib: pip install -e '.[notebook]'") from e
    cols = 4
    rows = -(-len(FIGURES) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, (name, get) in zip(axes.flat, FIGURES):
        for b in branches:
            pts = [(r["epoch"], get(r)) for r in b["metrics"] if get(r) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=b["name"])
        if any(b["fork_epoch"] for b in branches):
            ax.axvline(min(b["fork_epoch"] for b in branches if b["fork_epoch"]), color="grey",
                       linestyle=":")
        ax.set(title=name, xlabel="epoch")
    axes.flat[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return fig


def main(argv: List[str]) -> Optional[int]:
    workdirs = argv[1:]
    try:
        if not workdirs:
            raise ValueError("give one or more workdirs: python launch/compare.py W [W2 ...]")
        branches = [load_branch(w) for w in workdirs]
        text = table(branches)
        if _OUT.value:
            with open(_OUT.value, "w", encoding="utf-8") as f:
                f.write(text)
        if _PLOT.value:
            plot(branches, _PLOT.value)
    except (ValueError, OSError, KeyError, json.JSONDecodeError) as e:
        sys.stderr.write(f"error: {' '.join(str(e).split())}\n")
        sys.exit(1)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
