"""The prefill in chunks: time and XLA memory of `generate`'s prefill program, one forward over
the whole prompt against chunks that attend only to the filled slots.

    python benchmarks/prefill.py                      # both tables, one process
    python benchmarks/prefill.py --skip_memory --preset small_20m --batch 32 --prompt 128

Time: random weights (float32), `--batch` left-padded prompts of `--prompt` tokens in a cache of
prompt + `--new` slots, best of `--repeats` after a warm-up, for each `SamplingConfig.
prefill_chunk` in `--chunks` (0 = the whole prompt in one forward, the peer).
Memory: XLA's temp bytes of the compiled prefill (`memory_analysis`, nothing run) of the `tiny`
preset, batch 2, prompts of 512-4096 tokens, for (model.attention_chunk, prefill_chunk) in
(0, 0), (0, 64) and (64, 64). Both settings run in one process on the same cores, dtype and
batch. Summary line: `whole_ms= chunked_ms= ratio=` (the first chunked setting against the
whole prompt), then `result: <file>` (benchmarks/results/) and the machine line, last.
"""

from __future__ import annotations

import argparse
import importlib

import jax
import jax.numpy as jnp
import numpy as np
from common import NO_RECORD_HELP, finish  # benchmarks/: the result file
from decode_profile import best  # benchmarks/: best of n after a warm-up call
from flax import nnx

from jaxsocial.generation.sampling import SamplingConfig
from jaxsocial.models import llama

gen = importlib.import_module("jaxsocial.generation.generate")


def _prefill(cfg, batch, prompt, new, chunk):
    graphdef, state = nnx.split(llama.Llama(cfg, rngs=nnx.Rngs(0)))
    sc = SamplingConfig(max_new_tokens=new, prompt_bucket=prompt, prefill_chunk=chunk)
    return gen.PROGRAMS.get(graphdef, prompt, batch, sc, False, False)[0], state


def time_prefill(preset, batch, prompt, new, chunk, repeats) -> float:
    cfg = llama.preset(preset)
    prefill, state = _prefill(cfg, batch, prompt, new, chunk)
    rs = np.random.RandomState(0)
    ids = jnp.asarray(rs.randint(3, cfg.vocab_size, (batch, prompt)), jnp.int32)
    lengths = rs.randint(prompt // 2, prompt + 1, batch)
    mask = jnp.asarray(np.arange(prompt)[None] >= (prompt - lengths)[:, None])
    return best(lambda: prefill(state, ids, mask), repeats)


def temp_mib(attention_chunk, prefill_chunk, prompt, batch=2, new=8) -> float:
    cfg = llama.preset("tiny", attention_chunk=attention_chunk)
    prefill, state = _prefill(cfg, batch, prompt, new, prefill_chunk)
    ids = jax.ShapeDtypeStruct((batch, prompt), jnp.int32)
    mask = jax.ShapeDtypeStruct((batch, prompt), bool)
    return prefill.lower(state, ids, mask).compile().memory_analysis().temp_size_in_bytes / 2**20


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small_20m")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--chunks", default="0,64,32", help="prefill_chunk values; 0 first")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip_memory", action="store_true")
    ap.add_argument("--no_record", action="store_true", help=NO_RECORD_HELP)
    a = ap.parse_args()
    chunks = [int(c) for c in a.chunks.split(",")]
    if chunks[0] != 0 or len(chunks) < 2:
        raise SystemExit(f"--chunks={a.chunks!r}: give 0 (the whole prompt) first, then chunks")
    print(f"# jax {jax.__version__} on {jax.devices()[0].platform}: prefill of {a.preset}, "
          f"batch {a.batch}, prompt {a.prompt} (+{a.new} slots), best of {a.repeats}")
    ms = {}
    for c in chunks:
        ms[c] = 1e3 * time_prefill(a.preset, a.batch, a.prompt, a.new, c, a.repeats)
        plan = SamplingConfig(prefill_chunk=c).prefill_chunks(a.prompt)
        print(f"prefill_chunk={c:<4d} forwards={len(plan)} ms={ms[c]:.1f} "
              f"vs_whole={ms[0] / ms[c]:.2f}x", flush=True)
    temp = {}
    if not a.skip_memory:
        prompts = (512, 1024, 2048, 4096)
        print("# XLA temp MiB of the prefill, tiny preset, batch 2, prompt = " +
              " / ".join(map(str, prompts)))
        for ac, pc in ((0, 0), (0, 64), (64, 64)):
            row = [temp_mib(ac, pc, p) for p in prompts]
            temp[f"attention_chunk={ac} prefill_chunk={pc}"] = dict(zip(map(str, prompts), row))
            print(f"attention_chunk={ac:<3d} prefill_chunk={pc:<3d} temp_mib="
                  + " / ".join(f"{r:.1f}" for r in row), flush=True)
    c = chunks[1]
    print(f"whole_ms={ms[0]:.1f} chunked_ms={ms[c]:.1f} ratio={ms[0] / ms[c]:.2f}")
    finish("prefill", {"whole_ms": ms[0], "chunked_ms": ms[c], "ratio": ms[0] / ms[c],
                       "prefill_chunk": c, "ms_by_chunk": ms, "xla_temp_mib": temp,
                       "preset": a.preset, "batch": a.batch, "prompt": a.prompt},
           record=not a.no_record)


if __name__ == "__main__":
    main()
