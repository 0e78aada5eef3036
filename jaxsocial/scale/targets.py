"""Machines a run's programs can be compiled for without being on them.

    target = targets.resolve("tpu:v5e:8x8")        # 64 x "TPU v5 lite", 16 GiB HBM each
    mesh = targets.mesh(target, (2, 32, 1))         # a (data, fsdp, tensor) Mesh of its devices

A target is named `tpu:<chip>:<topology>` (libtpu's own compiler: `pip install
'jaxsocial[tpu-aot]'`), `gpu:<h100|h200>:<n>` (XLA's GPU compiler from the CUDA plugin,
`jax-cuda12-plugin`, with the chip's device description), or `auto` (the devices this process
has). The TPU and GPU routes need no accelerator: JAX's deviceless topologies
(`jax.experimental.topologies`) give devices that `jit(...).lower(...).compile()` targets, and
`compiled.memory_analysis()` gives that compiler's per-device bytes. JAX must run on the CPU
platform for them (`JAX_PLATFORMS=cpu`): with the CUDA plugin loaded and no GPU, `cuInit` fails.
Several processes compiling for TPU topologies at once need `ALLOW_MULTIPLE_LIBTPU_LOAD=1`
(libtpu otherwise holds a machine-wide lock file, /tmp/libtpu_lockfile, for its process).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence, Tuple

import jax
import numpy as np

from jaxsocial.train import machine, sharding

GiB = 1024 ** 3

# HBM per chip (Google Cloud's TPU pages; NVIDIA's H100 SXM / H200 SXM data sheets).
TPU_HBM = {"v4": 32 * GiB, "v5e": 16 * GiB, "v5p": 95 * GiB, "v6e": 32 * GiB}

# XLA's GpuTargetConfigProto (text) for the GPUs we compile for: the device description the
# compiler would read from the card (SMs, shared memory, caches, bandwidth, memory size).
_GPU_INFO = """
gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth}
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: {memory}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 7 }}
runtime_version {{ major: 12 minor: 8 }}
device_description_str: "{name}"
"""
GPUS = {
    "h100": dict(name="NVIDIA H100 80GB HBM3", memory=84_929_347_584,
                 bandwidth=3_352_320_000_000),
    "h200": dict(name="NVIDIA H200", memory=150_754_820_096, bandwidth=4_800_000_000_000),
}


@dataclasses.dataclass(frozen=True)
class Target:
    """A machine to compile for: its name, its devices and one device's memory in bytes."""

    name: str
    devices: Tuple
    memory_bytes: int
    compiler: str     # "libtpu" | "XLA GPU" | the attached backend's platform


def resolve(spec: str) -> Target:
    """The target named `spec` (module docstring). Raises ValueError naming a bad spec, and
    ImportError naming the extra a compiler needs."""
    parts = str(spec).strip().split(":")
    if parts == ["auto"]:
        return _attached()
    if len(parts) == 3 and parts[0] == "tpu":
        return _tpu(parts[1], parts[2])
    if len(parts) == 3 and parts[0] == "gpu":
        return _gpu(parts[1], parts[2])
    raise ValueError(f"target {spec!r}: name one as 'tpu:<chip>:<topology>' (chips "
                     f"{', '.join(sorted(TPU_HBM))}), 'gpu:<{'|'.join(sorted(GPUS))}>:<count>' "
                     f"or 'auto'")


def _tpu(chip: str, topology: str) -> Target:
    if chip not in TPU_HBM:
        raise ValueError(f"target 'tpu:{chip}:{topology}': unknown TPU chip {chip!r}; choose "
                         f"one of {', '.join(sorted(TPU_HBM))}")
    # A deviceless compile owns no chip: it need not take libtpu's one-process lock (held by
    # any other process that loaded libtpu, e.g. a JAX program started without this package).
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        import libtpu  # noqa: F401 -- the compiler the topology needs
    except ImportError:
        raise ImportError("compiling for a TPU topology needs libtpu: "
                          "pip install -e '.[tpu-aot]'") from None
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(platform="tpu", topology_name=f"{chip}:{topology}")
    except Exception as e:  # noqa: BLE001 -- libtpu's own message names what it knows
        raise ValueError(f"target 'tpu:{chip}:{topology}': libtpu refused the topology "
                         f"({' '.join(str(e).split())[:200]})") from None
    # A chip's HBM is shared by the devices JAX shows for it (v4: one per TensorCore).
    chips = int(np.prod([int(x) for x in topology.split("x")]))
    per_device = TPU_HBM[chip] * chips // max(1, len(topo.devices))
    return Target(f"tpu:{chip}:{topology}", tuple(topo.devices), per_device, "libtpu")


def _gpu(chip: str, count: str) -> Target:
    if chip not in GPUS:
        raise ValueError(f"target 'gpu:{chip}:{count}': unknown GPU {chip!r}; choose one of "
                         f"{', '.join(sorted(GPUS))}")
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"target 'gpu:{chip}:{count}': the GPU count must be an integer >= 1")
    from jax.experimental import topologies

    info = _GPU_INFO.format(**GPUS[chip])
    try:
        topo = topologies.get_topology_desc(platform="cuda", target_config=info,
                                            topology=f"1x1x{int(count)}")
    except Exception as e:  # noqa: BLE001 -- no CUDA plugin, or JAX not on the CPU platform
        raise ImportError(f"target 'gpu:{chip}:{count}' needs the CUDA plugin "
                          f"(pip install 'jax-cuda12-plugin[with-cuda]') and JAX_PLATFORMS=cpu "
                          f"({' '.join(str(e).split())[:200]})") from None
    return Target(f"gpu:{chip}:{count}", tuple(topo.devices), GPUS[chip]["memory"], "XLA GPU")


def _attached() -> Target:
    devices = tuple(jax.devices())
    per_device = machine.device_memory_bytes()
    if per_device is None:  # the CPU: its devices share the host's RAM
        per_device = machine.host_memory_bytes() // max(1, len(devices))
    return Target("auto", devices, int(per_device), devices[0].platform)


def mesh(target: Target, shape: Sequence[int]) -> jax.sharding.Mesh:
    """A (data, fsdp, tensor) mesh of the target's devices; -1 in `shape` takes the rest.
    Raises ValueError when the shape does not use every device exactly."""
    n = len(target.devices)
    shape = tuple(int(s) for s in shape)
    known = int(np.prod([s for s in shape if s != -1]))
    if shape.count(-1) == 1 and known and n % known == 0:
        shape = tuple(n // known if s == -1 else s for s in shape)
    if int(np.prod(shape)) != n or len(shape) != len(sharding.AXES):
        raise ValueError(f"mesh.shape={shape} does not cover the {n} devices of target "
                         f"{target.name!r} (their product must be {n})")
    return jax.sharding.Mesh(np.array(target.devices).reshape(shape), sharding.AXES)
