"""Mesh construction and logical-axis rules."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxsocial.models import llama
from jaxsocial.train import sharding


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


@pytest.mark.parametrize("switches", [{}, dict(qkv_bias=True, o_bias=True, qk_norm=True,
                                               model_type="qwen3")])
def test_parameter_count_of_every_family_matches_the_model(switches):
    """`LlamaConfig.num_params` counts what the NNX model holds (biases, QK-norm)."""
    cfg = llama.preset("tiny", head_dim=24, **switches)
    model = llama.init(cfg)
    actual = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert actual == cfg.num_params()


def _saved_residual_bytes(fn, *args):
    """Bytes of the residuals jax saves for fn's backward pass (parsed from the public
    `print_saved_residuals`, lines like `f32[4,128,64] from ...`)."""
    import contextlib
    import io
    import re

    from jax.ad_checkpoint import print_saved_residuals
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_saved_residuals(fn, *args)
    total = 0
    for dtype, dims in re.findall(r"^\s*([a-z]+\d*)\[([\d,]*)\]", buf.getvalue(), re.M):
        bits = int(re.sub(r"\D", "", dtype) or 8)  # f32 -> 32, bool -> 8
        total += int(np.prod([int(d) for d in dims.split(",") if d] or [1])) * bits // 8
    return total


def test_remat_same_gradients_fewer_saved_residuals():
    def run(remat):
        cfg = llama.preset("tiny", num_hidden_layers=4, remat=remat)
        g, st = nnx.split(llama.init(cfg))
        ids = jnp.arange(4 * 128, dtype=jnp.int32).reshape(4, 128) % cfg.vocab_size

        def loss(st):
            return jnp.mean(nnx.merge(g, st).forward(ids).hidden ** 2)
        saved = _saved_residual_bytes(loss, st)
        return jax.jit(jax.value_and_grad(loss))(st), saved
    (l0, g0), s0 = run(False)
    (l1, g1), s1 = run(True)
    np.testing.assert_allclose(float(l0), float(l1), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # Remat keeps each layer's input instead of every intermediate (23.5 MB -> ~2 MB here).
    assert s1 < 0.2 * s0, (s0, s1)


def test_society_ticks_sharded_along_users_equal_one_device():
    """With a data axis > 1 the society's per-user arrays are split along the `agents` rule;
    crowd ticks on 8 fake devices give the same state as on one."""
    import functools

    from jaxsocial.social import society

    params = society.make_params(num_users=512, num_agents=8, num_personas=4, embed_dim=16,
                                 post_capacity=512, content_len=8, num_seed_posts=64,
                                 feed_size=4, pool_size=64, max_active=64, crowd_budget=128)
    state = society.reset(jax.random.key(0), params)
    step = jax.jit(functools.partial(society.step, actions=None, params=params))
    mesh = sharding.make_mesh((2, 2, 2))
    sh = sharding.society_shardings(state, mesh)
    assert sh.users.interest.spec[0] == ("data", "fsdp")  # split, not replicated
    assert sh.posts.likes.spec == jax.sharding.PartitionSpec()
    assert sharding.society_shardings(state, sharding.make_mesh((1, 8, 1))).users.interest \
        .spec == jax.sharding.PartitionSpec()  # no data axis: replicated
    one, eight = state, jax.device_put(state, sh)
    for k in jax.random.split(jax.random.key(1), 3):
        one, _ = step(k, one)
        eight, _ = step(k, eight)
    assert eight.users.interest.sharding.spec[0] == ("data", "fsdp")
    assert int(one.posts.likes.sum()) > 0  # the crowd did something
    a, b = jax.device_get(one), jax.device_get(eight)
    for path, x in jax.tree_util.tree_flatten_with_path(a)[0]:
        y = jax.tree_util.tree_flatten_with_path(b)[0]
        np.testing.assert_allclose(np.asarray(dict(y)[path]), np.asarray(x), atol=1e-6,
                                   err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_train_state_shardings_follow_the_model_metadata_and_optax(lora_rank):
    """Adam's moments get their parameter's sharding (optax.tree_map_params), the reference
    the model's, LoRA adapters their kernel's, counters / value head are replicated."""
    from jaxsocial.rl import lora as lora_lib
    from jaxsocial.rl import ppo
    from jaxsocial.scale import aot

    cfg = llama.preset("small_20m", num_hidden_layers=1)
    mesh = sharding.make_mesh((1, 8, 1))
    lora = lora_lib.LoraConfig(rank=lora_rank) if lora_rank else None
    _, (train, _) = aot.abstract_update(cfg, ppo.PPOConfig(), mesh, rows=8, prompt_len=4,
                                        response_len=4, lora=lora)
    adam = [s for s in jax.tree.leaves(train.opt_state, is_leaf=lambda x: isinstance(
        x, optax.ScaleByAdamState)) if isinstance(s, optax.ScaleByAdamState)][0]
    ref_q = train.ref_params["layers"][0]["self_attn"]["q_proj"].sharding.spec
    assert ref_q != jax.sharding.PartitionSpec()  # embed dim split along fsdp
    assert adam.count.sharding.spec == jax.sharding.PartitionSpec()
    assert train.params["value"]["head"]["kernel"].sharding.spec == jax.sharding.PartitionSpec()
    for moment in (adam.mu, adam.nu):
        for p, m in zip(jax.tree.leaves(train.params), jax.tree.leaves(moment)):
            assert m.sharding == p.sharding and m.shape == p.shape
    if lora_rank:  # A along the kernel's input axis, B along its output axis
        q = train.params["policy"]["layers"][0]["self_attn"]["q_proj"]
        ref_o = train.ref_params["layers"][0]["self_attn"]["o_proj"].sharding.spec
        o = train.params["policy"]["layers"][0]["self_attn"]["o_proj"]
        P = jax.sharding.PartitionSpec
        assert q["a"].sharding.spec == P(ref_q[0], None) and ref_q[0] is not None
        assert o["b"].sharding.spec == P(None, ref_o[1] if len(ref_o) > 1 else None)
        assert q["a"].sharding.spec != P()  # control: not replicated
        # the MLP's intermediate axis, whole in W without tensor parallelism: along fsdp
        up = train.params["policy"]["layers"][0]["mlp"]["up_proj"]
        assert up["b"].sharding.spec == P(None, "fsdp")
    else:
        assert train.params["policy"]["layers"][0]["self_attn"]["q_proj"].sharding.spec == ref_q


def test_adapters_follow_their_kernels_in_and_out_axes_with_tensor_parallelism():
    """On a (1, 4, 2) mesh: A takes W's `in` axis and B its `out` axis (tensor or fsdp, as W
    splits them); the cohorts' stacked [K, ...] adapters and the in-layer pin of
    `gather_in_place` use the same rule (`partitioning.adapter_specs`)."""
    from jaxsocial.models import partitioning
    from jaxsocial.rl import lora as lora_lib
    from jaxsocial.rl import ppo
    from jaxsocial.scale import aot

    P = jax.sharding.PartitionSpec
    cfg = llama.preset("small_20m", num_hidden_layers=1)
    mesh = sharding.make_mesh((1, 4, 2))
    _, (train, _) = aot.abstract_update(cfg, ppo.PPOConfig(), mesh, rows=8, prompt_len=4,
                                        response_len=4, lora=lora_lib.LoraConfig(rank=4))
    ref, pol = train.ref_params["layers"][0], train.params["policy"]["layers"][0]
    for block, name in (("self_attn", "q_proj"), ("mlp", "up_proj"), ("mlp", "down_proj")):
        w = ref[block][name].sharding.spec
        ad = pol[block][name]
        assert ad["a"].sharding.spec == P(w[0], None), name
        assert ad["b"].sharding.spec == P(None, w[1]), name
    assert pol["mlp"]["up_proj"]["b"].sharding.spec == P(None, "tensor")
    assert pol["mlp"]["down_proj"]["b"].sharding.spec == P(None, "fsdp")
    # stacked cohorts [K, in, r] / [K, r, out]: the leading axis replicated
    sa, sb = partitioning.adapter_specs(P("fsdp", "tensor"), (3, 384, 4), (3, 4, 1024), mesh)
    assert (sa, sb) == (P(None, "fsdp", None), P(None, None, "tensor"))
    # W whole along an axis fsdp divides: that axis on fsdp; one it does not divide: whole
    sa, sb = partitioning.adapter_specs(P(None, None), (384, 4), (4, 1022), mesh)
    assert (sa, sb) == (P("fsdp", None), P(None, None))
