"""The training driver behind launch/train.py: epochs, checkpoints/resume, metrics, export.

A Python loop over epochs (each epoch is compiled); everything else happens at epoch
boundaries: metrics to JSONL/TensorBoard, samples, checkpoints, the SIGTERM check.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any, Dict, Optional, Tuple

import jax
import ml_collections
import numpy as np
from absl import logging
from tqdm import tqdm

from jaxsocial.models import checkpoint_hf
from jaxsocial.social import recsys
from jaxsocial.train import (
    checkpointing,
    checks,
    dataset,
    fit,
    host,
    report,
    report_page,
    sharding,
    workdir_lock,
)
from jaxsocial.train import config as run_config
from jaxsocial.train import run as run_lib
from jaxsocial.train import run_log as log_lib

SUMMARY_KEYS = ("avg_likes_per_post", "zero_like_share", "positive_engagement_share",
                "total_posts", "parse_failures", "reward_mean")
# agents.cohorts: what summary.md's per-cohort table reads of each epoch
COHORT_SUMMARY_KEYS = ("avg_likes_per_post", "zero_like_share", "positive_engagement_share",
                       "total_posts", "total_likes", "likes_given")


def _read_stored_config(path: str) -> Optional[dict]:
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is unreadable ({e}); use a new --workdir or --noresume") from e


def _append_jsonl(path: str, records) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        f.flush()
        os.fsync(f.fileno())


def read_interviews(workdir: str) -> Dict[int, list]:
    """{epoch: [answer records]} of workdir/interviews.jsonl (empty when there is none)."""
    path = os.path.join(workdir, "interviews.jsonl")
    out: Dict[int, list] = {}
    for r in log_lib.read_jsonl(path) if os.path.exists(path) else []:
        out.setdefault(int(r["epoch"]), []).append(r)
    return out


def _write_text_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def check_resume(config: ml_collections.ConfigDict, workdir: str) -> Dict[str, Any]:
    """Compare workdir/config.json with `config` before resuming.

    Returns the accepted (safe) differences {key: (old, new)}. Raises ValueError (one line)
    when a key that changes shapes or semantics differs, or when safe keys differ without
    `train.allow_config_change=True`."""
    stored = _read_stored_config(os.path.join(workdir, "config.json"))
    if stored is None:
        return {}
    safe, unsafe = run_config.resume_differences(stored, config)
    if unsafe:
        raise ValueError(
            f"cannot resume {workdir}: it was trained with a different "
            f"{run_config.format_differences(unsafe)}; these change shapes or semantics: "
            f"use a new --workdir (or --noresume to start over there)")
    if safe and not config.train.get("allow_config_change", False):
        raise ValueError(
            f"resuming {workdir} with changed {run_config.format_differences(safe)}: pass "
            f"--config.train.allow_config_change=True to accept, or use a new --workdir")
    return safe


def fork_source(config: ml_collections.ConfigDict, workdir: str
                ) -> Optional[Tuple[str, int, Dict[str, Any]]]:
    """(source workdir, epoch, allowed differences) of a fork (`train.fork_from` =
    "W/checkpoints/N"), or None when the config is no fork. Raises ValueError (one line):
    a path that is not a checkpoint of a run, the fork's own workdir, train.epochs not past
    N, or keys that a fork may not change (`run_config.FORK_MAY_CHANGE`)."""
    path = str(config.train.get("fork_from", "") or "")
    if not path:
        return None
    path = os.path.abspath(path.rstrip("/"))
    parent, step = os.path.split(path)
    source = os.path.dirname(parent)
    if os.path.basename(parent) != "checkpoints" or not step.isdigit():
        raise ValueError(f"train.fork_from={path!r} is not a checkpoint directory: expected "
                         f"W/checkpoints/N (N an epoch W saved)")
    if not os.path.isdir(path):
        have = sorted(int(d) for d in os.listdir(parent) if d.isdigit()) \
            if os.path.isdir(parent) else []
        raise ValueError(f"train.fork_from={path!r} does not exist (checkpoints of {source}: "
                         f"{have or 'none'})")
    if os.path.abspath(source) == os.path.abspath(workdir):
        raise ValueError(f"train.fork_from={path!r} is a checkpoint of this workdir: a fork "
                         f"needs its own --workdir (to go on in the same one, resume it)")
    if int(config.train.epochs) <= int(step):
        raise ValueError(f"train.epochs={int(config.train.epochs)} must be past the fork's "
                         f"epoch {int(step)}")
    stored = _read_stored_config(os.path.join(source, "config.json"))
    if stored is None:
        raise ValueError(f"train.fork_from={path!r}: {source} has no config.json (is it a "
                         f"launch/train.py workdir?)")
    allowed, refused = run_config.fork_differences(stored, config)
    if refused:
        raise ValueError(f"a fork of {source} may not change "
                         f"{run_config.format_differences(refused)}: a fork may change the "
                         f"society's dynamics, the reward's weights and train.* "
                         f"(run_config.FORK_MAY_CHANGE)")
    return source, int(step), allowed


def _start_fork(run, state, workdir: str, source: str, step: int, lead: bool):
    """The fork's state, history and logs: `source`'s checkpoint `step` restored into this
    run's structure, its metrics / samples / interviews up to `step` copied into `workdir`."""
    src = checkpointing.Checkpointer(source, keep=1_000_000)  # read only: nothing is saved
    try:
        restored, meta, _ = src.restore(state, step)
    except (checkpointing.CheckpointError, FileNotFoundError) as e:
        raise ValueError(f"cannot fork {source} at epoch {step}: {e}") from None
    finally:
        src.close()
    if lead:  # the source's logs whole; the caller's cut_logs keeps the epochs up to `step`
        for name in ("metrics.jsonl", "samples.jsonl", "feed.jsonl", "interviews.jsonl"):
            if os.path.exists(os.path.join(source, name)):
                shutil.copyfile(os.path.join(source, name), os.path.join(workdir, name))
    history = [h for h in meta.get("history", []) if h.get("epoch", 0) <= step]
    return run.place(restored), history


