#!/usr/bin/env bash
# Throughput on one accelerator, one line per row: rollout tokens/s, PPO tokens/s, MFU against
# the device's peak, peak memory. Rows: SmolLM2-135M-Instruct (the packaged GGUF) and a
# llama3_2_1b-shaped random model, both in configs/general.py's society (each also with the
# compiler's own memory figure beside the measured peak); then a decode row (llama3_8b shapes,
# bf16, 196 rows: tokens/s and share of the roofline). Budget: <= 8 min on one H200 (each
# of the three rows is capped at 150 s by `timeout`).
#
#   benchmarks/gpu.sh                 # on the GPU (PEAK_TFLOPS=989: H100/H200 dense bf16)
#   benchmarks/gpu.sh --dry           # tiny shapes on CPU: checks the script end to end
#                                     # (--cpu_smoke: the same)
#
# SmolLM2: the device machine has no network, so fetch the GGUF beforehand on a host that has
# (`python -c "from jaxsocial.models import zoo; print(zoo.smollm2_135m_instruct())"`) and
# point SMOLLM2_GGUF at it (default: the zoo's cache path); the row is skipped if it is absent.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/jaxsocial_gpu_bench}
mkdir -p "$OUT"
PEAK=${PEAK_TFLOPS:-989}
SMOKE=0
[[ "${1:-}" == "--cpu_smoke" || "${1:-}" == "--dry" ]] && SMOKE=1
# 3 x 150 s on the GPU; on a CPU (smoke) compiling dominates, so allow more.
ROW_TIMEOUT=${ROW_TIMEOUT:-$([[ $SMOKE == 1 ]] && echo 1800 || echo 150)}

# generate.py's result file (benchmarks/results/README.md) goes beside the logs; none for a smoke.
export JAXSOCIAL_BENCH_RESULTS=${JAXSOCIAL_BENCH_RESULTS:-$OUT/results}
if [[ $SMOKE == 1 ]]; then
  export JAX_PLATFORMS=cpu
  export JAXSOCIAL_NO_RECORD=1
  COMMON=(--config=configs/general.py:smoke --repeats=1 --peak_tflops=0.1)
  SMOL=(--config.model.preset=tiny)          # no download on CPU: the tiny model stands in
  ONEB=(--config.model.preset=tiny --config.agents.num_agents=8)
else
  GGUF=${SMOLLM2_GGUF:-$(python -c "import os.path as p; from jaxsocial.models import zoo; print(p.join(zoo.cache_dir(), 'smollm2-135m-instruct', p.basename(zoo.SMOLLM2_MEMBER)))" 2>/dev/null)}
  COMMON=(--config=configs/general.py --repeats=2 --peak_tflops="$PEAK"
          --config.mesh.shape='(1,1,1)' --config.rollout.ticks_per_epoch=4
          # Smaller than general.py (30,720 trajectories per epoch): 32 agents, all acting in
          # each of 4 ticks, so a row fits its time budget.
          --config.agents.num_agents=32 --config.agents.active_per_tick=0
          --config.agents.activation.enabled=False --config.society.content_len=32
          --config.society.feed_size=3 --config.rl.num_minibatches=4 --config.rl.micro_batch=8
          --config.rl.ppo_epochs=1)
  SMOL=(--config.model.checkpoint="$GGUF" --config.model.remat=False)
  ONEB=(--config.model.preset=llama3_2_1b --config.model.require_checkpoint=False)
fi

row() {  # name, extra args...
  local name=$1; shift
  local start=$SECONDS
  if timeout "$ROW_TIMEOUT" python launch/throughput.py "${COMMON[@]}" "$@" \
      --out="$OUT/$name.json" > "$OUT/$name.log" 2>&1; then
    python - "$OUT/$name.json" "$name" $((SECONDS - start)) <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
mfu = lambda k: f"{100 * r[k]:.2f}%" if k in r else "n/a"  # noqa: E731
print(f"row={sys.argv[2]} backend={r['backend']} params={r['params'] / 1e6:.0f}M "
      f"rollout_tok_s={r['tokens_per_s']:.0f} ppo_tok_s={r['ppo_tokens_per_s']:.0f} "
      f"rollout_mfu={mfu('rollout_mfu')} update_mfu={mfu('update_mfu')} "
      f"peak_mem_gb={r['peak_memory_gb']:.2f}({r['peak_memory_kind']}) "
      f"compiled_gb={r['compiled_memory_gb']:.2f} "
      f"compile_s={r['compile_rollout_s'] + r['compile_update_s']:.0f} wall_s={sys.argv[3]}")
PY
  else
    echo "row=$name FAILED or timed out after $((SECONDS - start)) s (log: $OUT/$name.log)"
    tail -5 "$OUT/$name.log"
  fi
}

if [[ $SMOKE == 0 && ! -f "${GGUF:-}" ]]; then
  echo "row=smollm2_135m SKIPPED: no GGUF at '${GGUF:-}' (set SMOLLM2_GGUF)"
else
  row smollm2_135m "${SMOL[@]}"
fi
row llama3_2_1b_random "${ONEB[@]}"

# Decode against the roofline: a llama3_8b-shaped random model (the paper's size), 196 rows
# (general.py's agents), T=1 top-k 50 top-p 0.95, bf16; decode_share = decode tokens/s over the
# bound from the device's peak FLOP/s and HBM bandwidth (PEAK_TFLOPS, HBM_GB_S; H200: 989, 4800).
if [[ $SMOKE == 1 ]]; then
  DECODE=(--preset=tiny --batch=8 --prompt=32 --new=8 --repeats=1 --dtype=float32)
else
  DECODE=(--preset=llama3_8b --batch=196 --prompt=1024 --new=128 --repeats=2
          --dtype=bfloat16 --device_peaks="$PEAK,${HBM_GB_S:-4800}")
fi
start=$SECONDS
if timeout "$ROW_TIMEOUT" python benchmarks/generate.py --rows=topk --skip_hf "${DECODE[@]}" \
    > "$OUT/decode.log" 2>&1; then
  echo "$(grep '^row=topk' "$OUT/decode.log" | sed 's/^row=topk/row=decode_8b/') wall_s=$((SECONDS - start))"
else
  echo "row=decode_8b FAILED or timed out after $((SECONDS - start)) s (log: $OUT/decode.log)"
  tail -5 "$OUT/decode.log"
fi
