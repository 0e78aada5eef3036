"""Where a training run's memory goes: resident memory over time with the run's phases marked,
and XLA's own figures for the compiled epoch program.

    python benchmarks/memory_profile.py --config=configs/demo.py --epochs=2
    python benchmarks/memory_profile.py --config=configs/demo.py --epochs=2 \
        --config.rl.micro_tokens=0                        # the whole minibatch at once
    python benchmarks/memory_profile.py --config=configs/smol.py --epochs=1 --plot=smol.png

The run is driven in this process, phase by phase, as `launch/train.py` drives it (set-up,
weights, the text banks' embedding pass, the epoch program's compile, each epoch's execution,
its host metrics, a checkpoint save, the export); a thread samples the process's resident set
(/proc/self/status VmRSS) every `--interval` seconds. Per phase: RSS at its start and end and
its peak; for the compiled epoch program, `compiled.memory_analysis()` (arguments, outputs,
temporaries, aliased bytes: XLA's buffer assignment), the rows and micro-batch it trains, and
the process peak `train.fit.predict` predicts from them (what `runner.train` judges before the
first epoch) beside the measured one.
`--tracemalloc` adds each phase's peak of Python-allocated memory (slower). `--plot=PATH`
draws RSS over time with the phases shaded (needs matplotlib: pip install -e '.[notebook]').
Config overrides (`--config.KEY=VALUE`) are parsed as train.py parses them. Summary line:
`peak_rss_gib=... epoch_program_gib=... micro_batch=...`, then `result: <file>`
(benchmarks/results/memory_profile-<UTC>.json) and the machine line, last.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import threading
import time
import tracemalloc

from common import NO_RECORD_HELP, ROOT, finish

from jaxsocial.train import fit

GiB = 2 ** 30


class Sampler:
    """RSS sampled every `interval` seconds on a thread; `phase(name)` marks the phases."""

    def __init__(self, interval: float, trace_python: bool):
        self.interval, self.trace_python = interval, trace_python
        self.t0 = time.monotonic()
        self.samples = []   # (seconds, bytes)
        self.phases = []    # dicts: name, start_s, end_s, rss_start/end/peak_gib, py_peak_mib
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.samples.append((time.monotonic() - self.t0, fit.resident_bytes()))
            self._stop.wait(self.interval)

    def __enter__(self):
        if self.trace_python:
            tracemalloc.start()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        if self.trace_python:
            tracemalloc.stop()

    def phase(self, name: str):
        sampler = self

        class _Phase:
            def __enter__(self):
                if sampler.trace_python:
                    tracemalloc.reset_peak()
                self.start, self.rss = time.monotonic() - sampler.t0, fit.resident_bytes()
                return self

            def __exit__(self, *exc):
                end, rss = time.monotonic() - sampler.t0, fit.resident_bytes()
                inside = [b for t, b in list(sampler.samples) if self.start <= t <= end]
                record = {"phase": name, "start_s": round(self.start, 2),
                          "end_s": round(end, 2), "rss_start_gib": round(self.rss / GiB, 3),
                          "rss_end_gib": round(rss / GiB, 3),
                          "rss_peak_gib": round(max(inside + [self.rss, rss]) / GiB, 3)}
                if sampler.trace_python:
                    record["python_peak_mib"] = round(tracemalloc.get_traced_memory()[1]
                                                      / 2 ** 20, 1)
                sampler.phases.append(record)
                print(f"{name:<22} {record['rss_start_gib']:6.2f} -> {record['rss_end_gib']:6.2f}"
                      f" GiB (peak {record['rss_peak_gib']:.2f}) {end - self.start:7.1f} s",
                      flush=True)
                return False
        return _Phase()


def program_memory(compiled) -> dict:
    """XLA's figures for a compiled program, GiB."""
    ma = compiled.memory_analysis()
    out = {}
    for key in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                "alias_size_in_bytes", "generated_code_size_in_bytes"):
        value = getattr(ma, key, None)
        if value is not None:
            out[key.replace("_size_in_bytes", "_gib")] = round(value / GiB, 3)
    out["total_gib"] = round(sum(out.get(k, 0.0) for k in ("argument_gib", "output_gib",
                                                             "temp_gib"))
                             - out.get("alias_gib", 0.0), 3)
    return out


def load_config(config_arg: str, overrides):
    """The ConfigDict of `--config=config_arg` with its `--config.KEY=VALUE` overrides."""
    from absl import flags
    from ml_collections import config_flags

    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", config_arg, "", flag_values=fv, lock_config=True)
    fv(["memory_profile", f"--config={config_arg}", *overrides])
    return fv.config


