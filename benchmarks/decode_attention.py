"""One decode step's attention over the cache, three ways, in isolation (can the decode attend to
the filled part of the cache only, for less than attending to every slot?).

    python benchmarks/decode_attention.py

For a query of one token per row (q [B, 1, K, G, D]) against a float32 cache [B, S, K, D] whose
first `live` slots are filled, best of 5 x 300 calls, ms per layer:
- `all_slots`: the model's attention (`llama.Attention`'s einsums) over all S slots;
- `slice`: the same over `cache[:, :live]` (a static slice: `Llama.forward(kv_limit=live)`);
- `blocks_kbN`: a `fori_loop` over ceil(live / N) key blocks with an online softmax (exact;
  early exit at the live length, which may be traced).
Rows: the 19M preset's decode (B 32, S 192, K 2, G 3, D 64) and SmolLM2-135M's (B 16, K 3). Each
variant's max-abs difference to `all_slots` is printed (all are exact). In isolation XLA:CPU's
dots are erratic across these shapes; `benchmarks/decode_profile.py`'s `live_prefix` column
is the same slice inside the model's decode step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from decode_profile import best  # benchmarks/: best of n after a warm-up call
from jax import lax

ROWS = {"small_20m": (32, 192, 2, 3, 64), "smollm2_135m": (16, 192, 3, 3, 64)}


def best_ms(f, *args, calls: int = 300, repeats: int = 5) -> float:
    """ms per call of `f(*args)`: best of `repeats` batches of `calls` calls."""
    return 1e3 * best(lambda: [f(*args) for _ in range(calls)][-1], repeats) / calls


def all_slots(q, keys, values, bias):
    """q [B, 1, K, G, D], keys / values [B, S, K, D], bias [B, 1, S] -> [B, 1, K, G, D]."""
    s = jnp.einsum("btkgd,bskd->bkgts", q, keys) * q.shape[-1] ** -0.5 + bias[:, None, None]
    return jnp.einsum("bkgts,bskd->btkgd", jax.nn.softmax(s, axis=-1), values)


def blocks(q, keys, values, bias, live, kb: int):
    """all_slots over the first ceil(live / kb) blocks of kb slots only (online softmax)."""
    b, _, k, g, d = q.shape

    def body(j, carry):
        m, den, acc = carry
        kj, vj = (lax.dynamic_slice_in_dim(x, j * kb, kb, axis=1) for x in (keys, values))
        bj = lax.dynamic_slice_in_dim(bias, j * kb, kb, axis=2)
        s = jnp.einsum("btkgd,bskd->bkgts", q, kj) * d ** -0.5 + bj[:, None, None]
        m_new = jnp.maximum(m, s.max(-1, keepdims=True))
        p, corr = jnp.exp(s - m_new), jnp.exp(m - m_new)
        return (m_new, den * corr + p.sum(-1, keepdims=True),
                acc * corr + jnp.einsum("bkgts,bskd->bkgtd", p, vj))

    init = (jnp.full((b, k, g, 1, 1), -jnp.inf), jnp.zeros((b, k, g, 1, 1)),
            jnp.zeros((b, k, g, 1, d)))
    _, den, acc = lax.fori_loop(0, (live + kb - 1) // kb, body, init)
    return jnp.moveaxis(acc / den, 3, 1)


def main():
    print(f"# jax {jax.__version__} on {jax.devices()[0].platform}; ms per layer per decode step")
    key = jax.random.key(0)
    for name, (b, s, k, g, d) in ROWS.items():
        kq, kk, kv = jax.random.split(key, 3)
        q = jax.random.normal(kq, (b, 1, k, g, d))
        keys, values = jax.random.normal(kk, (b, s, k, d)), jax.random.normal(kv, (b, s, k, d))
        for live in (s, s * 5 // 6, s // 2):
            bias = jnp.broadcast_to(jnp.where(jnp.arange(s) < live, 0.0, -3e38), (b, 1, s))
            ref = jax.jit(all_slots)(q, keys, values, bias)
            row = {"all_slots": best_ms(jax.jit(all_slots), q, keys, values, bias)}
            sliced = jax.jit(lambda q, kk, vv, bb, n=live: all_slots(
                q, kk[:, :n], vv[:, :n], bb[..., :n]))
            row["slice"] = best_ms(sliced, q, keys, values, bias)
            err = {"slice": float(jnp.abs(sliced(q, keys, values, bias) - ref).max())}
            for kb in (32, 64):
                f = jax.jit(blocks, static_argnums=(5,))
                n = jnp.int32(live)
                row[f"blocks_kb{kb}"] = best_ms(f, q, keys, values, bias, n, kb)
                err[f"blocks_kb{kb}"] = float(jnp.abs(f(q, keys, values, bias, n, kb) - ref).max())
            print(f"{name} live={live}/{s} " + " ".join(
                f"{v}={row[v]:.3f}" + (f"(err {err[v]:.0e})" if v in err else "") for v in row),
                flush=True)


if __name__ == "__main__":
    main()
