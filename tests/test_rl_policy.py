"""policy.evaluate / score_batch against the model's own full forward, done independently."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import jaxpr_shapes
from flax import nnx
from test_rl_common import RESP, standard_prompts, tiny_policy

from jaxsocial.rl import buffer, ppo
from jaxsocial.rl import policy as policy_lib


def _batch():
    prompt, pmask = standard_prompts()
    b = prompt.shape[0]
    toks = jax.random.randint(jax.random.PRNGKey(0), (b, RESP), 3, 32)
    lengths = jax.random.randint(jax.random.PRNGKey(1), (b,), 1, RESP + 1)
    rmask = jnp.arange(RESP)[None] < lengths[:, None]
    return buffer.make_trajectory(prompt, pmask, toks, rmask, scores=jnp.zeros(b))


def test_evaluate_matches_full_forward_in_numpy():
    pdef, params, ref = tiny_policy("head")
    head = {"kernel": jax.random.normal(jax.random.PRNGKey(2), (32,)), "bias": jnp.float32(0.3)}
    params = {"policy": params["policy"], "value": {"head": head}}
    batch = _batch()
    cfg = ppo.PPOConfig(temperature=0.7)
    ev = policy_lib.evaluate(pdef, params, ref, batch, cfg, with_entropy=True)

    model = nnx.merge(pdef.graphdef, params["policy"])
    ids = np.concatenate([batch.prompt_tokens, batch.response_tokens], 1)
    mask = np.concatenate([batch.prompt_mask, batch.response_mask], 1)
    out = model.forward(jnp.asarray(ids), jnp.asarray(mask))
    logits = np.asarray(out.logits, np.float64)
    hidden = np.asarray(out.hidden, np.float64)
    p = batch.prompt_len
    b, r = batch.response_tokens.shape
    want_lp = np.zeros((b, r))
    want_ent = np.zeros((b, r))
    want_v = np.zeros((b, r))
    for i in range(b):
        for t in range(r):
            z = logits[i, p - 1 + t] / 0.7
            z = z - z.max()
            logp = z - np.log(np.exp(z).sum())
            want_lp[i, t] = logp[int(batch.response_tokens[i, t])]
            want_ent[i, t] = -(np.exp(logp) * logp).sum()
            want_v[i, t] = hidden[i, p - 1 + t] @ np.asarray(head["kernel"]) + 0.3
    m = np.asarray(batch.response_mask)
    np.testing.assert_allclose(np.asarray(ev.logprobs)[m], want_lp[m], atol=1e-5)
    np.testing.assert_allclose(np.asarray(ev.entropy)[m], want_ent[m], atol=1e-4)
    np.testing.assert_allclose(np.asarray(ev.values)[m], want_v[m], atol=1e-4)

    lp, ref_lp, values = policy_lib.score_batch(pdef, params, ref, batch, cfg)
    np.testing.assert_allclose(np.asarray(lp)[m], want_lp[m], atol=1e-5)
    assert np.all(np.asarray(lp)[~m] == 0) and np.all(np.asarray(values)[~m] == 0)
    np.testing.assert_allclose(np.asarray(ref_lp), np.asarray(lp), atol=1e-6)  # ref = init


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_entropy_gradient_only_when_asked(entropy_grad):
    pdef, params, ref = tiny_policy("head")
    batch = _batch()
    cfg = ppo.PPOConfig(temperature=1.0)

    def ent(params):
        ev = policy_lib.evaluate(pdef, params, ref, batch, cfg, with_values=False,
                                 with_entropy=True, entropy_grad=entropy_grad)
        return jnp.sum(ev.entropy)

    g = jax.grad(ent)(params)
    norm = float(jnp.sqrt(sum(jnp.sum(x ** 2) for x in jax.tree.leaves(g["policy"]))))
    assert (norm > 0) == entropy_grad


def test_score_batch_in_micro_batches_equals_all_rows_at_once():
    """rl.micro_batch chunks the scoring pass (strided rows, lax.map): same numbers, and no
    intermediate holds more than a chunk's rows of the model's activations."""
    pdef, params, ref = tiny_policy("head")
    # A policy that differs from the reference, so log-probs and reference log-probs differ.
    params = jax.tree.map(lambda x: x * 1.1 if x.ndim > 1 else x, params)
    batch = _batch()
    b = batch.batch_size
    assert b % 4 == 0 and b > 4
    whole = policy_lib.score_batch(pdef, params, ref, batch, ppo.PPOConfig(temperature=0.7))
    cfg = ppo.PPOConfig(temperature=0.7, micro_batch=b // 4)
    chunked = policy_lib.score_batch(pdef, params, ref, batch, cfg)
    assert not np.allclose(whole[0], whole[1])  # policy != reference: the rows carry signal
    for w, c in zip(whole, chunked):
        np.testing.assert_allclose(np.asarray(c), np.asarray(w), atol=1e-6)
    # Negative control: rows merged back in the wrong order do not match.
    rolled = np.roll(np.asarray(chunked[0]), 1, axis=0)
    assert not np.allclose(rolled, np.asarray(whole[0]), atol=1e-6)
    # The chunked program's largest intermediates have b // 4 rows, the unchunked one's b.
    seq = batch.prompt_len + batch.response_tokens.shape[1]

    def attn_rows(cfg):
        shapes = jaxpr_shapes(lambda p, r, t: policy_lib.score_batch(pdef, p, r, t, cfg),
                              params, ref, batch)
        # attention scores [rows, kv_heads, group, S, S]
        return {s[0] for s in shapes if len(s) == 5 and s[-2:] == (seq, seq)}
    assert attn_rows(cfg) == {b // 4}
    assert attn_rows(ppo.PPOConfig(temperature=0.7)) == {b}
    with pytest.raises(ValueError, match="micro_batch=3 does not divide"):
        policy_lib.score_batch(pdef, params, ref, batch, ppo.PPOConfig(micro_batch=3))
