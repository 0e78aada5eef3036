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
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxsocial.generation import SamplingConfig, generate
from jaxsocial.models import llama


def torch_model(model: llama.Llama):
    """transformers LlamaForCausalLM holding `model`'s weights (float32)."""
    import torch
    from transformers import LlamaConfig as HFConfig, LlamaForCausalLM

    c = model.config
    hf = HFConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                  intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
                  num_attention_heads=c.num_attention_heads,
                  num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
                  rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
                  rope_scaling=c.rope_scaling_dict,
                  max_position_embeddings=c.max_position_embeddings,
                  tie_word_embeddings=c.tie_word_embeddings, bos_token_id=c.bos_token_id,
                  eos_token_id=list(c.eos_token_ids) or None, pad_token_id=c.pad_token_id)
    t = lambda x: torch.from_numpy(np.asarray(x, np.float32).copy())  # noqa: E731
    sd = {"model.embed_tokens.weight": t(model.embed_tokens[...]),
          "model.norm.weight": t(model.norm.weight[...])}
    if model.lm_head is not None:
        sd["lm_head.weight"] = t(model.lm_head[...]).T.contiguous()
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        for n in "qkvo":
            sd[p + f"self_attn.{n}_proj.weight"] = t(
                getattr(layer.self_attn, n + "_proj")[...]).T.contiguous()
        for n in ("gate", "up", "down"):
            sd[p + f"mlp.{n}_proj.weight"] = t(getattr(layer.mlp, n + "_proj")[...]).T.contiguous()
        sd[p + "input_layernorm.weight"] = t(layer.input_layernorm.weight[...])
        sd[p + "post_attention_layernorm.weight"] = t(layer.post_attention_layernorm.weight[...])
    tm = LlamaForCausalLM(hf).eval()
    missing, unexpected = tm.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise RuntimeError(f"weight copy failed: missing={missing} unexpected={unexpected}")
    return tm


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small_20m")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--dtype", default="float32", help="compute/param dtype of our model")
    ap.add_argument("--repeats", type=int, default=2)
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
    times = []
    for i in range(args.repeats):
        t0 = time.perf_counter()
        ours(i + 1)
        times.append(time.perf_counter() - t0)
    ours_s = min(times)
    ours_tok_s = n_tok / ours_s
    print(f"ours: first call (compile) {compile_s:.2f}s, best {ours_s:.3f}s "
          f"-> {ours_tok_s:.0f} tok/s")

    hf_tok_s = float("nan")
    if not args.skip_hf:
        import torch
        tm = torch_model(model)
        t_ids, t_mask = torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask.astype(np.int64))
        kw = dict(do_sample=True, temperature=1.0, top_k=50, top_p=0.95, max_new_tokens=args.new,
                  min_new_tokens=args.new, pad_token_id=pad)

        def hf(i):
            torch.manual_seed(i)
            with torch.inference_mode():
                return tm.generate(input_ids=t_ids, attention_mask=t_mask, **kw)

        res = hf(0)
        assert res.shape == (args.batch, args.prompt + args.new), res.shape
        times = []
        for i in range(args.repeats):
            t0 = time.perf_counter()
            hf(i + 1)
            times.append(time.perf_counter() - t0)
        hf_s = min(times)
        hf_tok_s = n_tok / hf_s
        print(f"transformers {__import__('transformers').__version__} / torch {torch.__version__}"
              f" ({torch.get_num_threads()} threads): best {hf_s:.3f}s -> {hf_tok_s:.0f} tok/s")

    r = roofline(args.prompt, args.new)
    print(f"roofline llama3_8b bf16 on H200 (4.3 TB/s), batch {r['batch']}, mean context "
          f"{r['context']:.0f}: weights {r['weight_gb']:.2f} GB + KV {r['kv_gb']:.2f} GB per "
          f"step -> {r['step_ms']:.2f} ms/step -> {r['tok_s']:.0f} decode tok/s upper bound")
    ratio = ours_tok_s / hf_tok_s
    print(f"ours_tok_s={ours_tok_s:.1f} hf_tok_s={hf_tok_s:.1f} ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
