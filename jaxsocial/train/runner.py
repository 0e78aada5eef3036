"""The training driver behind launch/train.py: epochs, checkpoints/resume, metrics, export.

A Python loop over epochs (each epoch is compiled); everything else happens at epoch
boundaries: metrics to JSONL/TensorBoard, samples, checkpoints, the SIGTERM check.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

import jax
import ml_collections
from absl import logging

from jaxsocial.train import checkpointing, loop, sharding
from jaxsocial.train import logging as log_lib

SUMMARY_KEYS = ("avg_likes_per_post", "zero_like_share", "positive_engagement_share",
                "total_posts", "parse_failures", "reward_mean")


def train(config: ml_collections.ConfigDict, workdir: str, resume: bool = True,
          progress: bool = False, stop_after: Optional[int] = None,
          run: Optional[loop.SocialRL] = None) -> Dict[str, Any]:
    """Run (or resume) training in `workdir`. Returns the summary dict (also summary.json).

    stop_after: stop after this many epochs *in this call* (tests use it to simulate an
    interruption); checkpoints are written as configured. run: a SocialRL already built
    from the same config (reuses its compiled programs).
    """
    d = config.distributed
    sharding.maybe_initialize_distributed(
        bool(d.enabled) or None, coordinator_address=d.get("coordinator_address"),
        num_processes=d.get("num_processes"), process_id=d.get("process_id"))
    lead = jax.process_index() == 0
    os.makedirs(workdir, exist_ok=True)
    if lead:
        with open(os.path.join(workdir, "config.json"), "w") as f:
            f.write(config.to_json_best_effort(indent=2))
    run = run if run is not None else loop.SocialRL(config)
    state = run.init_state()
    ckpt = checkpointing.Checkpointer(workdir, keep=int(config.train.keep_checkpoints))
    history = []
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    if resume and ckpt.latest_step is not None:
        restored, meta, step = ckpt.restore(state)
        state = run.place(restored)
        history = meta.get("history", [])
        logging.info("resumed from epoch %d", step)
        # Drop metric lines written after the checkpoint (an interrupted epoch).
        if lead and os.path.exists(metrics_path):
            kept = [r for r in log_lib.read_jsonl(metrics_path) if r.get("epoch", 0) <= step]
            with open(metrics_path, "w") as f:
                f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in kept)
    elif lead and os.path.exists(metrics_path) and not resume:
        os.remove(metrics_path)
    epochs = int(config.train.epochs)
    epoch = int(sharding.to_host(state.epoch))
    every = max(1, int(config.train.checkpoint_every))
    done_here = 0
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=epochs, initial=epoch, desc="social-rl", unit="epoch", disable=not lead)
    writer = log_lib.MetricWriter(workdir) if lead else None
    with checkpointing.PreemptionGuard() as guard:
        while epoch < epochs:
            state, metrics, samples = run.run_epoch(state)
            epoch = metrics["epoch"]
            record = log_lib.to_python(metrics)
            if writer is not None:
                writer.write(epoch, metrics)
                writer.write_samples(samples)
            history.append({k: record[k] for k in SUMMARY_KEYS} | {"epoch": epoch})
            done_here += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(likes=f"{metrics['avg_likes_per_post']:.3f}",
                                posts=metrics["total_posts"])
            last = epoch == epochs
            stop = guard.requested or (stop_after is not None and done_here >= stop_after)
            if epoch % every == 0 or last or stop:
                ckpt.save(epoch, state, {"history": history, "epoch": epoch})
            if stop and not last:
                logging.warning("stopping after epoch %d (%s)", epoch,
                                "SIGTERM" if guard.requested else "stop_after")
                break
    if bar is not None:
        bar.close()
    if writer is not None:
        writer.close()
    ckpt.close()
    summary = {"epochs": epoch, "history": history,
               "first": history[0] if history else None, "last": history[-1] if history else None}
    if epoch == epochs and config.train.export_hf:  # every process joins the gather
        run.export_policy(state, os.path.join(workdir, "export"), write=lead)
        summary["export"] = os.path.join(workdir, "export")
    if lead:
        with open(os.path.join(workdir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
    return summary


def format_summary(summary: Dict[str, Any]) -> str:
    """Blog-style before/after table of the first and last epoch."""
    first, last = summary.get("first"), summary.get("last")
    if not first:
        return "no epochs run"
    rows = [("metric", "epoch %d" % first["epoch"], "epoch %d" % last["epoch"])]
    for k in ("avg_likes_per_post", "zero_like_share", "positive_engagement_share",
              "total_posts", "reward_mean", "parse_failures"):
        fmt = (lambda v: f"{v:.4f}") if isinstance(first[k], float) else str
        rows.append((k, fmt(first[k]), fmt(last[k])))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}" for r in rows)
