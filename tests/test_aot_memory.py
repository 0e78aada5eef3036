"""memory.estimate against XLA's own memory_analysis of the compiled PPO update (small shapes,
abstract weights: `jaxsocial.train.aot`), on 1 and 8 fake devices."""
import dataclasses

import jax
import pytest

from jaxsocial.models import llama
from jaxsocial.rl import ppo
from jaxsocial.train import aot, memory, sharding

ROWS, PROMPT, RESPONSE = 16, 24, 8


def _xla_update(mesh_shape, cfg):
    n = mesh_shape[0] * mesh_shape[1] * mesh_shape[2]
    mesh = sharding.make_mesh(mesh_shape, devices=jax.devices()[:n])
    rl = ppo.PPOConfig(ppo_epochs=1, num_minibatches=2)
    fn, args = aot.abstract_update(cfg, rl, mesh, rows=ROWS, prompt_len=PROMPT,
                                   response_len=RESPONSE)
    mem, _ = aot.program_memory("update", fn, args)
    # The state arguments alone: exactly what the run holds, whatever the compiler does.
    return mem, aot.per_device_bytes(args[0])


def _estimate(cfg, mesh_shape, **kw):
    return memory.estimate(cfg, mesh_shape, batch=ROWS, prompt_len=PROMPT,
                           response_len=RESPONSE, trajectories=ROWS,
                           train_micro_batch=ROWS // 2, remat=True, **kw)


@pytest.mark.parametrize("mesh_shape", [(1, 1, 1), (1, 8, 1)])
def test_update_estimate_within_20_percent_of_xla(mesh_shape):
    cfg = llama.preset("small_20m", dtype="bfloat16", param_dtype="bfloat16", remat=True,
                       num_hidden_layers=1)
    mem, state_bytes = _xla_update(mesh_shape, cfg)
    est = _estimate(cfg, mesh_shape)
    # Run state (policy + reference + Adam moments, bf16 like the parameters) per device.
    est_state = est.params + est.reference + est.optimizer
    assert abs(est_state - state_bytes) / state_bytes < 0.05, (est_state, state_bytes)
    assert abs(est.programs["update"] - mem.total) / mem.total < 0.2, (
        est.programs["update"] / memory.GiB, mem.total / memory.GiB)
    # Negative control: the old assumption (float32 Adam moments for bf16 parameters) is
    # rejected by the same bound on the state.
    wrong = _estimate(cfg, mesh_shape, optimizer_dtype="float32")
    wrong_state = wrong.params + wrong.reference + wrong.optimizer
    assert abs(wrong_state - state_bytes) / state_bytes > 0.2


def test_per_device_bytes_counts_shards():
    mesh = sharding.make_mesh((1, 8, 1))
    spec = jax.sharding.PartitionSpec("fsdp", None)
    x = jax.ShapeDtypeStruct((64, 4), jax.numpy.float32,
                             sharding=jax.sharding.NamedSharding(mesh, spec))
    y = jax.ShapeDtypeStruct((64, 4), jax.numpy.bfloat16,
                             sharding=sharding.replicated(mesh))
    assert aot.per_device_bytes(x) == 8 * 4 * 4
    assert aot.per_device_bytes([x, y]) == 8 * 4 * 4 + 64 * 4 * 2


def test_general_py_abstract_run_estimates_the_whole_epochs_rows():
    """configs/general.py builds as an abstract 8B run (no weights; 1 layer here), and its
    memory check sizes scoring by every trajectory of the epoch (ticks x agents acting per
    tick, 30,720 with activation), not by one tick's batch."""
    from conftest import load_config_file

    c = load_config_file("configs/general.py")
    run = aot.abstract_run(c, sharding.make_mesh((1, 1, 1), jax.devices()[:1]),
                           {"num_hidden_layers": 1})
    assert run.active == 96 and run.activation.shape == (196, 24)
    assert int(c.rollout.ticks_per_epoch) * run.active == 30_720
    full = run.memory_estimate()
    run.config.rollout.ticks_per_epoch = 8  # 768 rows: one micro-batch of 8 per 96 rows
    few = run.memory_estimate()
    # general.py scores in micro-batches of rl.micro_batch=8 rows split along the data axes:
    # the scoring pass no longer grows with the epoch's rows (only the stored batch does).
    assert full.programs["score"] < 2 * few.programs["score"]
    # Without micro-batches it holds every row at once (docs/scaling.md): 40x the rows.
    run.rl_config = dataclasses.replace(run.rl_config, micro_batch=0)
    run.config.rollout.ticks_per_epoch = 320
    all_rows = run.memory_estimate()
    run.config.rollout.ticks_per_epoch = 8
    assert all_rows.programs["score"] > 10 * run.memory_estimate().programs["score"]
    # The rollout generates B rows per tick either way (only its [T, B] outputs grow).
    assert full.programs["rollout"] == pytest.approx(few.programs["rollout"], rel=0.01)
    # Query-blocked attention (model.attention_chunk=256): without it, every layer's prefill
    # scores [96, heads, 1472, S] are counted (XLA: 1718 vs 52 GiB per device on (1, 8, 1)).
    assert run.model_config.attention_chunk == 256
    run.model_config = run.model_config.replace(num_hidden_layers=32)  # the 8B's depth
    chunked = run.memory_estimate().programs["rollout"]
    run.model_config = run.model_config.replace(attention_chunk=0)
    assert run.memory_estimate().programs["rollout"] > 10 * chunked


def test_the_one_program_epoch_compiles_abstractly_and_donates_its_state():
    """`aot.compile_epoch(programs=("epoch",))`: the fused epoch of demo.py:smoke compiles on
    abstract weights, and its new state reuses the donated state's buffers (alias > 0)."""
    from conftest import load_config_file

    c = load_config_file("configs/demo.py", "smoke")
    run = aot.abstract_run(c, sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    (mem,) = aot.compile_epoch(run, programs=("epoch",))
    state_bytes = aot.per_device_bytes(aot.abstract_state(run))
    assert mem.name == "epoch" and mem.argument >= state_bytes
    assert mem.alias >= 0.5 * aot.per_device_bytes(aot.abstract_state(run).train), mem
