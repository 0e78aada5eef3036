"""Forward pass: our jitted Flax NNX Llama vs transformers' PyTorch LlamaForCausalLM, same weights.

    python benchmarks/forward.py                      # CPU: small_20m (~20M params), batch 8 x 256
    python benchmarks/forward.py --preset tiny --batch 4 --seq 64 --repeats 3

The weights go through our `save_pretrained` -> transformers' `from_pretrained`, and the two
logits are compared before timing (max abs difference printed). Fair by default: both sides
run float32 on CPU, the same batch, and PyTorch gets as many threads as JAX has cores
(`--torch_threads 0`; fewer is printed and recorded as a handicap); each side has one untimed
call first (ours: the compile); the two are timed alternately and the median of `--repeats`
calls each is kept. ratio = ours_s / torch_s (below 1: ours is faster).
Summary line: `ours_s=... torch_s=... ratio=...`, then `result: <file>` (benchmarks/results/)
and the machine line, last.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import NO_RECORD_HELP, finish, resolve_threads, thread_handicap  # benchmarks/
from flax import nnx

from jaxsocial.models import checkpoint_hf, llama


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small_20m")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch_threads", type=int, default=0,
                        help="PyTorch's intra-op threads (0, default: as many as JAX has cores; "
                             "fewer is a handicap, printed and recorded)")
    parser.add_argument("--no_record", action="store_true", help=NO_RECORD_HELP)
    args = parser.parse_args()

    import torch
    import transformers

    torch.set_num_threads(resolve_threads(args.torch_threads))
    handicap = thread_handicap(torch.get_num_threads())
    if handicap:
        print(handicap, flush=True)

    cfg = llama.preset(args.preset)
    model = llama.init(cfg, seed=args.seed)
    with tempfile.TemporaryDirectory() as d:
        checkpoint_hf.save_pretrained(model, d)
        hf = transformers.LlamaForCausalLM.from_pretrained(
            d, dtype=torch.float32, local_files_only=True).eval()

    rng = np.random.RandomState(args.seed)
    ids = rng.randint(0, cfg.vocab_size, (args.batch, args.seq)).astype(np.int32)
    mask = np.ones_like(ids)

    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, ids, mask):
        return nnx.merge(graphdef, state)(ids, mask)

    ids_j, mask_j = jnp.asarray(ids), jnp.asarray(mask)
    ids_t, mask_t = torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(mask)

    def ours():
        return forward(state, ids_j, mask_j).block_until_ready()

    def theirs():
        with torch.inference_mode():
            return hf(input_ids=ids_t, attention_mask=mask_t).logits

    t0 = time.perf_counter()
    ours_logits = np.asarray(ours())
    compile_s = time.perf_counter() - t0
    torch_logits = theirs().numpy()
    diff = float(np.abs(ours_logits - torch_logits).max())

    # Alternate the two so that a change in machine load (shared CPUs) hits both alike.
    ours_t, torch_t = [], []
    for _ in range(args.repeats):
        ours_t.append(_seconds(ours))
        torch_t.append(_seconds(theirs))
    ours_s, torch_s = statistics.median(ours_t), statistics.median(torch_t)
    print(f"config {args.preset}: {cfg.num_params() / 1e6:.1f}M params, batch {args.batch} x "
          f"{args.seq} tokens, float32, {jax.devices()[0].platform} "
          f"(jax {jax.__version__}, torch {torch.__version__}, {torch.get_num_threads()} torch "
          f"threads)")
    print(f"max |logits ours - torch| = {diff:.2e}; our compile + first call {compile_s:.2f} s")
    tokens = args.batch * args.seq
    print(f"ours (jax.jit):     {ours_s * 1e3:9.1f} ms  ({tokens / ours_s:,.0f} tokens/s)")
    print(f"torch (eager, CPU): {torch_s * 1e3:9.1f} ms  ({tokens / torch_s:,.0f} tokens/s)")
    print(f"ours_s={ours_s:.4f} torch_s={torch_s:.4f} ratio={ours_s / torch_s:.3f}")
    finish("forward", {"ours_s": ours_s, "torch_s": torch_s, "ratio": ours_s / torch_s,
                       "ours_tok_s": tokens / ours_s, "torch_tok_s": tokens / torch_s,
                       "max_abs_logit_diff": diff, "compile_s": compile_s,
                       "torch_threads": torch.get_num_threads(), "handicap": handicap,
                       "preset": args.preset, "batch": args.batch, "seq": args.seq},
           record=not args.no_record)


if __name__ == "__main__":
    main()
