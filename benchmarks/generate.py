"""Generation throughput: jaxsocial `generate` vs transformers' PyTorch `generate`, same weights.

    python benchmarks/generate.py                          # CPU: the three rows below
    python benchmarks/generate.py --rows=topk              # one row
    python benchmarks/generate.py --preset llama3_8b --batch 196 --dtype bfloat16 --skip_hf \
        --rows=topk                                        # H200

Rows: `topk` = `--preset` (small_20m), batch 32, prompt 128, 64 new,
T=1 top-k 50 top-p 0.95; `temperature` = the same with temperature only; `smol` = SmolLM2-135M's
shapes (random weights: speed does not depend on them, and no row stops early), batch 16, prompt
64, 128 new (decode-heavy). One line per row, then the CPU roofline of each row's decode: FLOPs
and bytes per step (every weight and cached K/V byte read once) against the sgemm GFLOP/s and
the read bandwidth of a matrix-vector product, measured in the same process; `decode_share` =
our decode-only tokens/s over that bound; `floor_tok_s` = the fastest the row could run with
XLA's dense products as they run here and every other part at its floor (`floor_seconds`), and
`floor_ratio` that over HF: the most any change outside XLA's matmuls could reach.

Fair by default: both sides sample with the row's settings (temperature 1, top-k / top-p as
the row says) for exactly the row's new tokens (no stop ids), from the same random left-padded
prompts, in the same dtype (`--dtype`: HF loads our weights in it too), with as many threads as
JAX has cores (`--hf_threads 0`; fewer is printed and recorded as a handicap); each side has one
untimed warm-up call (ours: the compile) and the best of `--repeats` timed calls is kept.
tokens/s = batch * new / seconds (prefill included).
Also prints the analytic decode roofline of Llama-3-8B on one H200: per decode step every
weight byte and every cached K/V byte is read once, so step time >= bytes / HBM bandwidth
(4.8 TB/s, as in the `--device_peaks` example).
Summary line: `ours_tok_s=... hf_tok_s=... ratio=...` of the first row, then `result: <file>`
(benchmarks/results/) and the machine line, last.
"""

from __future__ import annotations

import argparse
import importlib
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import NO_RECORD_HELP, finish, resolve_threads, thread_handicap  # benchmarks/
from decode_profile import best, dense_matmuls  # benchmarks/: the profile's parts
from flax import nnx

from jaxsocial.generation import SamplingConfig, generate, sampling
from jaxsocial.models import checkpoint_hf, llama

generate_module = importlib.import_module("jaxsocial.generation.generate")


def torch_model(model: llama.Llama, directory: str = "", dtype: str = "float32"):
    """transformers LlamaForCausalLM holding `model`'s weights: `checkpoint_hf.save_pretrained` then
    `LlamaForCausalLM.from_pretrained` (in `dtype`, eval mode). `directory`: where the
    checkpoint is written and kept (default: a temporary folder, removed)."""
    import torch
    from transformers import LlamaForCausalLM

    def load(d):
        checkpoint_hf.save_pretrained(model, d)
        return LlamaForCausalLM.from_pretrained(d, dtype=getattr(torch, dtype),
                                                local_files_only=True).eval()

    if directory:
        return load(directory)
    with tempfile.TemporaryDirectory() as d:
        return load(d)


def roofline(prompt: int, new: int, batch: int = 196, hbm_bytes_s: float = 4.8e12,
             bytes_per_value: int = 2) -> dict:
    """Decode roofline of Llama-3-8B (bf16) on one H200 (HBM3e, 4.8 TB/s) at the mean decode
    context."""
    c = llama.preset("llama3_8b")
    weight_bytes = c.num_params() * bytes_per_value
    kv_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * bytes_per_value
    context = prompt + new / 2
    kv_bytes = batch * context * kv_per_token
    step_s = (weight_bytes + kv_bytes) / hbm_bytes_s
    return dict(weight_gb=weight_bytes / 1e9, kv_gb=kv_bytes / 1e9, context=context,
                step_ms=step_s * 1e3, tok_s=batch / step_s, batch=batch,
                hbm_tb_s=hbm_bytes_s / 1e12)


