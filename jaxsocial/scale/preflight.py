"""Pre-flight: compile a run's epoch for its target and compare the compiler's bytes with the
target's memory, before anything is trained.

    python launch/train.py --config=configs/general.py --config.train.preflight=tpu:v5e:8x8

`train.preflight` names the target (`scale.targets`: `tpu:<chip>:<topology>`,
`gpu:<h100|h200>:<n>`, or `auto`: this process's own devices). The run's programs are built as
the trainer builds them (`train.run.abstract_run`: the same set-up, `jax.eval_shape` of the
same weight initialiser) on a mesh of `mesh.shape` over the target's devices, compiled by the
target's compiler, and `compiled.memory_analysis()` gives each program's per-device bytes.
A run whose largest program needs more than one device's memory is refused in one line.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional

from absl import logging

from jaxsocial.scale import aot, targets

GiB = 1024 ** 3
WARN_SHARE = 0.9  # warn above 90% of the device's memory


@dataclasses.dataclass(frozen=True)
class Preflight:
    """What the target's compiler says of a run's programs."""

    target: targets.Target
    mesh_shape: tuple
    preset: str
    programs: List[aot.ProgramMemory]

    @property
    def peak(self) -> int:
        return aot.epoch_peak(self.programs)

    @property
    def fits(self) -> bool:
        return self.peak <= self.target.memory_bytes

    def lines(self) -> List[str]:
        """One line per program: the compiler's argument / output / temp / total bytes per
        device, the buffers the loop keeps beside it, against the device's memory."""
        t = self.target
        mesh = "x".join(str(s) for s in self.mesh_shape)
        return [f"target={t.name} mesh={mesh} preset={self.preset} program={p.name} "
                f"arg_gib={p.argument / GiB:.2f} out_gib={p.output / GiB:.2f} "
                f"temp_gib={p.temp / GiB:.2f} total_gib={p.total / GiB:.2f} "
                f"peak_gib={p.peak / GiB:.2f} hbm_gib={t.memory_bytes / GiB:.1f} "
                f"fits={str(p.peak <= t.memory_bytes).lower()} compiler={t.compiler!r} "
                f"compile_s={p.compile_s:.0f}" for p in self.programs]


def preflight(config, target: Optional[str] = None, model_overrides=None,
              checked: bool = False) -> Preflight:
    """Compile `config`'s epoch for `target` (default: `config.train.preflight`): the one
    donated program, or the three of the host-reward path. model_overrides: LlamaConfig fields
    replacing the model's (e.g. fewer layers, for a test); checked: the caller has run
    `checks.check`."""
    spec = target or str(config.train.get("preflight", "") or "")
    if not spec:
        raise ValueError("no target: set --config.train.preflight (e.g. tpu:v5e:8x8 or auto)")
    tgt = targets.resolve(spec)
    mesh = targets.mesh(tgt, tuple(config.mesh.shape))
    run = aot.abstract_run(config, mesh, model_overrides, checked=checked)
    names = ("epoch",) if run.setup.fused else ("rollout", "score", "update")
    progs = aot.compile_epoch(run, programs=names)
    return Preflight(target=tgt, mesh_shape=tuple(mesh.shape.values()),
                     preset=str(config.model.checkpoint or config.model.preset), programs=progs)


def check(config) -> Optional[Preflight]:
    """`train.preflight`, if set, for a config `checks.check` passed: log the compiler's figures
    and raise ValueError (one line) when the epoch does not fit one device of the target; warn
    above 90%."""
    if not str(config.train.get("preflight", "") or ""):
        return None
    report = preflight(config, checked=True)
    for line in report.lines():
        logging.info("preflight: %s", line)
        print(line, flush=True)
    limit = report.target.memory_bytes
    if not report.fits:
        raise ValueError(f"train.preflight={report.target.name!r}: the epoch needs "
                         f"{report.peak / GiB:.1f} GiB per device by {report.target.compiler}'s "
                         f"count, more than the device's {limit / GiB:.1f} GiB (mesh.shape="
                         f"{report.mesh_shape}); lower rl.micro_batch, rollout.max_new_tokens "
                         f"or agents.active_per_tick, or use more devices")
    if report.peak > WARN_SHARE * limit:
        logging.warning("train.preflight=%r: the epoch needs %.1f GiB per device, over 90%% of "
                        "the device's %.1f GiB", report.target.name, report.peak / GiB,
                        limit / GiB)
    return report