def train(config: ml_collections.ConfigDict, workdir: str, resume: bool = True,
          progress: bool = False, stop_after: Optional[int] = None,
          run: Optional[run_lib.Run] = None, progress_file=None,
          checked: bool = False) -> Dict[str, Any]:
    """Run (or resume) training in `workdir`. Returns the summary dict (also summary.json).

    Before anything is built or written the config is checked (`checks.check`) and its state
    against this machine (`fit.check_state`), unless the caller has (checked=True: the
    launcher); when resuming it is compared with workdir/config.json (`check_resume`). The
    newest checkpoint that restores and verifies is used (corrupt ones are set aside with a
    warning). metrics.jsonl, samples.jsonl and the TensorBoard events are cut to the restored
    epoch on every start, so each epoch is logged exactly once. A SIGTERM or SIGINT before the
    epoch loop returns at once (with "stopped": the signal's name); during it, the loop
    checkpoints and stops after the epoch (one that arrives while a checkpoint is being saved
    stops the run right after that save). A workdir that holds logged epochs but no checkpoint
    is refused (ValueError) unless `resume=False`: it cannot be resumed, and starting over would
    cut its logs.

    One run per workdir: the lead process holds `workdir/run.lock` (`workdir_lock`) from before
    anything is read or deleted until the end, so a second run on a live workdir is refused
    (WorkdirBusy) and `resume=False` deletes nothing under a live run. Outputs are all or
    nothing: export/ and initial/ are written into a temporary sibling, verified
    (`checkpoint_hf.export_problem`) and renamed into place; summary.json / summary.md are
    replaced atomically. A finished run counts as done only when its export verifies, so a
    rerun repairs a missing or partial one from the final checkpoint.

    stop_after: stop after this many epochs *in this call* (tests use it to simulate an
    interruption); checkpoints are written as configured. run: a `train.run.Run` already built
    from the same config (reuses its compiled programs). progress_file: stream for the bar.
    """
    if not checked:
        checks.check(config)
        fit.check_state(config)
    lock = workdir_lock.WorkdirLock(workdir)
    with checkpointing.PreemptionGuard(immediate=True) as guard:
        try:
            return _train(config, workdir, resume, progress, stop_after, run, progress_file,
                          guard, lock)
        except checkpointing.Preempted:
            name = guard.signal_name or "SIGTERM"
            logging.warning("%s before the first epoch: nothing new to save, exiting", name)
            return {"epochs": None, "history": [], "first": None, "last": None,
                    "stopped": name}
        finally:
            lock.release()