def timed(fn, repeats):
    """Best wall seconds over `repeats` calls (call i uses seed i + 1), and that call's CPU-s."""
    best = (float("inf"), float("nan"))
    for i in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn(i + 1)
        best = min(best, (time.perf_counter() - t0, time.process_time() - c0))
    return best


SMOL_SHAPES = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                   num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                   head_dim=64, tie_word_embeddings=True)


def row_specs(args) -> dict:
    """name -> (preset overrides, batch, prompt, new, top_k, top_p)."""
    return {
        "topk": ({}, args.batch, args.prompt, args.new, 50, 0.95),
        "temperature": ({}, args.batch, args.prompt, args.new, 0, 1.0),
        "smol": (SMOL_SHAPES, 16, 64, 128, 50, 0.95),
    }


def machine_peaks(dtype) -> tuple:
    """(sgemm FLOP/s, read bytes/s) measured by JAX on this device, best of 5: a 1024^3
    matmul, and a matrix-vector product over 256 MiB (what a decode step does with its
    weights; a copy would also pay for allocating its output)."""
    a = jnp.ones((1024, 1024), dtype)
    x = jnp.ones((8192, 8192), jnp.float32)
    v = jnp.ones((8192,), jnp.float32)
    mm, mv = jax.jit(lambda a: a @ a), jax.jit(lambda x, v: x @ v)
    out = []
    for fn, args in ((mm, (a,)), (mv, (x, v))):
        jax.block_until_ready(fn(*args))
        out.append(min(_time(lambda: jax.block_until_ready(fn(*args))) for _ in range(5)))
    return 2 * 1024 ** 3 / out[0], x.size * 4 / out[1]


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def decode_bound(cfg, batch: int, context: float, flops_s: float, bytes_s: float) -> float:
    """Decode tokens/s upper bound: per step 2 x (non-embedding params + LM head) x batch
    FLOPs + attention, and every weight and cached K/V byte read once."""
    dense = cfg.num_params() - cfg.vocab_size * cfg.hidden_size * (
        1 if cfg.tie_word_embeddings else 2) + cfg.vocab_size * cfg.hidden_size
    attn = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * context
    flops = batch * (2 * dense + attn)
    weight_bytes = cfg.num_params() * jnp.dtype(cfg.dtype).itemsize
    step = max(flops / flops_s, (weight_bytes + kv_cache_bytes(cfg, batch, context)) / bytes_s)
    return batch / step


def kv_cache_bytes(cfg, batch: int, context: float) -> float:
    """Bytes of cached K and V that `batch` rows of `context` tokens hold (compute dtype)."""
    return (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * context * batch
            * jnp.dtype(cfg.dtype).itemsize)


