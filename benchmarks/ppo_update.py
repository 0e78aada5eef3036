"""Throughput of a full PPO update for the ~20M Llama (`llama.preset("small_20m")`).

One "full update" = the rollout scoring pass (policy log-probs + value head, reference
log-probs: two forwards) + the PPO update (forward, backward, clip + AdamW step, NaN guard),
on a batch of 32 x (128 prompt + 64 response) tokens. Tokens/s counts prompt + response
tokens of the batch per full update. The peer, measured in the same run, is a plain SFT step
(cross-entropy forward + backward + the same optimizer) on the same tokens, in the same
process, dtype and batch, also timed as the median of `--iters` calls after one warm-up call:
the ratio is the cost of PPO's extra machinery.

    python benchmarks/ppo_update.py [--batch 32 --prompt_len 128 --response_len 64 \
        --epochs 1 --iters 3 --preset small_20m]

Memory (`--memory`): XLA's own count (`jit(update).lower(...).compile().memory_analysis()`,
temp / argument / output bytes) of the compiled PPO update, compiled only (nothing runs), for
the chunked log-probs (auto chunk and `--logits_chunk`), with micro-batches (`--micro_batch`)
and, as the baseline row, one chunk spanning the whole response (= the full [B, R, V] logits
in one piece). A SmolLM2-sized vocabulary (49,152), 64 sequences of 128 prompt + 128 response
tokens:

    python benchmarks/ppo_update.py --memory --preset tiny --vocab 49152 --batch 64 \
        --prompt_len 128 --response_len 128

Summary line: one JSON object (machine-readable), then `result: <file>` (benchmarks/results/)
and the machine line, last.
"""
import json
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from common import NO_RECORD_HELP, finish  # benchmarks/: the result file
from flax import nnx

from jaxsocial.generation import scoring
from jaxsocial.models import llama
from jaxsocial.rl import buffer, optim, ppo
from jaxsocial.rl import policy as policy_lib

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "small_20m", "Llama preset")
flags.DEFINE_integer("batch", 32, "rows")
flags.DEFINE_integer("prompt_len", 128, "prompt slots (left-padded)")
flags.DEFINE_integer("response_len", 64, "response slots")
flags.DEFINE_integer("epochs", 1, "PPO epochs per update (1 = one optimizer step)")
flags.DEFINE_integer("minibatches", 1, "minibatches per epoch")
flags.DEFINE_integer("iters", 3, "timed iterations (after one warm-up/compile call)")
flags.DEFINE_string("dtype", "float32", "compute dtype")
flags.DEFINE_integer("vocab", 0, "override the preset's vocabulary size (0 = keep)")
flags.DEFINE_bool("memory", False, "only report XLA memory_analysis of the compiled update")
flags.DEFINE_integer("logits_chunk", 32, "--memory: explicit chunk row (positions per chunk)")
flags.DEFINE_integer("micro_batch", 16, "--memory: micro-batch row (rows per micro-batch)")
flags.DEFINE_float("target_gib", 2.0, "--memory: the target for XLA temp bytes")
flags.DEFINE_bool("no_record", False, NO_RECORD_HELP)


