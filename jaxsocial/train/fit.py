"""Will this run fit this machine? Asked of the compiler: the epoch program compiled (as it must
be to run), XLA's `memory_analysis()` of it, plus what the process already holds.

    fit.check_state(config)                         # before anything is built; may refuse
    run, compiled, pred = fit.fit_run(run, state)   # before the first epoch; may refuse

Before anything is built, `check_state` refuses a run whose state alone (weights, optimizer
state, society: `jax.eval_shape` of their initialisers) cannot fit, naming the key behind its
largest part; such a run could not even be set up.

On the CPU the devices live in this process and share its RAM, so the run's peak is predicted
as the resident set once the run is built (the runtime, the weights, the text banks, the
state, the compiled code) plus, per local device, the program's temporaries and the outputs
that do not reuse a donated argument's buffer (the arguments, the state, are in that resident
set already). On a GPU or TPU it is one device's arguments + outputs - aliased + temporaries
against that device's memory. A prediction over the machine's memory refuses the run in one
line; with an automatic micro-batch (`rl.micro_batch=0`, `train.config.micro_batch`) the
micro-batch is halved first, and the smaller program compiled and asked again.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
from typing import Any, Dict, Optional, Tuple

import jax
from absl import logging

from jaxsocial.train import config as run_config
from jaxsocial.train import machine as machine_lib
from jaxsocial.train import setup as setup_lib
from jaxsocial.train import sharding

GiB = 2 ** 30

# The parts of a run's state, what each holds and the key that sizes it (`state_parts`).
_PARTS = {
    "model": "the weights, reference and optimizer state",
    "society.post_capacity": "the society's post ring",
    "society.num_users": "the society's per-user arrays",
    "agents.num_agents": "the agents' inboxes",
}


def tree_bytes(tree) -> int:
    """Bytes of a pytree of arrays or ShapeDtypeStructs, every leaf whole."""
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree)
               if hasattr(x, "shape"))


def state_parts(state) -> Dict[str, int]:
    """Bytes of a RunState by the config key that sizes them (`_PARTS`)."""
    soc = state.society
    return {"model": tree_bytes(state.train),
            "society.post_capacity": tree_bytes(soc.posts),
            "society.num_users": tree_bytes((soc.users, soc.graph, soc.memory)),
            "agents.num_agents": tree_bytes(soc.inbox)}


def check_state(config, mesh=None) -> None:
    """Refuse (ValueError, one line) a run whose state alone exceeds this machine's memory:
    the weights, optimizer state and society `init_state` would build, as `jax.eval_shape`
    gives them (`setup.config_state`; nothing is built). The line names the config key behind
    the largest part. On the CPU the devices share the RAM, which must hold the state at least
    once; on a GPU / TPU one device must hold at least its even share over the mesh. Skipped
    in a multi-process run (JAX's backend must not start before `jax.distributed.initialize`)."""
    c = config
    if bool(run_config.config_get(c, "distributed.enabled", False)) or os.environ.get(
            "JAX_COORDINATOR_ADDRESS"):
        return
    parts = state_parts(setup_lib.config_state(c))
    limit, kind, per_device = machine_lib.machine_memory()
    total = sum(parts.values())
    devices = mesh.size if mesh is not None else _mesh_devices(c)
    need = -(-total // devices) if per_device else total
    if need <= limit:
        return
    key = max(parts, key=parts.get)
    per = f" per device over mesh.shape={tuple(c.mesh.shape)}" if per_device else ""
    name, advice = _name(c, key, per_device)
    raise ValueError(
        f"{name}: the run's state needs {_gib(need)} GiB{per} before its first epoch "
        f"({_PARTS[key]}: {_gib(parts[key])} of {_gib(total)} GiB, by jax.eval_shape of its "
        f"initialisers), more than this machine's {limit / GiB:.1f} GiB of {kind}; {advice}")


def _mesh_devices(config) -> int:
    try:
        return math.prod(sharding.resolve_mesh_shape(tuple(config.mesh.shape),
                                                     jax.device_count()))
    except ValueError:  # the set-up names a mesh that does not fit the devices
        return jax.device_count()


def _name(config, key: str, per_device: bool) -> Tuple[str, str]:
    """(`key=value` as the refusal names it, what to do about it)."""
    c = config
    if key == "model":
        name = (f"model.checkpoint={c.model.checkpoint!r}" if c.model.get("checkpoint", "")
                else f"model.preset={c.model.preset!r}")
        shard = "shard it over more devices (mesh.shape), " if per_device else ""
        return name, f"{shard}train LoRA adapters (rl.lora_rank) or use a smaller model"
    users, agents = int(c.society.num_users), int(c.agents.num_agents)
    if key == "society.num_users" and users == agents:  # it may not go below num_agents
        return (f"agents.num_agents={agents}, society.num_users={users}",
                "lower agents.num_agents and society.num_users")
    return f"{key}={run_config.config_get(c, key)}", f"lower {key}"


def _gib(n: float) -> str:
    return f"{n / GiB:,.0f}" if n >= 10 * GiB else f"{n / GiB:.1f}"


def resident_bytes() -> int:
    """This process's resident set (/proc/self/status VmRSS; 0 where there is no /proc)."""
    try:
        with open("/proc/self/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f
                         if line.startswith("VmRSS:")), 0)
    except OSError:
        return 0


def release_freed_memory() -> None:
    """Hand the heap that glibc's malloc keeps after frees back to the system (`malloc_trim`).
    XLA's compile of an epoch frees about as much as it keeps, and glibc holds on to it: on the
    demo the resident set fell from 2.24 to 1.14 GiB after the compile (docs/train.md,
    "Memory"). A no-op where the C library has no malloc_trim."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass


def peak_resident_bytes() -> int:
    """This process's largest resident set so far (getrusage's ru_maxrss; 0 where absent)."""
    try:
        import resource
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB
    except (ImportError, OSError):
        return 0


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A compiled epoch's predicted peak against the machine, bytes. resident: the process's
    resident set when asked (CPU; 0 on a GPU/TPU); program: what the program adds (CPU: its
    temporaries and unaliased outputs on every local device; GPU/TPU: one device's arguments
    + outputs - aliased + temporaries); peak = resident + program; limit: the machine's RAM
    or one device's memory (`kind`)."""

    resident: int
    program: int
    temp: int
    arguments: int
    outputs: int
    alias: int
    devices: int
    limit: int
    kind: str
    seen: int = 0  # the process's largest resident set so far (CPU: the compile, set-up)

    @property
    def peak(self) -> int:
        """The epoch's predicted peak (what is judged against `limit`)."""
        return self.resident + self.program

    @property
    def process_peak(self) -> int:
        """The whole process's predicted peak: the epoch's, or what set-up and the compile
        already reached, whichever is larger."""
        return max(self.peak, self.seen)

    @property
    def fits(self) -> bool:
        return self.peak <= self.limit

    def line(self) -> str:
        held = (f"{self.resident / GiB:.2f} GiB held by the process + "
                if self.resident else "")
        each = f" on each of {self.devices} devices" if self.devices > 1 else ""
        return (f"{held}{self.program / GiB:.2f} GiB for the epoch program (XLA: temporaries "
                f"{self.temp / GiB:.2f}, outputs {self.outputs / GiB:.2f}, arguments "
                f"{self.arguments / GiB:.2f}, aliased {self.alias / GiB:.2f} GiB{each}) = "
                f"{self.peak / GiB:.2f} GiB of this machine's {self.limit / GiB:.1f} GiB of "
                f"{self.kind}")


