"""Wall time and peak memory of one command, recorded as a benchmark result: how long the
README's commands take (the main job, the SmolLM2 run, the test suite) comes from here.

    python benchmarks/wall_time.py --name=demo_main_job --run_dir=runs/demo_timed -- \
        python launch/train.py --config=configs/demo.py --workdir=runs/demo_timed
    python benchmarks/wall_time.py --name=pytest -- pytest

The command runs once, from the repository root, with this process's environment; its output
passes through. Recorded figures: `wall_s` (time.monotonic around the command), `exit_code`,
`peak_rss_gib` (the largest resident set of the command or any process it waited for:
`getrusage(RUSAGE_CHILDREN).ru_maxrss`), `peak_tree_rss_gib` (the largest sum of the resident
sets of the command and all its descendants, sampled every 0.5 s: pytest's workers together),
`load_avg_1m_start` (the machine's 1-minute load when
the command started: above about 0.5 on an idle machine, something else was running), and, with
`--run_dir`: for a `launch/simulate.py` workdir its ticks, seconds per tick, peak and predicted
peak (summary.json); for a `launch/train.py` workdir the run's per-epoch story from its
metrics.jsonl (likes per post, posts, total likes, zero-like share, crowd_interest_sim,
do_nothing answers, tokens/s) and its first-third / last-third means, the figures the
README's story quotes.
A pytest command's closing counts (`N passed`, `N skipped`, `N failed`) and its own seconds are
parsed from its last line. A command that fails is recorded too (its exit code is a figure) and
this script exits with its code. Summary line: `wall_s=... exit_code=... peak_rss_gib=...`,
then `result: <file>` (benchmarks/results/) and the machine line, last.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time

from common import NO_RECORD_HELP, ROOT, finish

# metrics.jsonl key -> the name the result records it under
RUN_METRICS = {
    "avg_likes_per_post": "likes_per_post",
    "total_posts": "posts",
    "zero_like_share": "zero_like_share",
    "crowd_interest_sim": "crowd_interest_sim",
    "action_mix/do_nothing": "do_nothing",
    "tokens_per_s": "tokens_per_s",
}
PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)")
PYTEST_SECONDS = re.compile(r" in ([0-9.]+)s")


def simulation(run_dir: str) -> dict:
    """A `launch/simulate.py` workdir's figures from its summary.json ({} for any other
    workdir): ticks, seconds per tick, its own peak RSS and the compiler-based prediction."""
    path = os.path.join(run_dir, "summary.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        s = json.load(f)
    if "predicted_peak_gb" not in s:
        return {}
    return {"ticks": s["ticks"], "seconds_per_tick": round(s["seconds_per_tick"], 4),
            "peak_rss_gib": round(s["peak_rss_gb"], 3),
            "predicted_peak_gib": round(s["predicted_peak_gb"], 3)}


def run_story(run_dir: str) -> dict:
    """Per-epoch figures of a train.py workdir (metrics.jsonl) and the first / last third's
    means; total likes = posts x likes per post."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"--run_dir={run_dir}: no metrics.jsonl in it")
    epochs = []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            rec = {"epoch": row.get("epoch")}
            for key, name in RUN_METRICS.items():
                value = row
                for part in key.split("/"):
                    value = value.get(part) if isinstance(value, dict) else None
                if value is not None:
                    rec[name] = round(float(value), 4)
            if "posts" in rec and "likes_per_post" in rec:
                rec["total_likes"] = round(rec["posts"] * rec["likes_per_post"], 1)
            epochs.append(rec)
    if not epochs:
        raise ValueError(f"--run_dir={run_dir}: metrics.jsonl holds no epoch")
    third = max(1, len(epochs) // 3)
    out = {"epochs": epochs, "third": third}
    for part, rows in (("first_third", epochs[:third]), ("last_third", epochs[-third:])):
        sums = collections.defaultdict(list)
        for r in rows:
            for k, v in r.items():
                if k != "epoch":
                    sums[k].append(v)
        out[part] = {k: round(sum(v) / len(v), 3) for k, v in sums.items()}
    return out


def pytest_counts(last_line: str) -> dict:
    """{'passed': N, ..., 'pytest_s': S} from pytest's closing line; {} for any other line."""
    counts = {kind.rstrip("s") if kind.startswith("error") else kind: int(n)
              for n, kind in PYTEST_COUNTS.findall(last_line)}
    secs = PYTEST_SECONDS.search(last_line)
    if counts and secs:
        counts["pytest_s"] = float(secs.group(1))
    return counts


def tree_rss_bytes(root: int) -> int:
    """The resident sets of process `root` and all its descendants, summed (Linux /proc)."""
    children = collections.defaultdict(list)
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children[ppid].append(int(name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, ()))
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next((int(line.split()[1]) * 1024 for line in f
                               if line.startswith("VmRSS:")), 0)
        except OSError:
            continue
    return total


class TreeSampler(threading.Thread):
    """The largest `tree_rss_bytes(pid)` seen, sampled every `interval` seconds."""

    def __init__(self, pid: int, interval: float = 0.5):
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak = pid, interval, 0
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            if os.path.isdir("/proc"):
                self.peak = max(self.peak, tree_rss_bytes(self.pid))
            self.done.wait(self.interval)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        sys.exit("error: give the command after --, e.g. "
                 "python benchmarks/wall_time.py --name=pytest -- pytest")
    split = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", required=True, help="the result's benchmark name (file prefix)")
    p.add_argument("--run_dir", default="", help="a train.py workdir: record its story")
    p.add_argument("--no_record", action="store_true", help=NO_RECORD_HELP)
    args = p.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        sys.exit("error: the command after -- is empty")
    if not re.fullmatch(r"[A-Za-z0-9_.]+", args.name):
        sys.exit(f"error: --name={args.name!r}: letters, digits, '_' and '.' only")

    load = os.getloadavg()[0]
    t0 = time.monotonic()
    last = ""
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    tree = TreeSampler(proc.pid)
    tree.start()
    for line in proc.stdout:
        sys.stdout.write(line)
        if line.strip():
            last = line.strip()
    code = proc.wait()
    wall = time.monotonic() - t0
    tree.done.set()
    tree.join()
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss

    figures = {"wall_s": round(wall, 1), "wall_min": round(wall / 60, 2),
               "exit_code": code, "peak_rss_gib": round(peak_kib / 2**20, 2),
               "peak_tree_rss_gib": round(tree.peak / 2**30, 2),
               "load_avg_1m_start": round(load, 2), "measured_command": command,
               "last_line": last}
    figures.update(pytest_counts(last))
    if args.run_dir:
        run_dir = (os.path.join(ROOT, args.run_dir) if not os.path.isabs(args.run_dir)
                   else args.run_dir)
        figures["run"] = simulation(run_dir) or run_story(run_dir)
    print(f"wall_s={wall:.1f} exit_code={code} peak_rss_gib={figures['peak_rss_gib']} "
          f"peak_tree_rss_gib={figures['peak_tree_rss_gib']}")
    finish(args.name, figures, record=not args.no_record)
    sys.exit(code)


if __name__ == "__main__":
    main()
