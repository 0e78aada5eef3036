"""First PPO ratio == 1 against `jaxsocial.generation.generate`'s own log-probs
(temperature, top-k, top-p, stop tokens and a grammar)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_rl_common import (
    PPO_FIRST,
    RESP,
    VOCAB,
    compiled_update,
    score,
    standard_prompts,
    tiny_policy,
)

from jaxsocial.generation import Repeat, compile_grammar, free_text, generate
from jaxsocial.generation import grammar as grammar_lib
from jaxsocial.rl import buffer, optim
from jaxsocial.rl import policy as policy_lib

END = 2


def test_first_ratio_is_one_against_generate():
    """generate() with temperature 0.7, top-k 12, top-p 0.95, a stop token and a grammar."""
    pdef, params, ref = tiny_policy("head")
    model = nnx.merge(pdef.graphdef, params["policy"])
    cfg = PPO_FIRST
    assert cfg.stop_token_ids == (END,)
    scfg = policy_lib.sampling_config(cfg, RESP)
    prompt, pmask = standard_prompts()
    gram = compile_grammar([[[7], Repeat(tuple(range(10, 20)), 1, 3),
                             free_text(12, exclude=(0, 1, END))]], VOCAB, end_token_ids=(END,))
    out = generate(model, prompt, pmask, jax.random.PRNGKey(5), scfg, grammar=gram)
    assert np.all(np.asarray(out.tokens)[:, 0] == 7)  # the grammar was in force
    rmask = np.asarray(out.mask)
    assert rmask.sum(1).min() >= 1 and not rmask.all()  # ragged: some rows stopped early
    states = grammar_lib.step_states(gram, out.tokens, out.mask)
    traj = buffer.make_trajectory(prompt, pmask, out.tokens, out.mask,
                                  scores=jnp.arange(prompt.shape[0], dtype=jnp.float32),
                                  fsm_states=states)
    lp, ref_lp, values = score(pdef, cfg, params, ref, traj, gram)
    np.testing.assert_allclose(np.asarray(lp)[rmask], np.asarray(out.logprobs)[rmask], atol=1e-5)
    # Update straight from the generator's log-probs: the first (only) step has ratio 1.
    traj = traj.replace(old_logprobs=out.logprobs, ref_logprobs=ref_lp, values=values)
    state = optim.init_train_state(cfg, pdef, params, ref, jax.random.PRNGKey(0))
    new, metrics = compiled_update(cfg)(state, traj, gram)
    assert float(metrics["ratio"]) == pytest.approx(1.0, abs=1e-5)
    assert abs(float(metrics["approx_kl"])) < 1e-8
    assert float(metrics["clip_frac"]) == 0.0
    assert int(new.nonfinite_skips) == 0