def predict(compiled: Any, devices: int, machine: Optional[Tuple[int, str, bool]] = None
            ) -> Prediction:
    """The `Prediction` of a compiled program run on `devices` local devices (CPU: they share
    the RAM). machine: `train.machine.machine_memory()` unless given."""
    ma = compiled.memory_analysis()
    temp, args = int(ma.temp_size_in_bytes), int(ma.argument_size_in_bytes)
    out, alias = int(ma.output_size_in_bytes), int(ma.alias_size_in_bytes)
    limit, kind, per_device = machine or machine_lib.machine_memory()
    if per_device:
        return Prediction(0, args + out - alias + temp, temp, args, out, alias, 1, limit, kind)
    n = max(1, int(devices))
    return Prediction(resident_bytes(), n * (temp + max(0, out - alias)), temp, args, out,
                      alias, n, limit, kind, seen=peak_resident_bytes())


def fit_run(run, state) -> Tuple[Any, Any, Prediction]:
    """(run, compiled epoch, prediction) for `run` about to train from `state`: the epoch
    compiled for `state`'s shapes and shardings (`Run.compile_epoch`) and checked against the
    machine. An automatic micro-batch that does not fit is halved (the run rebuilt with
    `setup.with_micro_batch`) until it does; a run that cannot fit raises ValueError in one
    line naming what it needs and the keys that shrink it."""
    devices = len(run.mesh.local_devices)
    while True:
        compiled = run.compile_epoch(state)
        pred = predict(compiled, devices)
        setup = run.setup
        micro = int(setup.rl_config.micro_batch or 0)
        logging.info("memory: %s (micro-batch %d)", pred.line(), micro)
        if pred.fits:
            return run, compiled, pred
        rows = _minibatch_rows(setup)
        smaller = (_smaller(rows, micro or rows, run_config.micro_step(
                       setup.config, rows, tuple(setup.mesh.shape.values()))[1])
                   if run_config.micro_batch_is_automatic(setup.config) else 0)
        if not smaller:
            raise ValueError(_refusal(setup, pred, micro or rows))
        logging.warning("the epoch in micro-batches of %d rows would not fit (%s): trying %d",
                        micro or rows, pred.line(), smaller)
        run = run.with_setup(setup_lib.with_micro_batch(setup, smaller))


def _smaller(rows: int, micro: int, step: int) -> int:
    """The largest divisor of `rows` at most half of `micro`, a multiple of `step` (0: none)."""
    fits = [m for m in range(step, micro // 2 + 1, step) if rows % m == 0]
    return max(fits) if fits else 0


def _trained_active(setup) -> int:
    co = setup.cohorts
    return setup.active if co is None else co.active[co.trained[0]]


def _minibatch_rows(setup) -> int:
    c = setup.config
    return (int(c.rollout.ticks_per_epoch) * _trained_active(setup)
            // max(1, int(c.rl.num_minibatches)))


def _refusal(setup, pred: Prediction, micro: int) -> str:
    m = setup.config.model
    what = (f"model.checkpoint={m.checkpoint!r}" if m.checkpoint else
            f"model.preset={m.preset!r}") + f" on mesh.shape={tuple(setup.mesh.shape.values())}"
    return (f"{what}: the epoch would need {pred.line()} (micro-batches of {micro} rows); "
            f"shard more (mesh.shape), train LoRA adapters (rl.lora_rank), set model.remat / "
            f"model.attention_chunk, lower rl.micro_batch, or act with fewer agents per tick "
            f"(agents.active_per_tick)")