def _trajectory(b, p, r, v, key):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    plen = jax.random.randint(k1, (b,), p // 2, p + 1)
    prompt_mask = jnp.arange(p)[None, :] >= (p - plen)[:, None]
    prompt = jnp.where(prompt_mask, jax.random.randint(k2, (b, p), 3, v), 0)
    rlen = jax.random.randint(k3, (b,), r // 2, r + 1)
    response_mask = jnp.arange(r)[None, :] < rlen[:, None]
    response = jax.random.randint(k4, (b, r), 3, v)
    return buffer.make_trajectory(prompt, prompt_mask, response, response_mask,
                                  scores=jax.random.normal(key, (b,)))


def memory_main():
    """XLA memory_analysis of the compiled PPO update: chunked vs the full-logits path."""
    overrides = {"vocab_size": FLAGS.vocab} if FLAGS.vocab else {}
    cfg_m = llama.preset(FLAGS.preset, dtype=FLAGS.dtype, **overrides)
    model = llama.Llama(cfg_m, rngs=nnx.Rngs(0))
    b, p, r, v = FLAGS.batch, FLAGS.prompt_len, FLAGS.response_len, cfg_m.vocab_size
    pdef, params, ref = policy_lib.init_policy(model)
    del model
    traj = _trajectory(b, p, r, v, jax.random.PRNGKey(1))
    rows = [("full logits (one chunk = whole response)", dict(logits_chunk=r)),
            ("chunked, auto chunk", dict()),
            (f"chunked, {FLAGS.logits_chunk} positions per chunk",
             dict(logits_chunk=FLAGS.logits_chunk)),
            (f"chunked auto + micro_batch {FLAGS.micro_batch}",
             dict(micro_batch=FLAGS.micro_batch))]
    n_params = sum(int(x.size) for x in jax.tree.leaves(params["policy"]))
    print(f"model {FLAGS.preset} vocab {v}: {n_params / 1e6:.1f}M params, dtype {FLAGS.dtype}, "
          f"backend {jax.default_backend()}; batch {b} x ({p} prompt + {r} response); "
          f"one [B, R, V] float32 array = {b * r * v * 4 / 2**30:.2f} GiB")
    out = {}
    for name, kw in rows:
        cfg = ppo.PPOConfig(ppo_epochs=FLAGS.epochs, num_minibatches=FLAGS.minibatches, **kw)
        state = optim.init_train_state(cfg, pdef, params, ref, jax.random.PRNGKey(0))
        t = time.perf_counter()
        mem = ppo.make_update(cfg, pdef).lower(state, traj).compile().memory_analysis()
        dt = time.perf_counter() - t
        temp = mem.temp_size_in_bytes
        chunk = scoring.resolve_chunk(cfg.logits_chunk, cfg.accumulation(b)[1], r, v)
        print(f"{name:58s} chunk {chunk:4d}: XLA temp {temp / 2**30:7.3f} GiB, arguments "
              f"{mem.argument_size_in_bytes / 2**30:.3f} GiB, output "
              f"{mem.output_size_in_bytes / 2**30:.3f} GiB (compile {dt:.0f} s)")
        out[name] = round(temp / 2**30, 4)
    best = min(v_ for k, v_ in out.items() if k.startswith("chunked"))
    print(f"target: XLA temp < {FLAGS.target_gib} GiB -> "
          f"{'met' if out['chunked, auto chunk'] < FLAGS.target_gib else 'NOT met'} "
          f"(auto chunk {out['chunked, auto chunk']:.3f} GiB, best {best:.3f} GiB; full logits "
          f"{out[rows[0][0]]:.3f} GiB)")
    figures = {"benchmark": "ppo_update_memory", "preset": FLAGS.preset, "vocab": v,
               "batch": b, "prompt_len": p, "response_len": r, "xla_temp_gib": out,
               "target_gib": FLAGS.target_gib}
    print(json.dumps(figures))
    finish("ppo_update_memory", figures, record=not FLAGS.no_record)


def timed(fn, iters):
    out = fn()
    jax.block_until_ready(out)  # compile + warm up
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        out = fn()
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t)
    return float(np.median(times)), out


def main(_):
    if FLAGS.memory:
        return memory_main()
    overrides = {"vocab_size": FLAGS.vocab} if FLAGS.vocab else {}
    cfg_m = llama.preset(FLAGS.preset, dtype=FLAGS.dtype, **overrides)
    model = llama.Llama(cfg_m, rngs=nnx.Rngs(0))
    b, p, r = FLAGS.batch, FLAGS.prompt_len, FLAGS.response_len
    cfg = ppo.PPOConfig(ppo_epochs=FLAGS.epochs, num_minibatches=FLAGS.minibatches)
    pdef, params, ref = policy_lib.init_policy(model)
    del model
    state = optim.init_train_state(cfg, pdef, params, ref, jax.random.PRNGKey(0))

    traj = _trajectory(b, p, r, cfg_m.vocab_size, jax.random.PRNGKey(1))

    score = jax.jit(lambda params, ref_params, t: policy_lib.score_batch(
        pdef, params, ref_params, t, cfg))
    update = ppo.make_update(cfg, pdef)

    def full_step():
        lp, ref_lp, values = score(state.params, state.ref_params, traj)
        t = traj.replace(old_logprobs=lp, ref_logprobs=ref_lp, values=values)
        return update(state, t)

    # Peer: a plain SFT step on the same sequences with the same optimizer.
    tx, _ = optim.make_optimizer(cfg)
    ids = jnp.concatenate([traj.prompt_tokens, traj.response_tokens], 1)
    mask = jnp.concatenate([traj.prompt_mask, traj.response_mask], 1)

    @jax.jit
    def sft_step(weights, opt_state):
        def loss_fn(w):
            logits = nnx.merge(pdef.graphdef, w).forward(ids, mask).logits[:, :-1]
            nll = optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:])
            m = mask[:, 1:].astype(jnp.float32)
            return jnp.sum(nll * m) / jnp.sum(m)
        loss, g = jax.value_and_grad(loss_fn)(weights)
        updates, opt_state = tx.update(g, opt_state, weights)
        return optax.apply_updates(weights, updates), opt_state, loss

    sft_opt = tx.init(state.params["policy"])
    tokens = b * (p + r)
    t_score, (lp, ref_lp, values) = timed(lambda: score(state.params, state.ref_params, traj),
                                          FLAGS.iters)
    filled = traj.replace(old_logprobs=lp, ref_logprobs=ref_lp, values=values)
    t_update, (_, metrics) = timed(lambda: update(state, filled), FLAGS.iters)
    t_full, _ = timed(full_step, FLAGS.iters)
    t_sft, _ = timed(lambda: sft_step(state.params["policy"], sft_opt), FLAGS.iters)

    mem = update.lower(state, filled).compile().memory_analysis()
    xla_temp = getattr(mem, "temp_size_in_bytes", 0) if mem is not None else 0
    xla_args = getattr(mem, "argument_size_in_bytes", 0) if mem is not None else 0
    dev = jax.devices()[0]
    stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
    device_peak = (stats or {}).get("peak_bytes_in_use", 0)
    rss_peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

    n_params = sum(int(x.size) for x in jax.tree.leaves(state.params["policy"]))
    print(f"model {FLAGS.preset}: {n_params / 1e6:.1f}M params, dtype {FLAGS.dtype}, "
          f"backend {jax.default_backend()} ({dev.device_kind})")
    print(f"batch {b} x ({p} prompt + {r} response) = {tokens} tokens; "
          f"PPO epochs x minibatches = {cfg.ppo_epochs} x {cfg.num_minibatches}")
    print(f"scoring pass (policy + value + ref forward): {t_score:8.3f} s "
          f"{tokens / t_score:10.0f} tok/s")
    print(f"PPO update (fwd + bwd + AdamW):              {t_update:8.3f} s "
          f"{tokens / t_update:10.0f} tok/s")
    print(f"full PPO step (scoring + update):            {t_full:8.3f} s "
          f"{tokens / t_full:10.0f} tok/s")
    print(f"peer: SFT step (fwd + bwd + AdamW):          {t_sft:8.3f} s "
          f"{tokens / t_sft:10.0f} tok/s")
    print(f"ratio full PPO step / SFT step: {t_full / t_sft:.2f}x; "
          f"PPO update / SFT step: {t_update / t_sft:.2f}x")
    print(f"memory: XLA temp of the update {xla_temp / 2**20:.0f} MiB, arguments "
          f"{xla_args / 2**20:.0f} MiB, process peak RSS {rss_peak_mb:.0f} MiB"
          + (f", device peak {device_peak / 2**20:.0f} MiB" if device_peak else ""))
    print(f"sanity: first-ratio approx_kl {float(metrics['approx_kl']):.2e}, "
          f"skipped steps {float(metrics['skipped_steps']):.0f}")
    figures = {
        "benchmark": "ppo_update", "preset": FLAGS.preset, "backend": jax.default_backend(),
        "batch": b, "prompt_len": p, "response_len": r, "epochs": cfg.ppo_epochs,
        "tokens_per_s": round(tokens / t_full, 1),
        "update_tokens_per_s": round(tokens / t_update, 1),
        "score_tokens_per_s": round(tokens / t_score, 1),
        "sft_tokens_per_s": round(tokens / t_sft, 1),
        "full_over_sft": round(t_full / t_sft, 3),
        "xla_temp_mib": round(xla_temp / 2**20, 1), "peak_rss_mib": round(rss_peak_mb, 1),
        "device_peak_mib": round(device_peak / 2**20, 1),
    }
    print(json.dumps(figures))
    finish("ppo_update", figures, record=not FLAGS.no_record)


if __name__ == "__main__":
    app.run(main)
