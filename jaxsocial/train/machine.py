"""How much memory this machine has: one accelerator's, or the RAM the CPU devices share."""

from __future__ import annotations

import os
from typing import Optional, Tuple

import jax

GiB = 1024 ** 3


def device_memory_bytes() -> Optional[int]:
    """Memory of the first local device, when the backend reports it (GPU/TPU)."""
    stats = getattr(jax.local_devices()[0], "memory_stats", lambda: None)()
    return None if not stats else stats.get("bytes_limit")


def host_memory_bytes() -> int:
    """This machine's RAM as this process may use it: the physical memory
    (`os.sysconf('SC_PHYS_PAGES') * SC_PAGE_SIZE`, else /proc/meminfo's MemTotal), capped by the
    cgroup's limit when a container sets one (cgroup v2 `memory.max`, v1
    `memory.limit_in_bytes`)."""
    total = 0
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        try:
            with open("/proc/meminfo") as f:
                total = next(int(line.split()[1]) * 1024 for line in f
                             if line.startswith("MemTotal:"))
        except (OSError, StopIteration, ValueError, IndexError):
            total = 0
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                limit = int(f.read().strip())  # "max" (no limit) raises ValueError
        except (OSError, ValueError):
            continue
        if 0 < limit < (total or limit + 1):
            total = limit
    return int(total)


def machine_memory() -> Tuple[int, str, bool]:
    """(bytes, what, per_device): the memory of one local device when the backend reports it
    (`device_memory_bytes`: GPU/TPU, per_device True), else this machine's RAM
    (`host_memory_bytes`: the CPU backend, whose devices all share it, per_device False).
    Starts the backend if it is not started yet."""
    device = device_memory_bytes()
    if device:
        return int(device), "device memory", True
    return host_memory_bytes(), "RAM", False
