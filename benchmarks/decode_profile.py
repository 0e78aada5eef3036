"""Where one decode step's time goes: the parts of `generate`'s while-loop body, timed apart.

    python benchmarks/decode_profile.py                        # the three rows below
    python benchmarks/decode_profile.py --rows small_20m --batch 32 --prompt 128 --new 64

Rows (random weights, float32, one process): `small_20m` (the 19M preset), `smollm2_135m`
(SmolLM2-135M-Instruct's shapes: 30 layers, 576 hidden, 49,152 vocab) and `vocab_128k` (the
19M preset with Llama-3's 128,256-token vocabulary).

For each row it times, best of `--repeats`, after a warm-up call:
- `step`: the real decode loop (`generate`'s compiled decode program, N steps) / N;
- `forward`: one cached forward of the model for one token per row (everything the model does
  in a step: matmuls, attention over all S cache slots, cache writes, LM head);
- `matmuls`: the same step's dense products alone (q/k/v/o, gate/up/down per layer, LM head);
- `attention`: `forward` against all S cache slots minus `forward` against an 8-slot cache
  (what attending to every slot costs);
- `live_prefix`: `forward` attending only to the first P + N/2 slots (`kv_limit`, the mean
  live prefix of the loop), against the same full cache: what attending to the filled slots
  only would give the decode (on XLA:CPU the slice of the cache is copied before the dot, so it
  can cost more);
- `cache_update`: writing one k/v slot per layer into the [B, S, K, D] buffers;
- `sampling`: `sampling.sample` on [B, V] logits with the row's SamplingConfig;
- `grammar`: gathering a [B, V] allowed mask from a 64-state table and masking the logits;
- `loop`: the while loop with the real carry and a body that only writes the token.
The parts are measured alone, so they do not add up exactly to `step` (XLA fuses across them
inside the real loop); the last column says how much of the step they explain.
"""

from __future__ import annotations

import argparse
import importlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxsocial.generation import sampling
from jaxsocial.generation.sampling import SamplingConfig
from jaxsocial.models import llama

# The module, not the `generate` function the package re-exports under the same name.
gen = importlib.import_module("jaxsocial.generation.generate")

ROWS = {
    "small_20m": dict(preset="small_20m"),
    "smollm2_135m": dict(preset="small_20m", vocab_size=49152, hidden_size=576,
                         intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, tie_word_embeddings=True),
    "vocab_128k": dict(preset="small_20m", vocab_size=128256),
}


def best(fn, repeats: int) -> float:
    jax.block_until_ready(fn())  # compile + warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return min(times)


def dense_matmuls(cfg: llama.LlamaConfig, head_rows: int):
    """A jitted fn(w, x [rows, H]) of the model's dense products alone: per layer q/k/v/o and
    gate/up/down on every row, then the LM head on the last `head_rows` rows (a decode step:
    rows = head_rows = batch; a prefill: rows = batch x prompt, head_rows = batch). `w`:
    `nnx.to_pure_dict` of the model's state."""
    @jax.jit
    def matmuls(w, x):
        y = x
        for layer in w["layers"].values():
            a, m = layer["self_attn"], layer["mlp"]
            q = y @ a["q_proj"]
            k = y @ a["k_proj"]
            vv = y @ a["v_proj"]
            y = y + (q + jnp.pad(k + vv, ((0, 0), (0, q.shape[1] - k.shape[1])))) @ a["o_proj"]
            y = y + ((y @ m["gate_proj"]) * (y @ m["up_proj"])) @ m["down_proj"]
        head = w["embed_tokens"].T if cfg.tie_word_embeddings else w["lm_head"]
        return y[-head_rows:] @ head
    return matmuls


