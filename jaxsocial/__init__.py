"""jaxsocial: LLM agents trained on social reward, written as JAX."""

import importlib.util
import os

__version__ = "0.1.0"


def _no_tpu_backend_without_a_tpu() -> None:
    """libtpu is installed for compiling to TPU topologies from any machine ([tpu-aot], in
    [test]). Without a TPU chip, JAX would still start its TPU backend, and libtpu prints
    errors about missing TPU hosts before JAX falls back. On such a machine with no GPU either,
    and no JAX_PLATFORMS of the user's, JAX is pointed at the CPU, where it would end anyway."""
    if "JAX_PLATFORMS" in os.environ or importlib.util.find_spec("libtpu") is None:
        return
    try:
        from jax._src import hardware_utils  # before any backend starts; JAX's own probes
        if (hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
                or hardware_utils.has_visible_nvidia_gpu() or os.path.exists("/dev/kfd")):
            return
    except Exception:  # noqa: BLE001 -- a JAX without these probes: leave JAX to decide
        return
    os.environ["JAX_PLATFORMS"] = "cpu"  # for child processes
    import jax  # imported by the probes above, which read JAX_PLATFORMS before it was set
    jax.config.update("jax_platforms", "cpu")


_no_tpu_backend_without_a_tpu()