def _take_lock(lock: workdir_lock.WorkdirLock, lead: bool) -> None:
    """The lead process takes the workdir lock; the others learn whether it got it."""
    error = None
    if lead:
        try:
            workdir_lock.prepare(lock.workdir)
            lock.acquire()
        except (workdir_lock.WorkdirBusy, ValueError) as e:
            error = e
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        ok = multihost_utils.broadcast_one_to_all(np.int32(error is None))
        if not lead and not int(ok):
            raise workdir_lock.WorkdirBusy(f"workdir {lock.workdir}: process 0 could not take "
                                           f"its lock (see process 0's error)")
    if error is not None:
        raise error


def _refuse_silent_restart(workdir: str) -> None:
    """ValueError (one line) when `workdir` holds a run's epochs (metrics.jsonl rows or a
    summary.json) but no checkpoint: resuming is impossible, and starting over would cut
    those logs, so it takes `--noresume`."""
    path = os.path.join(workdir, "metrics.jsonl")
    rows = 0
    if os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            rows = sum(1 for line in f if line.strip())
    if rows or os.path.exists(os.path.join(workdir, "summary.json")):
        held = f"{rows} epoch(s) of metrics" if rows else "a summary.json"
        raise ValueError(f"cannot resume {workdir}: it holds {held} but no checkpoint to "
                         f"resume from; rerun with --noresume to start over there (its logs "
                         f"are cut), or use a new --workdir")


def _train(config, workdir, resume, progress, stop_after, run, progress_file, guard, lock):
    lead, ckpt, resuming = _open_workdir(config, workdir, resume, lock)
    changes = check_resume(config, workdir) if resuming else {}
    fork = None if resuming else fork_source(config, workdir)
    run = run if run is not None else run_lib.build_run(config, checked=True)
    state = run.init_state()
    recsys.check(state.society, run.setup.social_params)  # a registered recommender's scores
    if run.setup.fused:  # compiled and checked against the machine before anything is written
        run, _, _ = fit.fit_run(run, state)  # (it logs its prediction)
    state, history, restored_epoch = _starting_state(run, state, ckpt, workdir, fork,
                                                     resuming, lead)
    if lead:
        _record_start(config, workdir, changes, resuming, restored_epoch)
    epochs = int(config.train.epochs)
    epoch = int(sharding.to_host(state.epoch))
    finished = epoch >= epochs  # a rerun of a finished run: nothing to train or log
    if finished:
        logging.info("run already finished (epoch %d of %d) in %s: nothing to do", epoch,
                     epochs, workdir)
    state, epoch = _epoch_loop(config, workdir, run, state, epoch, ckpt, guard, history,
                               lead=lead, progress=progress and not finished,
                               progress_file=progress_file, stop_after=stop_after,
                               log=lead and not finished)
    return _finish(config, workdir, run, state, history, epoch, lead, guard, finished)


