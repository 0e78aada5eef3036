"""Decode over a growing cache: `generate` with `SamplingConfig.decode_buckets` segments against
one decode loop over all P + N cache slots, same weights, same key.

    python benchmarks/decode_buckets.py                   # the three rows below
    python benchmarks/decode_buckets.py --rows long --buckets 2,4,8 --repeats 3

Rows (random weights, float32, T=1 top-k 50 top-p 0.95, no stop ids, so every row runs N
steps): `topk` = generate.py's 19M row (batch 32, prompt 128, 64 new: the prompt fills 2/3 of
the cache at the first step); `smol` = SmolLM2-135M's shapes (batch 16, prompt 64, 128 new);
`long` = the 19M preset with long responses (batch 32, prompt 64, 512 new: the cache is 7/8
empty at the first step). Each timed call is a whole `generate` (prefill + decode); the bucket
settings are timed in turn within each round (so a slow minute hits all of them) and the best
of `--repeats` rounds is kept, after one warm-up call each. Every setting must give the
one-loop setting's tokens (checked). Summary line: `one_bucket_s= buckets_s= ratio=` of the
last row at the largest bucket count, then `result: <file>` (benchmarks/results/) and the
machine line, last.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import NO_RECORD_HELP, finish  # benchmarks/: the result file
from decode_profile import ROWS as SHAPES  # benchmarks/: the model shapes of the profile
from flax import nnx

from jaxsocial.generation import SamplingConfig, generate
from jaxsocial.models import llama

ROWS = {
    "topk": dict(shape="small_20m", batch=32, prompt=128, new=64),
    "smol": dict(shape="smollm2_135m", batch=16, prompt=64, new=128),
    "long": dict(shape="small_20m", batch=32, prompt=64, new=512),
}


def run_row(name: str, buckets: list, repeats: int) -> dict:
    row = ROWS[name]
    spec = dict(SHAPES[row["shape"]])
    model = llama.Llama(llama.preset(spec.pop("preset"), **spec), rngs=nnx.Rngs(0))
    batch, prompt, new = row["batch"], row["prompt"], row["new"]
    rs = np.random.RandomState(0)
    ids = jnp.asarray(rs.randint(3, model.config.vocab_size, (batch, prompt)), jnp.int32)
    mask = jnp.ones((batch, prompt), bool)
    configs = {b: SamplingConfig(max_new_tokens=new, temperature=1.0, top_k=50, top_p=0.95,
                                 prompt_bucket=prompt, decode_buckets=b) for b in buckets}

    def call(b):
        return jax.block_until_ready(generate(model, ids, mask, jax.random.key(1), configs[b]))

    tokens = {b: np.asarray(call(b).tokens) for b in buckets}  # compile + warm up
    for b in buckets:
        if not np.array_equal(tokens[b], tokens[buckets[0]]):
            raise AssertionError(f"{name}: decode_buckets={b} changed the tokens")
    seconds = {b: float("inf") for b in buckets}
    for _ in range(repeats):
        for b in buckets:
            t0 = time.perf_counter()
            call(b)
            seconds[b] = min(seconds[b], time.perf_counter() - t0)
    return seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="topk,smol,long")
    ap.add_argument("--buckets", default="2,4,8", help="settings timed against 1")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no_record", action="store_true", help=NO_RECORD_HELP)
    args = ap.parse_args()
    buckets = [1] + [int(b) for b in args.buckets.split(",") if int(b) != 1]
    print(f"# jax {jax.__version__} on {jax.default_backend()}; seconds per generate call "
          f"(best of {args.repeats}); ratio = one loop / segments")
    print(f"{'row':6} {'batch':>5} {'prompt':>6} {'new':>4} {'1 bucket':>9} "
          + " ".join(f"{f'{b} buckets':>17}" for b in buckets[1:]))
    last, rows = None, {}
    for name in args.rows.split(","):
        s = run_row(name, buckets, args.repeats)
        rows[name] = {**ROWS[name], "seconds": s}
        row = ROWS[name]
        cells = " ".join(f"{s[b]:>9.3f} ({s[1] / s[b]:4.2f}x)" for b in buckets[1:])
        print(f"{name:6} {row['batch']:>5} {row['prompt']:>6} {row['new']:>4} {s[1]:>9.3f} "
              f"{cells}", flush=True)
        last = s
    top = buckets[-1]
    print(f"one_bucket_s={last[1]:.3f} buckets_s={last[top]:.3f} ratio={last[1] / last[top]:.2f}")
    finish("decode_buckets", {"one_bucket_s": last[1], "buckets_s": last[top],
                              "ratio": last[1] / last[top], "buckets": top, "rows": rows},
           record=not args.no_record)


if __name__ == "__main__":
    main()