def run_row(name, spec, args, peaks) -> dict:
    overrides, batch, prompt, new, top_k, top_p = spec
    cfg = llama.preset(args.preset, dtype=args.dtype, param_dtype=args.dtype,
                       scan_layers=args.scan_layers, **overrides)
    model = llama.Llama(cfg, rngs=nnx.Rngs(args.seed))
    rs = np.random.RandomState(args.seed)
    ids = rs.randint(3, cfg.vocab_size, (batch, prompt)).astype(np.int32)
    lengths = rs.randint(prompt // 2, prompt + 1, batch)
    lengths[0] = prompt
    mask = np.arange(prompt)[None, :] >= (prompt - lengths)[:, None]
    pad = 0 if cfg.pad_token_id is None else cfg.pad_token_id
    ids = np.where(mask, ids, pad).astype(np.int32)
    sc = SamplingConfig(max_new_tokens=new, temperature=1.0, top_k=top_k, top_p=top_p,
                        stop_token_ids=(), prompt_bucket=64, prefill_chunk=args.prefill_chunk)
    n_tok = batch * new

    def ours(i):
        out = generate(model, ids, mask, jax.random.key(i), sc)
        jax.block_until_ready(out.tokens)
        return out

    t0 = time.perf_counter()
    out = ours(0)
    compile_s = time.perf_counter() - t0
    assert int(out.lengths.min()) == new, "every row must produce `new` tokens"
    ours_s, ours_cpu = timed(ours, args.repeats)
    # Decode alone: the compiled prefill of the same call, timed apart.
    graphdef, state = nnx.split(model)
    bucket = generate_module.bucket_length(prompt, sc.prompt_bucket)
    prefill, _ = generate_module.PROGRAMS.get(graphdef, bucket, batch, sc, False, False)
    pids = np.concatenate([np.full((batch, bucket - prompt), pad, np.int32), ids], 1)
    pmask = np.concatenate([np.zeros((batch, bucket - prompt), bool), mask], 1)
    jax.block_until_ready(prefill(state, pids, pmask))
    prefill_s = min(_time(lambda: jax.block_until_ready(prefill(state, pids, pmask)))
                    for _ in range(args.repeats))
    decode_tok_s = n_tok / max(ours_s - prefill_s, 1e-9)
    res = dict(row=name, params_m=cfg.num_params() / 1e6, batch=batch, prompt=prompt, new=new,
               top_k=top_k, top_p=top_p, ours_tok_s=n_tok / ours_s, compile_s=compile_s,
               ours_cpu_s=ours_cpu, prefill_s=prefill_s, decode_tok_s=decode_tok_s,
               hf_tok_s=float("nan"))
    if peaks is not None:
        bound = decode_bound(cfg, batch, prompt + new / 2, *peaks)
        res.update(decode_bound_tok_s=bound, decode_share=decode_tok_s / bound)
        if jax.default_backend() == "cpu":
            res["floor_tok_s"] = n_tok / floor_seconds(cfg, state, sc, batch, bucket,
                                                       prompt + new / 2, peaks[1], args.repeats)
    if not args.skip_hf:
        import torch
        torch.set_num_threads(resolve_threads(args.hf_threads))
        tm = torch_model(model, dtype=args.dtype)  # the same dtype as ours
        t_ids = torch.from_numpy(ids.astype(np.int64))
        t_mask = torch.from_numpy(mask.astype(np.int64))
        kw = dict(do_sample=True, temperature=1.0, max_new_tokens=new, min_new_tokens=new,
                  pad_token_id=pad, top_k=top_k, top_p=top_p)  # 0 / 1.0: off

        def hf(i):
            torch.manual_seed(i)
            with torch.inference_mode():
                return tm.generate(input_ids=t_ids, attention_mask=t_mask, **kw)

        r = hf(0)
        assert r.shape == (batch, prompt + new), r.shape
        hf_s, hf_cpu = timed(hf, args.repeats)
        res.update(hf_tok_s=n_tok / hf_s, hf_cpu_s=hf_cpu, hf_threads=torch.get_num_threads())
    res["ratio"] = res["ours_tok_s"] / res["hf_tok_s"]
    res["floor_ratio"] = res.get("floor_tok_s", float("nan")) / res["hf_tok_s"]
    return res


def floor_seconds(cfg, state, sc, batch, bucket, context, bytes_s, repeats) -> float:
    """The fastest this row's `generate` could be with XLA's dense products as fast as they run
    here and everything else at its floor: the prefill's matmuls (batch x bucket rows, the LM
    head on the last slot only), then per decode step the step's matmuls, one read of the K/V
    cache at the mean context at the measured read bandwidth, and `sampling.sample` (all
    measured in this process; attention, norms, RoPE, softmax and the loop count zero)."""
    w = nnx.to_pure_dict(state)
    h, dt = cfg.hidden_size, cfg.dtype
    repeats = max(repeats, 10)  # short calls: best of more, so a slow moment does not count
    matmuls = dense_matmuls(cfg, batch)
    x, xs = jnp.ones((batch * bucket, h), dt), jnp.ones((batch, h), dt)
    t_prefill = best(lambda: matmuls(w, x), repeats)
    t_mm = best(lambda: matmuls(w, xs), repeats)
    logits = jax.random.normal(jax.random.key(0), (batch, cfg.vocab_size))
    draw = jax.jit(lambda k, lg: sampling.sample(k, lg, sc)[0])
    t_sample = best(lambda: draw(jax.random.key(1), logits), repeats)
    kv_s = kv_cache_bytes(cfg, batch, context) / bytes_s
    return t_prefill + sc.max_new_tokens * (t_mm + kv_s + t_sample)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="topk,temperature,smol")
    ap.add_argument("--preset", default="small_20m", help="the topk / temperature rows' model")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--dtype", default="float32", help="compute/param dtype of our model")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hf_threads", type=int, default=0,
                    help="torch intra-op threads for the peer (0, default: as many as JAX has "
                         "cores, so both sides get the same cores; fewer is a handicap, printed "
                         "and recorded)")
    ap.add_argument("--skip_hf", action="store_true", help="no PyTorch peer (e.g. on a GPU box)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scan_layers", action="store_true",
                    help="our model's layers as one lax.scan (LlamaConfig.scan_layers)")
    ap.add_argument("--prefill_chunk", type=int, default=SamplingConfig.prefill_chunk,
                    help="SamplingConfig.prefill_chunk (0 = the whole prompt in one forward)")
    ap.add_argument("--device_peaks", default="",
                    help="TFLOPS,GB_S: the accelerator's peak compute and memory bandwidth for "
                         "decode_share (e.g. 989,4800 on an H200); on a CPU they are measured")
    ap.add_argument("--no_record", action="store_true", help=NO_RECORD_HELP)
    args = ap.parse_args()
    handicap = None if args.skip_hf else thread_handicap(resolve_threads(args.hf_threads))
    if handicap:
        print(handicap, flush=True)

    on_cpu = jax.devices()[0].platform == "cpu"
    peaks = machine_peaks(args.dtype) if on_cpu else None
    if args.device_peaks:
        try:
            tflops, gb_s = (float(x) for x in args.device_peaks.split(","))
        except ValueError:
            raise SystemExit(f"--device_peaks={args.device_peaks!r}: expected TFLOPS,GB_S")
        peaks = (tflops * 1e12, gb_s * 1e9)
    print(f"device={jax.devices()[0].device_kind} dtype={args.dtype} cpus={os.cpu_count()}"
          + (f" peak_gflop_s={peaks[0] / 1e9:.0f} read_gb_s={peaks[1] / 1e9:.1f}" if peaks
             else ""))
    specs = row_specs(args)
    results = []
    for name in args.rows.split(","):
        r = run_row(name, specs[name], args, peaks)
        results.append(r)
        share = (f" decode_tok_s={r['decode_tok_s']:.0f} bound={r['decode_bound_tok_s']:.0f}"
                 f" decode_share={100 * r['decode_share']:.0f}%" if peaks else "")
        if "floor_tok_s" in r:
            share += f" floor_tok_s={r['floor_tok_s']:.0f} floor_ratio={r['floor_ratio']:.2f}"
        print(f"row={name} params={r['params_m']:.0f}M batch={r['batch']} prompt={r['prompt']}"
              f" new={r['new']} top_k={r['top_k']} top_p={r['top_p']}"
              f" ours_tok_s={r['ours_tok_s']:.0f} hf_tok_s={r['hf_tok_s']:.0f}"
              f" ratio={r['ratio']:.2f} compile_s={r['compile_s']:.1f}"
              f" prefill_ms={1e3 * r['prefill_s']:.0f}{share}", flush=True)

    r = roofline(args.prompt, args.new)
    print(f"roofline llama3_8b bf16 on H200 ({r['hbm_tb_s']:.1f} TB/s), batch {r['batch']}, "
          f"mean context {r['context']:.0f}: weights {r['weight_gb']:.2f} GB + KV "
          f"{r['kv_gb']:.2f} GB per step -> {r['step_ms']:.2f} ms/step -> {r['tok_s']:.0f} "
          f"decode tok/s upper bound")
    h = results[0]
    print(f"ours_tok_s={h['ours_tok_s']:.1f} hf_tok_s={h['hf_tok_s']:.1f} ratio={h['ratio']:.2f}")
    finish("generate", {"ours_tok_s": h["ours_tok_s"], "hf_tok_s": h["hf_tok_s"],
                        "ratio": h["ratio"], "dtype": args.dtype, "handicap": handicap,
                        "rows": results, "h200_roofline_llama3_8b": r},
           record=not args.no_record)


if __name__ == "__main__":
    main()
