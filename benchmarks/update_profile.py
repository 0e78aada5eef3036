"""Where one GRPO update's time goes: its forward, backward and optimizer parts, timed apart
(as `decode_profile.py` does for a decode step).

    python benchmarks/update_profile.py [--preset small_20m --prompts 4 --group 8 \
        --prompt_len 128 --new 64 --repeats 3]

Random weights, float32, the rl_step.py batch (4 prompts x 8 samples, 128 + 64 tokens),
GRPO loss with beta 0.04 (k3). Each row is one jitted function, best of `--repeats` after a
warm-up call:
- `update`: the real compiled update (`grpo.make_update`: loss forward + backward, clip +
  AdamW, NaN guard), without and with `prompt_group` (the prompt's forward once per group);
- `loss fwd` / `loss fwd+bwd`: the update's loss alone / `value_and_grad` of it;
- `trunk fwd+bwd`: the Llama trunk to the response positions' hidden states
  (`scoring.response_hidden[_grouped]`), with a random cotangent;
- `head fwd+bwd <variant>`: the log-prob head alone (`scoring.token_stats` on fixed hidden
  states [B, R, H] and the unembedding) — gradients to both — in variants: `library` (the
  code as shipped: the logsumexp gather, remat), `remat, log-softmax` (a materialised
  [B, c, V] log-softmax + gather), `no remat` (its chunk body not
  rematerialised), `lse gather` (log-prob = z[token] - logsumexp(z), entropy from the same
  softmax), `no entropy` (the entropy metric dropped), `one chunk` (log-softmax, the whole
  response in one chunk);
- `optimizer`: clip_by_global_norm + AdamW on the policy's weights.
The parts are measured alone, so they do not add up exactly to `update`.
"""
from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np
from decode_profile import best  # benchmarks/: best of n timed calls after a warm-up
from flax import nnx

from jaxsocial.generation import sampling as sampling_lib
from jaxsocial.generation import scoring
from jaxsocial.models import llama
from jaxsocial.rl import buffer, grpo, optim
from jaxsocial.rl import policy as policy_lib


