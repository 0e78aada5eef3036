"""The LoRA forward (`lora.adapt`: x @ W + s * (x @ A) @ B, the only training path) against a
reference written here from explicitly merged weights W + s * A @ B: logits and the loss
gradient with respect to A and B agree within float32 rounding; a wrong scale does not."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxsocial.models import llama
from jaxsocial.rl import lora as lora_lib

# Relative to the reference's largest magnitude: the reordered float32 sums differ by about
# 1e-5 (logits) and 6e-5 (gradients) here; a 1% wrong scale by 1e-2 or more.
TOL = 2e-4


def merged(base, adapters, scale):
    """base with every adapted kernel replaced by W + scale * A @ B (plain jnp, float32)."""
    if isinstance(adapters, dict) and set(adapters) == {"a", "b"}:
        return base + scale * (adapters["a"] @ adapters["b"])
    return {k: merged(v, adapters[k], scale) if k in adapters else v for k, v in base.items()}


def _close(x, ref) -> bool:
    return float(jnp.max(jnp.abs(x - ref))) <= TOL * float(jnp.max(jnp.abs(ref)))


def _loss(graphdef, weights, ids, mask):
    """Mean next-token cross-entropy of the tokens themselves; -> (loss, logits [B, T, V])."""
    logits = nnx.merge(graphdef, weights).forward(ids, mask).logits
    lp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    nll = -jnp.take_along_axis(lp, ids[:, 1:, None], axis=-1)[..., 0]
    return jnp.sum(nll * mask[:, 1:]) / jnp.sum(mask[:, 1:]), logits


@pytest.mark.parametrize("scan", [False, True])
def test_adapted_forward_and_gradients_equal_the_merged_weights(scan):
    cfg = llama.preset("tiny", scan_layers=scan)
    graphdef, state = nnx.split(llama.init(cfg, 0))
    base = nnx.to_pure_dict(state)
    lc = lora_lib.LoraConfig(rank=4, alpha=8.0)
    # B = 0 at init would make the check trivial: random B (and A as initialised)
    ads = lora_lib.init_adapters(base, lc, jax.random.key(1))
    ads = jax.tree.map(lambda x, k: x + 0.3 * jax.random.normal(k, x.shape),
                       ads, jax.tree.unflatten(jax.tree.structure(ads), list(
                           jax.random.split(jax.random.key(2), len(jax.tree.leaves(ads))))))
    ids = jax.random.randint(jax.random.key(3), (3, 10), 3, cfg.vocab_size)
    mask = jnp.ones((3, 10), bool).at[0, :4].set(False)  # some left padding

    def adapted(a):
        return _loss(graphdef, lora_lib.adapt(base, a, lc), ids, mask)

    def reference(a, scale=lc.scale):
        return _loss(graphdef, merged(base, a, scale), ids, mask)

    (loss, logits), grads = jax.value_and_grad(adapted, has_aux=True)(ads)
    (ref_loss, ref_logits), ref_grads = jax.value_and_grad(reference, has_aux=True)(ads)
    assert _close(logits, ref_logits)
    assert _close(loss, ref_loss)
    for g, rg in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        assert float(jnp.max(jnp.abs(rg))) > 0
        assert _close(g, rg)
    # Negative control: a scale 1% off is rejected by the same tolerance (logits and gradients).
    (_, wrong_logits), wrong_grads = jax.value_and_grad(
        lambda a: reference(a, 1.01 * lc.scale), has_aux=True)(ads)
    assert not _close(logits, wrong_logits)
    assert not any(_close(g, wg) for g, wg in zip(jax.tree.leaves(grads),
                                                  jax.tree.leaves(wrong_grads)))


def test_export_merges_the_adapters_and_the_forward_does_not():
    """`merged_weights_for_export` holds W + s A @ B (dtype of W) and gives the adapted
    forward's logits; `adapt` leaves the base's kernels as they are."""
    cfg = llama.preset("tiny", num_hidden_layers=1)
    graphdef, state = nnx.split(llama.init(cfg, 0))
    base = nnx.to_pure_dict(state)
    lc = lora_lib.LoraConfig(rank=2, alpha=4.0)
    ads = jax.tree.map(lambda x: x + 0.1, lora_lib.init_adapters(base, lc, jax.random.key(0)))
    exported = lora_lib.merged_weights_for_export(base, ads, lc)
    q = exported["layers"][0]["self_attn"]["q_proj"]
    assert q.dtype == base["layers"][0]["self_attn"]["q_proj"].dtype
    assert _close(q, merged(base, ads, lc.scale)["layers"][0]["self_attn"]["q_proj"])
    adapted = lora_lib.adapt(base, ads, lc)["layers"][0]["self_attn"]["q_proj"]
    assert adapted.w is base["layers"][0]["self_attn"]["q_proj"]
    ids = jax.random.randint(jax.random.key(1), (2, 6), 3, cfg.vocab_size)
    np.testing.assert_allclose(nnx.merge(graphdef, exported)(ids),
                               nnx.merge(graphdef, lora_lib.adapt(base, ads, lc))(ids),
                               atol=1e-4)
