"""The epoch's programs compiled on abstract weights (`jaxsocial.scale.aot`): XLA's own
`memory_analysis()` of them, per device, as `train.preflight` and `benchmarks/aot_memory.py`
read it."""
import jax
import pytest

from jaxsocial.scale import aot
from jaxsocial.train import sharding


def test_per_device_bytes_counts_shards():
    mesh = sharding.make_mesh((1, 8, 1))
    spec = jax.sharding.PartitionSpec("fsdp", None)
    x = jax.ShapeDtypeStruct((64, 4), jax.numpy.float32,
                             sharding=jax.sharding.NamedSharding(mesh, spec))
    y = jax.ShapeDtypeStruct((64, 4), jax.numpy.bfloat16,
                             sharding=sharding.replicated(mesh))
    assert aot.per_device_bytes(x) == 8 * 4 * 4
    assert aot.per_device_bytes([x, y]) == 8 * 4 * 4 + 64 * 4 * 2


@pytest.mark.parametrize("scan_layers,mesh_shape", [(False, (1, 1, 1)), (True, (1, 8, 1))])
def test_the_one_program_epoch_compiles_abstractly_and_donates_its_state(scan_layers,
                                                                         mesh_shape):
    """`aot.compile_epoch(programs=("epoch",))`: the fused epoch of demo.py:smoke compiles on
    abstract weights, and its new state reuses the donated state's buffers (alias > 0); the
    layers unrolled on one device, and scanned (`model.scan_layers`, general.py's setting)
    with fsdp over 8 devices."""
    from conftest import load_config_file

    c = load_config_file("configs/demo.py", "smoke")
    c.model.scan_layers = scan_layers
    c.mesh.shape = mesh_shape
    n = mesh_shape[0] * mesh_shape[1] * mesh_shape[2]
    run = aot.abstract_run(c, sharding.make_mesh(mesh_shape, jax.devices()[:n]))
    assert run.setup.model_config.scan_layers == scan_layers
    (mem,) = aot.compile_epoch(run, programs=("epoch",))
    state_bytes = aot.per_device_bytes(aot.abstract_state(run))
    assert mem.name == "epoch" and mem.argument >= state_bytes
    assert mem.alias >= 0.5 * aot.per_device_bytes(aot.abstract_state(run).train), mem
    assert mem.temp > 0 and mem.peak == mem.total + mem.other
    assert "program=epoch" in aot.format_report([mem])


def test_rows_split_along_the_largest_dividing_data_axes():
    """96 prompts on (data, fsdp) = (4, 16): 64 does not divide 96, so the rows go on fsdp
    (16-way, 6 per device) instead of every device holding all 96."""
    mesh = sharding.make_mesh((2, 4, 1))
    assert sharding.row_axes(mesh, "batch", 16) == ("data", "fsdp")
    assert sharding.row_axes(mesh, "batch", 12) == ("fsdp",)
    assert sharding.row_axes(mesh, "batch", 6) == ("data",)
    assert sharding.row_axes(mesh, "batch", 3) == ()
    sh = sharding.tree_data_shardings({"a": jax.numpy.zeros((12, 3)),
                                       "b": jax.numpy.zeros((3,))}, mesh)
    assert sh["a"].spec == jax.sharding.PartitionSpec("fsdp", None)
    assert sh["b"].spec == jax.sharding.PartitionSpec()
    sizes = {"data": 4, "fsdp": 16, "tensor": 1}
    assert sharding.row_axes(sizes, "batch", 96) == ("fsdp",)