def head_variant(hidden, w, tokens, scfg, *, remat=True, lse=False, entropy=True, chunk=0):
    """token_stats' computation with switches: -> sum of log-probs (+ entropy, stopped)."""
    b, r, _ = hidden.shape
    c = scoring.resolve_chunk(chunk, b, r, w.shape[-1])
    n = -(-r // c)
    pad = n * c - r

    def split(x):
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return jnp.moveaxis(x.reshape((b, n, c) + x.shape[2:]), 1, 0)

    def body(w, x):
        logits = jnp.matmul(x["h"], w, preferred_element_type=jnp.float32)
        z = sampling_lib.sampling_logits(logits, scfg)
        if lse:
            m = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
            e = jnp.exp(z - m)
            s = jnp.sum(e, axis=-1, keepdims=True)
            logz = (m + jnp.log(s))[..., 0]
            lp = jnp.take_along_axis(z, x["tok"][..., None], axis=-1)[..., 0] - logz
            ent = None
            if entropy:
                p = jax.lax.stop_gradient(e / s)
                ent = jax.lax.stop_gradient(logz - jnp.sum(p * z, axis=-1))
        else:
            lp_all = jax.nn.log_softmax(z, axis=-1)
            lp = jnp.take_along_axis(lp_all, x["tok"][..., None], axis=-1)[..., 0]
            ent = None
            if entropy:
                e = jax.lax.stop_gradient(lp_all)
                ent = -jnp.sum(jnp.exp(e) * e, axis=-1)
        return lp, ent

    step = jax.checkpoint(body, prevent_cse=False) if remat else body
    _, (lp, ent) = jax.lax.scan(lambda cy, x: (cy, step(w, x)), None,
                                {"h": split(hidden), "tok": split(tokens)})
    total = jnp.sum(lp)
    return total if ent is None else total + 0.0 * jnp.sum(ent)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small_20m")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt_len", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    cfg_m = llama.preset(args.preset, dtype="float32")
    model = llama.Llama(cfg_m, rngs=nnx.Rngs(0))
    g, p, r, v = args.group, args.prompt_len, args.new, cfg_m.vocab_size
    b = args.prompts * g
    rs = np.random.RandomState(0)
    prompt = np.repeat(rs.randint(10, v, (args.prompts, p)), g, axis=0).astype(np.int32)
    resp = rs.randint(10, v, (b, r)).astype(np.int32)
    traj = buffer.make_trajectory(prompt, np.ones((b, p), bool), resp, np.ones((b, r), bool),
                                  scores=rs.rand(b).astype(np.float32),
                                  old_logprobs=np.full((b, r), -9.0, np.float32),
                                  ref_logprobs=np.full((b, r), -9.0, np.float32))
    base = grpo.GRPOConfig(group_size=g, learning_rate=1e-5, kl_coef=0.04, temperature=1.0)
    pdef, params, ref = policy_lib.init_policy(model, value_mode="none")
    print(f"model {args.preset}: {cfg_m.num_params() / 1e6:.1f}M params, float32, "
          f"{jax.default_backend()}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; batch {b} x ({p} + {r}); best of "
          f"{args.repeats}; auto log-prob chunk "
          f"{scoring.resolve_chunk(0, b, r, v)} positions")
    rows = []

    def report(name, t):
        rows.append((name, t))
        print(f"{name:40s} {t:7.3f} s", flush=True)

    for pg in (0, g):
        cfg = base.replace(prompt_group=pg)
        state = optim.init_train_state(cfg, pdef, params, ref, jax.random.PRNGKey(0))
        upd = grpo.make_update(cfg, pdef)
        report(f"update (prompt_group={pg})", best(lambda: upd(state, traj), args.repeats))
        mask = traj.response_mask
        adv = grpo.group_advantages(traj.scores, g)
        denom = {"tokens": jnp.sum(mask.astype(jnp.float32)), "rows": jnp.float32(b)}

        def loss(prm, cfg=cfg):
            out = policy_lib.evaluate(pdef, prm, ref, traj, cfg, with_values=False,
                                      with_entropy=True)
            return grpo.grpo_loss(out.logprobs, traj.old_logprobs, traj.ref_logprobs, adv,
                                  mask, cfg, denom)[0]

        fwd = jax.jit(loss)
        report(f"loss fwd (prompt_group={pg})", best(lambda: fwd(params), args.repeats))
        fb = jax.jit(jax.value_and_grad(loss))
        report(f"loss fwd+bwd (prompt_group={pg})", best(lambda: fb(params), args.repeats))

        probe = jnp.asarray(rs.randn(b, r, cfg_m.hidden_size).astype(np.float32))

        def trunk(w, pg=pg):
            m = nnx.merge(pdef.graphdef, w)
            h, _ = scoring.response_hidden_auto(m, traj.prompt_tokens, traj.prompt_mask,
                                                traj.response_tokens, traj.response_mask, pg)
            return jnp.sum(h * probe)

        tb = jax.jit(jax.value_and_grad(trunk))
        report(f"trunk fwd+bwd (prompt_group={pg})",
               best(lambda: tb(params["policy"]), args.repeats))

    hidden = jnp.asarray(rs.randn(b, r, cfg_m.hidden_size).astype(np.float32))
    w = params["policy"]["lm_head"] if "lm_head" in params["policy"] else \
        params["policy"]["embed_tokens"].T
    scfg = policy_lib.sampling_config(base, r)
    tokens = traj.response_tokens
    ref_lp = jax.jit(lambda h, w: scoring.token_stats(h, w, tokens, scfg)[0])(hidden, w)
    for name, kw in (("library", None), ("remat, log-softmax", dict()),
                     ("no remat", dict(remat=False)), ("lse gather", dict(lse=True)),
                     ("lse gather, no remat", dict(lse=True, remat=False)),
                     ("no entropy", dict(entropy=False)), ("one chunk", dict(chunk=r))):
        if kw is None:
            def f(h, w):
                lp, ent = scoring.token_stats(h, w, tokens, scfg, with_entropy=True)
                return jnp.sum(lp) + 0.0 * jnp.sum(ent)
        else:
            def f(h, w, kw=kw):
                return head_variant(h, w, tokens, scfg, **kw)
        vg = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))
        val = float(vg(hidden, w)[0])
        assert abs(val - float(jnp.sum(ref_lp))) < 1e-3 * abs(val), (name, val)
        report(f"head fwd+bwd {name}", best(lambda: vg(hidden, w), args.repeats))

    tx, _ = optim.make_optimizer(base)
    opt_state = tx.init(params["policy"])
    grads = jax.tree.map(lambda x: x * 1e-3, params["policy"])

    @jax.jit
    def opt(prm, st):
        import optax
        u, st = tx.update(grads, st, prm)
        return optax.apply_updates(prm, u), st

    report("optimizer (clip + AdamW)", best(lambda: opt(params["policy"], opt_state),
                                             args.repeats))


if __name__ == "__main__":
    main()
