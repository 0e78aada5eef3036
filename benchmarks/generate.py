"""Generation throughput: jaxsocial `generate` vs transformers' PyTorch `generate`, same weights.

    python benchmarks/generate.py                          # CPU: small_20m, batch 32, 128 + 64
    python benchmarks/generate.py --preset llama3_8b --batch 196 --dtype bfloat16 --skip_hf  # H200

Both sides sample (temperature 1, top-k 50, top-p 0.95) for exactly `--new` tokens (no stop
ids), from the same random left-padded prompts; compile / warm-up calls are excluded and the
best of `--repeats` timed calls is kept. tokens/s = batch * new / seconds (prefill included).
Also prints the analytic decode roofline of Llama-3-8B on one H200: per decode step every
weight byte and every cached K/V byte is read once, so step time >= bytes / HBM bandwidth.
Last line: `ours_tok_s=... hf_tok_s=... ratio=...`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import jax
import numpy as np
from flax import nnx

from jaxsocial.generation import SamplingConfig, generate
from jaxsocial.models import checkpoint_hf, llama


def torch_model(model: llama.Llama):
    """transformers LlamaForCausalLM holding `model`'s weights: `checkpoint_hf.save_pretrained` then
    `LlamaForCausalLM.from_pretrained` (float32)."""
    import torch
    from transformers import LlamaForCausalLM

    with tempfile.TemporaryDirectory() as d:
        checkpoint_hf.save_pretrained(model, d)
        return LlamaForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                local_files_only=True).eval()


def roofline(prompt: int, new: int, batch: int = 196, hbm_bytes_s: float = 4.3e12,
             bytes_per_value: int = 2) -> dict:
    """Decode roofline of Llama-3-8B (bf16) on one H200 at the mean decode context."""
    c = llama.preset("llama3_8b")
    weight_bytes = c.num_params() * bytes_per_value
    kv_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * bytes_per_value
    context = prompt + new / 2
    kv_bytes = batch * context * kv_per_token
    step_s = (weight_bytes + kv_bytes) / hbm_bytes_s
    return dict(weight_gb=weight_bytes / 1e9, kv_gb=kv_bytes / 1e9, context=context,
                step_ms=step_s * 1e3, tok_s=batch / step_s, batch=batch)


def timed(fn, repeats):
    """Best wall seconds over `repeats` calls (call i uses seed i + 1), and that call's CPU-s."""
    best = (float("inf"), float("nan"))
    for i in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn(i + 1)
        best = min(best, (time.perf_counter() - t0, time.process_time() - c0))
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small_20m")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--dtype", default="float32", help="compute/param dtype of our model")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--hf_threads", type=int, default=0,
                    help="torch intra-op threads for the peer (0 = torch's default)")
    ap.add_argument("--skip_hf", action="store_true", help="no PyTorch peer (e.g. on a GPU box)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    cfg = llama.preset(args.preset, dtype=args.dtype, param_dtype=args.dtype)
    print(f"device={jax.devices()[0].device_kind} preset={args.preset} "
          f"params={cfg.num_params() / 1e6:.1f}M batch={args.batch} prompt={args.prompt} "
          f"new={args.new} dtype={args.dtype} cpus={os.cpu_count()}")
    model = llama.Llama(cfg, rngs=nnx.Rngs(args.seed))
    rs = np.random.RandomState(args.seed)
    ids = rs.randint(3, cfg.vocab_size, (args.batch, args.prompt)).astype(np.int32)
    lengths = rs.randint(args.prompt // 2, args.prompt + 1, args.batch)
    lengths[0] = args.prompt
    mask = np.arange(args.prompt)[None, :] >= (args.prompt - lengths)[:, None]
    pad = 0 if cfg.pad_token_id is None else cfg.pad_token_id
    ids = np.where(mask, ids, pad).astype(np.int32)
    sc = SamplingConfig(max_new_tokens=args.new, temperature=1.0, top_k=50, top_p=0.95,
                        stop_token_ids=(), prompt_bucket=64)
    n_tok = args.batch * args.new

    def ours(i):
        out = generate(model, ids, mask, jax.random.key(i), sc)
        jax.block_until_ready(out.tokens)
        return out

    t0 = time.perf_counter()
    out = ours(0)
    compile_s = time.perf_counter() - t0
    assert int(out.lengths.min()) == args.new, "every row must produce --new tokens"
    ours_s, ours_cpu = timed(ours, args.repeats)
    ours_tok_s = n_tok / ours_s
    print(f"ours: first call (compile) {compile_s:.2f}s, best {ours_s:.3f}s wall "
          f"({ours_cpu:.2f} CPU-s) -> {ours_tok_s:.0f} tok/s")

    hf_tok_s = float("nan")
    if not args.skip_hf:
        import torch
        if args.hf_threads:
            torch.set_num_threads(args.hf_threads)
        tm = torch_model(model)
        t_ids = torch.from_numpy(ids.astype(np.int64))
        t_mask = torch.from_numpy(mask.astype(np.int64))
        kw = dict(do_sample=True, temperature=1.0, top_k=50, top_p=0.95, max_new_tokens=args.new,
                  min_new_tokens=args.new, pad_token_id=pad)

        def hf(i):
            torch.manual_seed(i)
            with torch.inference_mode():
                return tm.generate(input_ids=t_ids, attention_mask=t_mask, **kw)

        res = hf(0)
        assert res.shape == (args.batch, args.prompt + args.new), res.shape
        hf_s, hf_cpu = timed(hf, args.repeats)
        hf_tok_s = n_tok / hf_s
        print(f"transformers {__import__('transformers').__version__} / torch {torch.__version__}"
              f" ({torch.get_num_threads()} threads): best {hf_s:.3f}s wall ({hf_cpu:.2f} CPU-s)"
              f" -> {hf_tok_s:.0f} tok/s")
        print(f"CPU-time ratio (less sensitive to other load on the machine): "
              f"{hf_cpu / ours_cpu:.2f}")

    r = roofline(args.prompt, args.new)
    print(f"roofline llama3_8b bf16 on H200 (4.3 TB/s), batch {r['batch']}, mean context "
          f"{r['context']:.0f}: weights {r['weight_gb']:.2f} GB + KV {r['kv_gb']:.2f} GB per "
          f"step -> {r['step_ms']:.2f} ms/step -> {r['tok_s']:.0f} decode tok/s upper bound")
    ratio = ours_tok_s / hf_tok_s
    print(f"ours_tok_s={ours_tok_s:.1f} hf_tok_s={hf_tok_s:.1f} ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