def profile(name: str, batch: int, prompt: int, new: int, repeats: int, top_k: int,
            top_p: float) -> dict:
    spec = dict(ROWS[name])
    cfg = llama.preset(spec.pop("preset"), **spec)
    model = llama.Llama(cfg, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    rng = np.random.RandomState(0)
    ids = jnp.asarray(rng.randint(3, cfg.vocab_size, (batch, prompt)), jnp.int32)
    mask = jnp.ones((batch, prompt), bool)
    config = SamplingConfig(max_new_tokens=new, temperature=1.0, top_k=top_k, top_p=top_p,
                            stop_token_ids=())
    prefill, decode = gen.PROGRAMS.get(graphdef, prompt, batch, config, False, False)
    cache, logits = prefill(state, ids, mask)
    jax.block_until_ready(logits)
    key = jax.random.key(1)
    s = prompt + new
    h, kv, d = cfg.hidden_size, cfg.num_key_value_heads, cfg.head_dim
    L, v = cfg.num_hidden_layers, cfg.vocab_size

    def fresh_cache():
        c, _ = prefill(state, ids, mask)
        return c

    # The decode program donates its cache: give every timed call a fresh one (not timed).
    caches = [fresh_cache() for _ in range(repeats + 1)]

    def run_step():
        return decode(state, caches.pop(), logits, key, None)[1].tokens
    t_step = best(run_step, repeats) / new

    tok = jnp.ones((batch, 1), jnp.int32)
    live = jnp.ones((batch, 1), bool)

    def forward(state, cache, kv_limit=None):
        out = nnx.merge(graphdef, state).forward(tok, live, cache=cache, kv_limit=kv_limit)
        return out.logits, out.cache
    # Donated like the loop's carry, so the cache is written in place, not copied.
    forward = jax.jit(forward, donate_argnums=(1,), static_argnums=(2,))
    caches = [fresh_cache() for _ in range(repeats + 1)]
    t_forward = best(lambda: forward(state, caches.pop())[0], repeats)
    caches = [fresh_cache() for _ in range(repeats + 1)]
    t_live = best(lambda: forward(state, caches.pop(), prompt + new // 2)[0], repeats)

    w = nnx.to_pure_dict(state)
    x = jnp.ones((batch, h), jnp.float32)
    matmuls = dense_matmuls(cfg, batch)
    t_matmul = best(lambda: matmuls(w, x), repeats)

    # Attention over the cache = the same forward against all S slots minus against an
    # (almost) empty cache of 8 slots: what attending to every slot costs.
    small = [llama.init_cache(cfg, batch, 8) for _ in range(repeats + 1)]
    t_attn = t_forward - best(lambda: forward(state, small.pop())[0], repeats)

    newkv = jnp.ones((batch, 1, kv, d), jnp.float32)

    def cache_update(bufs, idx):
        return [jax.lax.dynamic_update_slice(b, newkv, (0, idx, 0, 0)) for b in bufs]
    cache_update = jax.jit(cache_update, donate_argnums=(0,))  # in place, as in the loop
    bufs = [[jnp.zeros((batch, s, kv, d), jnp.float32) for _ in range(2 * L)]
            for _ in range(repeats + 1)]
    t_cache = best(lambda: cache_update(bufs.pop(), jnp.int32(prompt)), repeats)

    lg = jax.random.normal(jax.random.key(2), (batch, v))
    samp = jax.jit(lambda k, lg: sampling.sample(k, lg, config)[0])
    t_sample = best(lambda: samp(key, lg), repeats)

    table = jax.random.bernoulli(jax.random.key(3), 0.5, (64, v))
    fsm = jnp.arange(batch, dtype=jnp.int32) % 64
    gram = jax.jit(lambda lg, fsm: jnp.where(table[fsm], lg, -1e30))
    t_grammar = best(lambda: gram(lg, fsm), repeats)

    @jax.jit
    def loop(tokens):
        def body(c):
            t, toks = c
            return t + 1, jax.lax.dynamic_update_slice(toks, jnp.full((batch, 1), t), (0, t))
        return jax.lax.while_loop(lambda c: c[0] < new, body, (jnp.int32(0), tokens))[1]
    t_loop = best(lambda: loop(jnp.zeros((batch, new), jnp.int32)), repeats) / new

    parts = dict(forward=t_forward, live_prefix=t_live, matmuls=t_matmul, attention=t_attn,
                 cache_update=t_cache,
                 sampling=t_sample, grammar=t_grammar, loop=t_loop)
    return dict(row=name, params_m=cfg.num_params() / 1e6, batch=batch, cache_slots=s,
                step=t_step, **parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--top_k", type=int, default=50)
    ap.add_argument("--top_p", type=float, default=0.95)
    a = ap.parse_args()
    print(f"# jax {jax.__version__} on {jax.devices()[0].platform}; batch {a.batch}, prompt "
          f"{a.prompt}, {a.new} new tokens, T=1 top-k {a.top_k} top-p {a.top_p}; ms per step")
    cols = ("step", "forward", "live_prefix", "matmuls", "attention", "cache_update", "sampling",
            "grammar", "loop")
    print(f"{'row':<13} {'params':>7} " + " ".join(f"{c:>12}" for c in cols)
          + f" {'fwd+samp+loop':>14}")
    for name in a.rows.split(","):
        r = profile(name, a.batch, a.prompt, a.new, a.repeats, a.top_k, a.top_p)
        explained = (r["forward"] + r["sampling"] + r["loop"]) / r["step"]
        print(f"{name:<13} {r['params_m']:>6.0f}M "
              + " ".join(f"{1e3 * r[c]:>12.2f}" for c in cols)
              + f" {100 * explained:>13.0f}%", flush=True)


if __name__ == "__main__":
    main()
