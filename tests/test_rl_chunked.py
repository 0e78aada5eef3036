"""Memory that does not scale with vocab x batch x sequence:
chunked log-probs / entropy under remat, FSM states instead of [B, N, V] masks, micro-batch
accumulation, and XLA's own temp-bytes count of the compiled update."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_rl_common import (
    RESP,
    TARGET,
    compiled_update,
    count_token,
    rollout,
    standard_prompts,
    tiny_config,
    tiny_policy,
)

from jaxsocial.generation import Repeat, compile_grammar, free_text, scoring
from jaxsocial.generation import grammar as grammar_lib
from jaxsocial.generation import sampling as sampling_lib
from jaxsocial.models import llama
from jaxsocial.rl import buffer, losses, optim, ppo
from jaxsocial.rl import policy as policy_lib

B, R, H, V = 3, 10, 8, 40


def _inputs(seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    hidden = jax.random.normal(k[0], (B, R, H))
    w = 2.0 * jax.random.normal(k[1], (H, V))
    tokens = jax.random.randint(k[2], (B, R), 0, V)
    return hidden, w, tokens


def _np_logprobs(logits, tokens, temperature, top_k, top_p, allowed=None):
    """Independent float64 NumPy reference of the sampling distribution's log-probs/entropy."""
    x = np.asarray(logits, np.float64)
    if allowed is not None:
        x = np.where(allowed, x, -1e30)
    x = x / temperature
    if top_k:
        kth = -np.sort(-x, axis=-1)[..., top_k - 1:top_k]
        x = np.where(x >= kth, x, -1e30)
    if top_p < 1.0:
        srt = -np.sort(-x, axis=-1)
        p = np.exp(srt - srt.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        before = np.cumsum(p, -1) - p
        thresh = np.min(np.where(before < top_p, srt, np.inf), -1, keepdims=True)
        x = np.where(x >= thresh, x, -1e30)
    z = x - x.max(-1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    tok = np.take_along_axis(lp, np.asarray(tokens)[..., None], -1)[..., 0]
    return tok, -(np.exp(lp) * lp).sum(-1)


@pytest.mark.parametrize("chunk", [1, 3, 4, R])  # 3 and 4 leave a padded last chunk
@pytest.mark.parametrize("scfg", [
    sampling_lib.SamplingConfig(temperature=0.7),
    sampling_lib.SamplingConfig(temperature=1.3, top_k=7, top_p=0.9),
])
def test_chunked_equals_full_logits_and_numpy(chunk, scfg):
    hidden, w, tokens = _inputs()
    lp, ent = scoring.token_stats(hidden, w, tokens, scfg, chunk=chunk, with_entropy=True)
    logits = hidden @ w
    full = sampling_lib.token_logprobs(logits, tokens, scfg)
    full_lp = sampling_lib.log_probs(logits, scfg)
    full_ent = -jnp.sum(jnp.exp(full_lp) * full_lp, -1)
    np.testing.assert_allclose(lp, full, atol=1e-5)
    np.testing.assert_allclose(ent, full_ent, atol=1e-5)
    want_lp, want_ent = _np_logprobs(np.asarray(hidden, np.float64) @ np.asarray(w, np.float64),
                                     tokens, scfg.temperature, scfg.top_k, scfg.top_p)
    np.testing.assert_allclose(lp, want_lp, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(ent, want_ent, atol=1e-5, rtol=1e-5)
    # KL to a reference (per-token estimators work on these log-probs) agrees as well
    ref_lp, _ = scoring.token_stats(hidden * 0.5, w, tokens, scfg, chunk=chunk)
    np.testing.assert_allclose(losses.kl_penalty(lp, ref_lp, "k3"),
                               losses.kl_penalty(full, sampling_lib.token_logprobs(
                                   (hidden * 0.5) @ w, tokens, scfg), "k3"), atol=1e-5, rtol=1e-5)


def test_chunked_gradients_equal_full_logits():
    hidden, w, tokens = _inputs(1)
    scfg = sampling_lib.SamplingConfig(temperature=0.8)
    a = jax.random.normal(jax.random.PRNGKey(5), (B, R))
    c = jax.random.normal(jax.random.PRNGKey(6), (B, R))

    def chunked(hidden, w):
        lp, ent = scoring.token_stats(hidden, w, tokens, scfg, chunk=3, with_entropy=True,
                                         entropy_grad=True)
        return jnp.sum(lp * a) + jnp.sum(ent * c)

    def full(hidden, w):
        lp_all = sampling_lib.log_probs(hidden @ w, scfg)
        lp = jnp.take_along_axis(lp_all, tokens[..., None], -1)[..., 0]
        return jnp.sum(lp * a) - jnp.sum(jnp.sum(jnp.exp(lp_all) * lp_all, -1) * c)

    g1 = jax.grad(chunked, argnums=(0, 1))(hidden, w)
    g2 = jax.grad(full, argnums=(0, 1))(hidden, w)
    for x, y in zip(g1, g2):
        assert float(jnp.max(jnp.abs(y))) > 1e-2  # non-trivial gradients
        # float32 sums in a different order (per chunk vs whole rows): ~1e-5 apart where
        # entries reach ~5, so the tolerance scales with the gradient's size
        np.testing.assert_allclose(x, y, atol=1e-5 * float(jnp.max(jnp.abs(y))), rtol=1e-4)
    # entropy_grad=False: the entropy term contributes no gradient
    g3 = jax.grad(lambda h: jnp.sum(scoring.token_stats(
        h, w, tokens, scfg, chunk=3, with_entropy=True)[1]))(hidden)
    assert float(jnp.max(jnp.abs(g3))) == 0.0


END = 2


def _grammar_and_responses(n_rows=6, n=12, seed=0):
    gram = compile_grammar([[[7], Repeat(tuple(range(10, 20)), 1, 3),
                             free_text(6, exclude=(0, 1, END))],
                            [[8], free_text(4, exclude=(0, 1, END))]], 32, end_token_ids=(END,))
    allowed, nxt = np.asarray(gram.allowed), np.asarray(gram.next_state)
    rng = np.random.default_rng(seed)
    toks = np.zeros((n_rows, n), np.int32)
    mask = np.zeros((n_rows, n), bool)
    for b in range(n_rows):
        s = int(gram.start)
        for t in range(n):
            ok = np.flatnonzero(allowed[s])
            if not len(ok):
                break
            toks[b, t] = rng.choice(ok)
            mask[b, t] = True
            s = nxt[s, toks[b, t]]
        toks[b, mask[b].sum():] = rng.integers(0, 32, n - mask[b].sum())  # padding junk
    return gram, toks, mask


def test_fsm_states_rebuild_the_step_masks():
    gram, toks, mask = _grammar_and_responses()
    states = grammar_lib.step_states(gram, jnp.asarray(toks), jnp.asarray(mask))
    assert states.shape == toks.shape and states.dtype == jnp.int32
    # independent NumPy replay of the FSM (state before each token; frozen after the end)
    nxt = np.asarray(gram.next_state)
    want = np.zeros_like(toks)
    for b in range(toks.shape[0]):
        s = int(gram.start)
        for t in range(toks.shape[1]):
            want[b, t] = s
            if mask[b, t]:
                s = nxt[s, toks[b, t]]
    np.testing.assert_array_equal(states, want)
    masks = grammar_lib.masks_from_states(gram, states)
    np.testing.assert_array_equal(masks, grammar_lib.step_masks(gram, jnp.asarray(toks),
                                                                jnp.asarray(mask)))
    # and every sampled token is allowed by its rebuilt mask
    assert np.all(np.take_along_axis(np.asarray(masks), toks[..., None], -1)[..., 0][mask])

    # chunked log-probs with (grammar, states) == full logits with the old [B, N, V] masks
    b, n = toks.shape
    hidden = jax.random.normal(jax.random.PRNGKey(0), (b, n, H))
    w = jax.random.normal(jax.random.PRNGKey(1), (H, 32))
    scfg = sampling_lib.SamplingConfig(temperature=0.7, top_k=12)
    lp, ent = scoring.token_stats(hidden, w, jnp.asarray(toks), scfg, grammar=gram,
                                     states=states, chunk=5, with_entropy=True)
    old = sampling_lib.token_logprobs(hidden @ w, jnp.asarray(toks), scfg, masks)
    np.testing.assert_allclose(np.asarray(lp)[mask], np.asarray(old)[mask], atol=1e-5)
    want_lp, _ = _np_logprobs(np.asarray(hidden @ w), toks, 0.7, 12, 1.0, np.asarray(masks))
    np.testing.assert_allclose(np.asarray(lp)[mask], want_lp[mask], atol=1e-5)
    # negative control: states off by one step give different log-probs
    shifted = jnp.roll(states, 1, axis=1)
    lp_bad, _ = scoring.token_stats(hidden, w, jnp.asarray(toks), scfg, grammar=gram,
                                       states=shifted, chunk=5)
    assert np.max(np.abs(np.asarray(lp_bad - lp)[mask])) > 1e-2

    # grammar_from_masks: arbitrary masks as FSM states
    g2, s2 = grammar_lib.grammar_from_masks(masks)
    np.testing.assert_array_equal(grammar_lib.masks_from_states(g2, s2), masks)


def test_fsm_states_without_grammar_is_a_clear_error():
    pdef, params, ref = tiny_policy("head")
    prompt, pmask = standard_prompts()
    traj = buffer.make_trajectory(prompt, pmask, jnp.zeros((16, 4), jnp.int32),
                                  jnp.ones((16, 4), bool), scores=jnp.zeros(16),
                                  fsm_states=jnp.ones((16, 4), jnp.int32))
    with pytest.raises(ValueError, match="no grammar was passed"):
        policy_lib.evaluate(pdef, params, ref, traj, ppo.PPOConfig())


def test_micro_batches_give_the_big_batch_update():
    pdef, params, ref = tiny_policy("head")
    prompt, pmask = standard_prompts()
    base = ppo.PPOConfig(learning_rate=1e-3, temperature=1.0, ppo_epochs=1, logits_chunk=5)
    lengths = jax.random.randint(jax.random.PRNGKey(7), (16,), 1, RESP + 1)
    rmask = jnp.arange(RESP)[None] < lengths[:, None]
    traj, _ = rollout(pdef, params, ref, base, jax.random.PRNGKey(6), prompt, pmask, RESP,
                      count_token(TARGET), response_mask=rmask)
    key = jax.random.PRNGKey(0)
    big, m1 = compiled_update(base)(optim.init_train_state(base, pdef, params, ref, key), traj)
    micro = base.replace(micro_batch=4)
    small, m4 = compiled_update(micro)(optim.init_train_state(micro, pdef, params, ref, key), traj)
    assert float(m1["grad_norm"]) > 1e-3
    for k in ("loss", "policy_loss", "value_loss", "grad_norm", "entropy", "clip_frac"):
        assert float(m4[k]) == pytest.approx(float(m1[k]), rel=1e-4, abs=1e-6), k
    moved = 0.0
    for a, b, p0 in zip(jax.tree.leaves(small.params), jax.tree.leaves(big.params),
                        jax.tree.leaves(params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
        moved = max(moved, float(jnp.max(jnp.abs(b - p0))))
    assert moved > 1e-4  # the update did something
    with pytest.raises(ValueError, match="micro_batch=5 does not divide the minibatch of 16"):
        ppo.make_update(base.replace(micro_batch=5), pdef)(
            optim.init_train_state(base, pdef, params, ref, key), traj)
    with pytest.raises(ValueError, match="micro_batch"):
        base.replace(micro_batch=4, grad_accum_steps=2)


# ---- XLA's own memory count of the compiled update ----------------------------------------

MV, MB, MP, MR = 4096, 8, 4, 32   # a [MB, MR, MV] float32 array is 4 MiB


@pytest.fixture(scope="module")
def mem_setup():
    model = llama.Llama(tiny_config(vocab_size=MV), rngs=nnx.Rngs(0))
    pdef, params, ref = policy_lib.init_policy(model)
    k = jax.random.PRNGKey(0)
    traj = buffer.make_trajectory(
        jnp.ones((MB, MP), jnp.int32), jnp.ones((MB, MP), bool),
        jax.random.randint(k, (MB, MR), 3, MV), jnp.ones((MB, MR), bool), scores=jnp.zeros(MB))
    return pdef, params, ref, traj


def _update_temp_bytes(mem_setup, chunk):
    pdef, params, ref, traj = mem_setup
    cfg = ppo.PPOConfig(ppo_epochs=1, logits_chunk=chunk, temperature=1.0)
    st = optim.init_train_state(cfg, pdef, params, ref, jax.random.PRNGKey(0))
    return ppo.make_update(cfg, pdef).lower(st, traj).compile().memory_analysis() \
        .temp_size_in_bytes


def test_update_temp_bytes_stay_below_one_full_logits_array(mem_setup):
    """Bound: one [B, R, V] float32 array. The chunked update (4 positions per chunk) stays
    below it; the full-logits paths (one chunk = the whole response, and the old
    implementation's value_and_grad alone) exceed it."""
    bound = MB * MR * MV * 4
    chunked = _update_temp_bytes(mem_setup, 4)
    assert chunked < bound, (chunked, bound)
    one_chunk = _update_temp_bytes(mem_setup, MR)
    assert one_chunk > bound, (one_chunk, bound)  # negative control: the bound can fail

    pdef, params, ref, traj = mem_setup
    scfg = sampling_lib.SamplingConfig(temperature=1.0)

    def old_loss(w):  # a full-logits implementation: [B, R, V] logits in one piece
        model = nnx.merge(pdef.graphdef, w)
        ids = jnp.concatenate([traj.prompt_tokens, traj.response_tokens], 1)
        mask = jnp.concatenate([traj.prompt_mask, traj.response_mask], 1)
        logits = model.forward(ids, mask).logits[:, MP - 1:MP - 1 + MR]
        lp_all = sampling_lib.log_probs(logits, scfg)
        lp = jnp.take_along_axis(lp_all, traj.response_tokens[..., None], -1)[..., 0]
        ent = -jnp.sum(jnp.exp(jax.lax.stop_gradient(lp_all)) * lp_all, -1)
        return jnp.sum(lp) + jnp.sum(ent)

    old = jax.jit(jax.value_and_grad(old_loss)).lower(params["policy"]).compile() \
        .memory_analysis().temp_size_in_bytes
    assert old > bound, (old, bound)
