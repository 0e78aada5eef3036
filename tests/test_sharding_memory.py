"""Mesh construction, logical-axis rules and the memory estimator."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxsocial.models import llama
from jaxsocial.train import memory, sharding


def test_mesh_shape_resolution_and_errors():
    assert sharding.resolve_mesh_shape((-1, 1, 1), 8) == (8, 1, 1)
    assert sharding.resolve_mesh_shape((2, -1, 2), 8) == (2, 2, 2)
    with pytest.raises(ValueError, match=r"\(3, 1, 1\)"):
        sharding.resolve_mesh_shape((3, 1, 1), 8)
    with pytest.raises(ValueError, match="at most one -1"):
        sharding.resolve_mesh_shape((-1, -1, 1), 8)
    mesh = sharding.make_mesh((2, 2, 2))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}


def test_parameters_are_sharded_as_the_rules_say():
    cfg = llama.preset("tiny")
    model = llama.init(cfg)
    _, state = nnx.split(model)
    mesh = sharding.make_mesh((2, 2, 2))
    placed = jax.device_put(state, sharding.state_shardings(state, mesh))
    q = placed["layers"][0]["self_attn"]["q_proj"][...]
    assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    # Each device holds a quarter of q_proj: rows split by fsdp, columns by tensor.
    assert q.addressable_shards[0].data.shape == (cfg.hidden_size // 2, q.shape[1] // 2)
    emb = placed["embed_tokens"][...]
    assert emb.sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
    norm = placed["norm"]["weight"][...]
    assert norm.sharding.spec == jax.sharding.PartitionSpec(None)
    # Sharded forward equals the single-device forward.
    ids = jnp.arange(24, dtype=jnp.int32).reshape(2, 12) % cfg.vocab_size
    g, _ = nnx.split(model)
    sharded = jax.jit(lambda s, x: nnx.merge(g, s)(x))(placed, ids)
    np.testing.assert_allclose(np.asarray(sharded), np.asarray(model(ids)), atol=1e-5)


def test_non_divisible_dimension_is_replicated_and_unknown_name_is_an_error():
    mesh = sharding.make_mesh((1, 1, 8))
    assert sharding.logical_to_spec(("embed", "kv_heads"), (64, 12), mesh) == \
        jax.sharding.PartitionSpec(None, None)
    with pytest.raises(ValueError, match="'heads_typo'"):
        sharding.logical_to_spec(("heads_typo",), (8,), mesh)


def test_memory_estimate_matches_live_bytes_for_tiny_config():
    cfg = llama.preset("tiny")
    before = sum(a.nbytes for a in jax.live_arrays())
    model = llama.init(cfg)
    _, params = nnx.split(model, nnx.Param)
    reference = jax.tree.map(jnp.copy, params)
    opt_state = optax.adamw(1e-3).init(params)
    cache = llama.init_cache(cfg, batch=4, max_len=48)
    live = sum(a.nbytes for a in jax.live_arrays()) - before
    est = memory.estimate(cfg, (1, 1, 1), batch=4, prompt_len=32, response_len=16)
    predicted = est.params + est.reference + est.optimizer + est.kv_cache
    assert abs(predicted - live) / live < 0.3, (predicted, live)
    del reference, opt_state, cache


def test_memory_estimate_scales_with_mesh_and_warns():
    cfg = llama.preset("llama3_8b", param_dtype="bfloat16", dtype="bfloat16")
    one = memory.estimate(cfg, (1, 1, 1), batch=8, prompt_len=512, response_len=256)
    eight = memory.estimate(cfg, (1, 8, 1), batch=8, prompt_len=512, response_len=256)
    assert 7.5 < one.params / eight.params <= 8.0
    assert one.params == pytest.approx(cfg.num_params() * 2, rel=1e-6)
    assert not memory.check_fits(one, 16 * memory.GiB)
    assert memory.check_fits(eight, 1000 * memory.GiB)