def _open_workdir(config, workdir: str, resume: bool, lock: workdir_lock.WorkdirLock):
    """(lead process, its Checkpointer, resuming): the distributed job joined, the workdir
    locked (before anything in it is read, written or deleted) and its checkpoints read; a
    fresh start (`resume=False`) deletes the previous run's checkpoints."""
    d = config.distributed
    sharding.maybe_initialize_distributed(
        bool(d.enabled) or None, coordinator_address=d.get("coordinator_address"),
        num_processes=d.get("num_processes"), process_id=d.get("process_id"))
    lead = jax.process_index() == 0
    _take_lock(lock, lead)  # before anything in the workdir is read, written or deleted
    os.makedirs(workdir, exist_ok=True)
    ckpt = checkpointing.Checkpointer(workdir, keep=int(config.train.keep_checkpoints))
    resuming = resume and ckpt.latest_step is not None
    if resume and not resuming:
        _refuse_silent_restart(workdir)
    if not resume and ckpt.latest_step is not None:
        # Starting over: checkpoints of the previous run would be taken for this run's later.
        logging.warning("--noresume: deleting the previous run's checkpoints %s",
                        ckpt.all_steps())
        ckpt.delete_all()
    return lead, ckpt, resuming


def _starting_state(run, state, ckpt, workdir: str, fork, resuming: bool, lead: bool):
    """(state, history, restored epoch) the epoch loop starts from: a fork's source
    checkpoint, the newest checkpoint that restores and verifies, or the fresh `state`."""
    history, restored_epoch = [], 0
    if fork is not None:
        source, restored_epoch, allowed = fork
        state, history = _start_fork(run, state, workdir, source, restored_epoch, lead)
        logging.info("forked %s at epoch %d%s", source, restored_epoch,
                     f" with changed {run_config.format_differences(allowed)}"
                     if len(allowed) > 1 else "")
    if resuming:
        try:
            restored, meta, step = ckpt.restore_latest_good(state)
        except checkpointing.CheckpointError as e:
            raise ValueError(f"{e}; use a new --workdir or --noresume") from None
        state = run.place(restored)
        history = [h for h in meta.get("history", []) if h.get("epoch", 0) <= step]
        restored_epoch = step
        logging.info("resumed from epoch %d", step)
    return state, history, restored_epoch


def _record_start(config, workdir: str, changes, resuming: bool, restored_epoch: int) -> None:
    """The lead's record of this start: config_changes.jsonl (a resume's accepted changes),
    config.json, and the logs cut to the restored epoch. Only once the restore succeeded (or
    on a fresh start) does config.json change."""
    changes_path = os.path.join(workdir, "config_changes.jsonl")
    if changes:
        with open(changes_path, "a") as f:
            f.write(json.dumps({"resumed_epoch": restored_epoch, "time": time.time(),
                                "changes": {k: list(v) for k, v in changes.items()}}) + "\n")
        logging.warning("resuming with changed %s (recorded in config_changes.jsonl)",
                        run_config.format_differences(changes))
    if not resuming and os.path.exists(changes_path):
        os.remove(changes_path)
    _write_text_atomic(os.path.join(workdir, "config.json"), config.to_json_best_effort(indent=2))
    # Exactly-once logs: drop whatever was logged after the restored epoch (all of it on a
    # fresh start), TensorBoard included.
    log_lib.cut_logs(workdir, restored_epoch)
    dataset.cut(workdir, restored_epoch)