def profile(config, epochs: int, workdir: str, sampler: Sampler) -> dict:
    """Drive one run of `config` phase by phase under `sampler`; returns the program figures."""
    import jax

    from jaxsocial.train import checkpointing, host, sharding
    from jaxsocial.train import run as run_lib
    from jaxsocial.train import setup as setup_lib

    with sampler.phase("set-up"):
        setup = setup_lib.build_setup(config)
    with sampler.phase("weights"):
        weights = setup_lib.init_weights(config, setup)
    with sampler.phase("text banks"):
        text = setup_lib.embed_text(setup, weights)
        jax.block_until_ready(text)
    run = run_lib.Run(setup=setup, weights=weights, text=text,
                      **run_lib.programs(setup, weights, text))
    with sampler.phase("initial state"):
        state = run.init_state()
        jax.block_until_ready(state)
    figures = {"micro_batch": int(setup.rl_config.micro_batch or 0),
               "rows": int(config.rollout.ticks_per_epoch) * setup.active,
               "seq_len": int(setup.template.max_len + setup.sampling.max_new_tokens),
               "fused": bool(setup.fused)}
    if not setup.fused:
        raise SystemExit("error: this config runs three programs (the code bonus); the profile "
                         "drives the one-program epoch only")
    with sampler.phase("compile epoch"):
        compiled = run.compile_epoch(state)  # as runner.train compiles it (fit.fit_run)
    figures["epoch_program"] = program_memory(compiled)
    pred = fit.predict(compiled, len(setup.mesh.local_devices))  # what runner.train judges
    figures["predicted"] = {"resident_gib": round(pred.resident / GiB, 3),
                            "program_gib": round(pred.program / GiB, 3),
                            "epoch_peak_gib": round(pred.peak / GiB, 3),
                            "seen_gib": round(pred.seen / GiB, 3),
                            "process_peak_gib": round(pred.process_peak / GiB, 3)}
    ckpt = checkpointing.Checkpointer(workdir, keep=1)
    for e in range(1, epochs + 1):
        with sampler.phase(f"epoch {e}"):
            state, upd, view = compiled(state, setup.grammar, run.encoder)
            jax.block_until_ready(state.train.step)
        with sampler.phase(f"host metrics {e}"):
            view, upd = sharding.to_host((view, upd))
            host.epoch_metrics(setup, text, view, upd, 0.0, 0.0)
            host.society_metrics(setup, state)
    with sampler.phase("checkpoint"):
        ckpt.save(epochs, state, {"epoch": epochs})
        ckpt.close()
    with sampler.phase("export"):  # the first of the run's exports (a cohort's, with cohorts)
        name = host.export_names(setup)[0]
        cohort = {"cohort": name.split("/", 1)[1]} if "/" in name else {}
        run.export_policy(state, os.path.join(workdir, name), **cohort)
    return figures


def plot(sampler: Sampler, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    t = [s for s, _ in sampler.samples]
    ax.plot(t, [b / GiB for _, b in sampler.samples], lw=1.2, color="k")
    for i, p in enumerate(sampler.phases):
        ax.axvspan(p["start_s"], p["end_s"], alpha=0.15, color=f"C{i % 10}")
        ax.text((p["start_s"] + p["end_s"]) / 2, p["rss_peak_gib"], p["phase"], rotation=90,
                fontsize=7, ha="center", va="bottom")
    ax.set_xlabel("seconds")
    ax.set_ylabel("RSS (GiB)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    overrides = [a for a in argv if a.startswith("--config.")]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/demo.py", help="configs/*.py[:variant]")
    p.add_argument("--epochs", type=int, default=2, help="epochs to run (>= 1)")
    p.add_argument("--interval", type=float, default=0.1, help="seconds between RSS samples")
    p.add_argument("--tracemalloc", action="store_true", help="Python heap peak per phase")
    p.add_argument("--plot", default="", help="PNG of RSS over time (matplotlib)")
    p.add_argument("--name", default="memory_profile", help="the result's file prefix")
    p.add_argument("--no_record", action="store_true", help=NO_RECORD_HELP)
    args = p.parse_args([a for a in argv if not a.startswith("--config.")])
    if args.epochs < 1:
        sys.exit(f"error: --epochs={args.epochs} must be >= 1")
    if not re.fullmatch(r"[A-Za-z0-9_.]+", args.name):
        sys.exit(f"error: --name={args.name!r}: letters, digits, '_' and '.' only")
    config = load_config(args.config, overrides)
    load = os.getloadavg()[0]
    import jaxsocial.train.run  # noqa: F401 -- the run's modules, JAX among them
    with tempfile.TemporaryDirectory(prefix="memory_profile-") as workdir, \
            Sampler(args.interval, args.tracemalloc) as sampler:
        figures = profile(config, args.epochs, workdir, sampler)
        figures["rss_after_imports_gib"] = round(sampler.samples[0][1] / GiB, 3)
    peak = max(b for _, b in sampler.samples) / GiB
    figures.update(config=args.config, overrides=overrides, epochs=args.epochs,
                   peak_rss_gib=round(peak, 3), phases=sampler.phases,
                   load_avg_1m_start=round(load, 2),
                   samples=[[round(t, 2), round(b / GiB, 3)] for t, b in sampler.samples[::5]])
    if args.plot:
        plot(sampler, args.plot if os.path.isabs(args.plot) else os.path.join(ROOT, args.plot),
             f"{args.config} {' '.join(overrides)}")
    predicted = figures["predicted"]["process_peak_gib"]
    figures["predicted_over_measured"] = round(predicted / peak, 3)
    print(f"peak_rss_gib={peak:.2f} predicted_gib={predicted:.2f} "
          f"(x{figures['predicted_over_measured']}) "
          f"epoch_program_gib={figures['epoch_program']['total_gib']} "
          f"micro_batch={figures['micro_batch']} (rows={figures['rows']}, "
          f"seq_len={figures['seq_len']})")
    finish(args.name, figures, record=not args.no_record)


if __name__ == "__main__":
    main()