def _epoch_loop(config, workdir: str, run, state, epoch: int, ckpt, guard, history: list, *,
                lead: bool, progress: bool, progress_file, stop_after: Optional[int], log: bool):
    """Epochs until train.epochs (or a signal, or `stop_after` epochs in this call): each
    epoch's metrics and samples logged (log: the lead, on a run not yet finished), its
    interviews, its history entry and, every train.checkpoint_every epochs and at the end, a
    checkpoint. `epoch`: the epochs `state` has done. Returns (state, the last epoch done)."""
    epochs = int(config.train.epochs)
    every = max(1, int(config.train.checkpoint_every))
    done_here = 0
    bar = None
    if progress:
        bar = tqdm(total=epochs, initial=min(epoch, epochs), desc="social-rl", unit="epoch",
                   disable=not lead, file=progress_file, dynamic_ncols=True)
    writer = log_lib.MetricWriter(workdir) if log else None
    guard.immediate = False
    if guard.requested:  # arrived between handler swaps
        raise checkpointing.Preempted()
    try:
        while epoch < epochs:
            state, metrics, samples = run.run_epoch(state)
            epoch = metrics["epoch"]
            feed = metrics.pop("feed", [])
            episodes = metrics.pop("episodes", None)  # train.dataset
            record = log_lib.to_python(metrics)
            if writer is not None:
                writer.write(epoch, metrics)
                writer.write_samples(samples)
                writer.write_feed(epoch, feed)
                _write_report(workdir)  # watchable while the run goes
                if episodes is not None:  # before the checkpoint: a resume redoes what follows
                    dataset.write_epoch(workdir, epoch, episodes, config.to_json_best_effort())
            _interviews(config, workdir, run, state, epoch, lead)
            history.append(_history_entry(record, epoch))
            done_here += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(headline(record))
            logging.info("epoch %d: %s", epoch, headline(record))
            last = epoch == epochs
            stop = guard.requested or (stop_after is not None and done_here >= stop_after)
            if epoch % every == 0 or last or stop:
                stop = _save(ckpt, guard, state, history, epoch, stop)
            if stop and not last:
                logging.warning("stopping after epoch %d (%s)", epoch,
                                guard.signal_name if guard.requested else "stop_after")
                break
    finally:
        if bar is not None:
            bar.close()
        if writer is not None:
            writer.close()
        ckpt.close()
    return state, epoch


def _interviews(config, workdir: str, run, state, epoch: int, lead: bool) -> None:
    """agents.interviews: after their epoch, every agent's answer to each question
    (`host.interview`) appended to interviews.jsonl."""
    for e, question in config.agents.get("interviews", ()) or ():
        if int(e) == epoch:
            answers = host.interview(run.setup, state, question)
            if lead:
                _append_jsonl(os.path.join(workdir, "interviews.jsonl"), answers)


def _write_report(workdir: str) -> Optional[str]:
    """report.html (`report_page.write`); a page that cannot be written is a warning, not the
    end of the run (the run's own records are complete without it)."""
    try:
        return report_page.write(workdir)
    except Exception as e:  # noqa: BLE001  any failure of the page, never of the run
        logging.warning("report.html not written: %s: %s", type(e).__name__, e)
        return None


def _history_entry(record: Dict[str, Any], epoch: int) -> Dict[str, Any]:
    """The epoch's entry in the run's history (checkpoint metadata, summary.json)."""
    return ({k: record[k] for k in SUMMARY_KEYS} | {"epoch": epoch}
            | {k: record[k] for k in ("drift", "posts", "worst_post") if k in record}
            | ({"cohorts": {name: {k: c[k] for k in COHORT_SUMMARY_KEYS if k in c}
                            for name, c in record["cohorts"].items()}}
               if "cohorts" in record else {}))


def _save(ckpt, guard, state, history: list, epoch: int, stop: bool) -> bool:
    """Checkpoint `epoch`; returns whether to stop after it (`stop`, or a signal that arrived
    during the save)."""
    ckpt.save(epoch, state, {"history": history, "epoch": epoch})
    fit.release_freed_memory()  # the save's host copies: glibc keeps them, run after run
    if guard.requested and not stop:  # the signal arrived during the save
        logging.warning("%s arrived while checkpoint %d was being saved: it is "
                        "complete; stopping", guard.signal_name, epoch)
        return True
    return stop


def _finish(config, workdir: str, run, state, history: list, epoch: int, lead: bool, guard,
            finished: bool) -> Dict[str, Any]:
    """The run's summary (summary.json and summary.md, written by the lead), after the
    exports of a run that reached train.epochs (`_export_all`)."""
    epochs = int(config.train.epochs)
    summary = {"epochs": epoch, "history": history,
               "first": history[0] if history else None, "last": history[-1] if history else None}
    if guard.requested:
        summary["stopped"] = guard.signal_name
    if finished:
        summary["already_finished"] = True
    if epoch == epochs and config.train.export_hf:
        repaired = _export_all(run, state, workdir, lead, verify_existing=finished)
        if repaired and finished:
            summary["repaired"] = repaired
    if os.path.isdir(os.path.join(workdir, "export")):
        summary["export"] = os.path.join(workdir, "export")
    interviews = read_interviews(workdir) if lead else {}
    if interviews:  # the first and the last interview, for summary.md
        summary["interviews"] = {"first": interviews[min(interviews)],
                                 "last": interviews[max(interviews)]}
    if lead:
        summary["report"] = _write_report(workdir)
        _write_text_atomic(os.path.join(workdir, "summary.json"), json.dumps(summary, indent=2))
        _write_text_atomic(os.path.join(workdir, "summary.md"), report.summary_markdown(
            summary, f"Social-RL run: {config.name}"))
    return summary


def _export_all(run, state, workdir: str, lead: bool, verify_existing: bool) -> list:
    """Write export/ (with cohorts: export/<cohort>/ each) and initial/ (`host.export_names`;
    each all or nothing); returns the names written.

    verify_existing: a finished run's rerun keeps a directory that verifies and rewrites one
    that is missing or incomplete. Multi-process: every process joins (the weights are
    gathered); the verdict is process 0's."""
    todo = []
    for name in host.export_names(run.setup):
        path = os.path.join(workdir, name)
        if verify_existing:
            problem = checkpoint_hf.export_problem(path) if lead else None
            if jax.process_count() > 1:  # every process must join the export, or none
                from jax.experimental import multihost_utils
                if int(multihost_utils.broadcast_one_to_all(np.int32(problem is not None))):
                    problem = problem or "incomplete on process 0"
            if problem is None:
                continue
            logging.warning("%s is incomplete (%s): writing it again from the final checkpoint",
                            name + "/", problem)
        _export_atomic(run, state, path, lead, initial=name == "initial",
                       cohort=name.split("/", 1)[1] if "/" in name else None)
        todo.append(name)
    return todo


def _export_atomic(run, state, path: str, lead: bool, initial: bool,
                   cohort: Optional[str] = None) -> None:
    """Write into `path.partial`, verify it, then swap it in for `path` (a crash leaves either
    the old directory or the new one, never a half-written one in its place)."""
    partial, old = path + ".partial", path + ".old"
    if lead:
        for p in (partial, old):
            shutil.rmtree(p, ignore_errors=True)
        os.makedirs(os.path.dirname(partial), exist_ok=True)
    cohort_kw = {} if cohort is None else {"cohort": cohort}  # (cohorts: export/<cohort>/)
    fit.release_freed_memory()  # the export's merged weights come on top of the epochs' heap
    run.export_policy(state, partial, write=lead, initial=initial, **cohort_kw)
    if not lead:
        return
    problem = checkpoint_hf.export_problem(partial)
    if problem is not None:
        raise OSError(f"the export written to {partial} does not read back: {problem}")
    if os.path.exists(path):
        os.replace(path, old)
    os.replace(partial, path)
    shutil.rmtree(old, ignore_errors=True)


def headline(record: Dict[str, Any]) -> str:
    """The epoch's headline metrics in one short string (progress bar, train.log)."""
    return (f"likes/post={record['avg_likes_per_post']:.3f} posts={record['total_posts']} "
            f"reward={record['reward_mean']:.3f} parse_fail={record['parse_failures']}")


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
