r"""Per-device memory of configs/general.py's epoch on its target meshes, by XLA's own count.

    python benchmarks/aot_memory.py --target=tpu:v5e:8x8  # libtpu's own figures (all TPU rows:
    python benchmarks/aot_memory.py --target=tpu          #   --target=tpu; GPU: --target=gpu)
    python benchmarks/aot_memory.py --programs=epoch      # all rows, the one-program epoch
    python benchmarks/aot_memory.py --rows=h200_1b,h100   # the three programs
    python benchmarks/aot_memory.py --rows=h100 --set rl.micro_batch=4 --layers=8
    python benchmarks/aot_memory.py --programs=epoch --set model.scan_layers=False  # unrolled

configs/general.py scans its decoder layers (`model.scan_layers=True`: one `lax.scan` over
weights stacked inside the program); `--set model.scan_layers=False` compiles the unrolled
layers.

Each row compiles the preset at its full depth (1-2 min per row and program set on a 2-core
CPU: the layers' shapes repeat, so XLA's compile time grows slowly with depth).

Each row runs in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=N (the
target's device count) set before jax is imported, builds the run with an abstract model
(`jaxsocial.scale.aot`: ShapeDtypeStruct weights with the loop's shardings, nothing
allocated), lowers and compiles the rollout, scoring and update programs for the (data, fsdp,
tensor) mesh, and prints XLA's `compiled.memory_analysis()` per device. The summary line is
the last row's (the 8 x H100 row by default), followed by `result: <file>`
(benchmarks/results/) and the machine line, last:

    preset=llama3_8b mesh=1x8x1 xla_gib=X fits_80gb=true|false

xla_gib is the epoch's per-device peak (the largest program's argument + output + temp - alias,
plus the buffers the loop keeps alive beside it); fits = xla_gib <= 90% of the device's memory
(the headroom `train.preflight` warns above). --layers N compiles an N-layer variant of the preset
(memory is then reported for N layers); --layers A,B extrapolates linearly from A and B
layers, which misleads: XLA's buffer assignment is not affine in the layer count (unrolled
8B programs keep per-layer float32 weight gradients only from a few layers on), and with
scanned layers the 1 -> 2 layer difference is no per-layer cost.
--cpu-scheduler (default memory): XLA's CPU backend by default schedules for concurrency and
issues independent work as early as it can -- every layer's fsdp weight all-gathers at the top
of the rollout's tick loop (v5e-64: ~2.2 GiB per layer); the TPU/GPU schedulers bound memory,
so the rows compile with the CPU's memory-minimising scheduler (`concurrency`: the CPU default).
The prompt length is the template's under the tokenizer in use (the in-repo byte-level tiny
tokenizer when no checkpoint is given: longer prompts than Llama-3's, so conservative).

--target=<target> (`jaxsocial.scale.targets`; `tpu` / `gpu`: every TARGET_ROWS row of that kind)
compiles the same programs with the target's own compiler instead of XLA's CPU backend: libtpu
for a TPU topology (`pip install -e '.[tpu-aot]'`), XLA's GPU compiler for 8 x H100 / 1 x H200
(`pip install 'jax-cuda12-plugin[with-cuda]'`); no accelerator is needed. One line per row
and program, last per row:

    target=tpu:v5e:8x8 mesh=2x32x1 preset=llama3_8b program=epoch tpu_gib=X hbm_gib=Y fits=true

tpu_gib (gpu_gib) is the program's per-device peak by that compiler (argument + output + temp -
alias, plus the buffers the loop keeps alive beside it); fits = tpu_gib <= the chip's HBM.
"""

import argparse
import ast
import importlib.util
import json
import os
import subprocess
import sys
import time

from common import NO_RECORD_HELP, finish  # benchmarks/: the result file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1024 ** 3

# name -> (preset, mesh (data, fsdp, tensor), config overrides, device GiB, hardware)
ROWS = {
    "h200_1b": ("llama3_2_1b", (1, 1, 1), {}, 139.8, "1 x H200 141 GB"),
    "lora": ("llama3_8b", (8, 1, 1), {"rl.lora_rank": 16}, 79.6, "8 x H100 80 GB, LoRA r=16"),
    "v5e64": ("llama3_8b", (4, 16, 1), {"rl.num_minibatches": 4}, 15.75, "TPU v5e-64 (16 GB)"),
    # The documented launch meshes for where the rows above do not fit (docs/scaling.md).
    "v5e64_2x32": ("llama3_8b", (2, 32, 1), {"rl.num_minibatches": 4}, 15.75,
                   "TPU v5e-64 (16 GB), fsdp 32"),
    "lora_fsdp": ("llama3_8b", (1, 8, 1), {"rl.lora_rank": 16, "rl.num_minibatches": 8}, 79.6,
                  "8 x H100 80 GB, LoRA r=16, fsdp 8"),
    "h100": ("llama3_8b", (1, 8, 1), {"rl.num_minibatches": 8}, 79.6, "8 x H100 80 GB"),
}


# target -> [(preset, mesh, config overrides)]: general.py's launch meshes (docs/scaling.md).
TARGET_ROWS = {
    "tpu:v5e:8x8": [("llama3_8b", (2, 32, 1), {"rl.num_minibatches": 4}),
                    ("llama3_8b", (4, 16, 1), {"rl.num_minibatches": 4})],
    "tpu:v5e:4x4": [("llama3_8b", (1, 16, 1), {"rl.num_minibatches": 4})],
    "tpu:v4:2x2x4": [("llama3_8b", (1, 32, 1), {"rl.num_minibatches": 4})],
    "tpu:v5p:2x2x2": [("llama3_8b", (1, 8, 1), {"rl.num_minibatches": 8})],
    "tpu:v6e:4x4": [("llama3_8b", (1, 16, 1), {"rl.num_minibatches": 4})],
    "gpu:h100:8": [("llama3_8b", (1, 8, 1), {"rl.num_minibatches": 8})],
    "gpu:h200:1": [("llama3_2_1b", (1, 1, 1), {})],
}


def target_child(spec):
    """Runs inside the subprocess: the row compiled by the target's own compiler."""
    from jaxsocial.scale import aot, targets

    overrides = dict(spec["overrides"], **{"model.preset": spec["preset"],
                                           "mesh.shape": tuple(spec["mesh"])})
    c = load_config(os.path.join(ROOT, spec["config"]), overrides)
    target = targets.resolve(spec["target"])
    mesh = targets.mesh(target, tuple(spec["mesh"]))
    t0 = time.perf_counter()
    run = aot.abstract_run(c, mesh)
    setup_s = time.perf_counter() - t0
    progs = aot.compile_epoch(run, programs=tuple(spec["programs"]))
    kind = spec["target"].split(":")[0]
    m = "x".join(str(x) for x in spec["mesh"])
    for p in progs:
        print(f"target={spec['target']} mesh={m} preset={spec['preset']} program={p.name} "
              f"arg_gib={p.argument / GIB:.2f} out_gib={p.output / GIB:.2f} "
              f"temp_gib={p.temp / GIB:.2f} other_gib={p.other / GIB:.2f} "
              f"{kind}_gib={p.peak / GIB:.2f} hbm_gib={target.memory_bytes / GIB:.1f} "
              f"fits={str(p.peak <= target.memory_bytes).lower()} "
              f"compile_s={p.compile_s:.0f}", flush=True)
    print("RESULT " + json.dumps({
        "target": spec["target"], "compiler": target.compiler, "preset": spec["preset"],
        "mesh": list(spec["mesh"]), "overrides": spec["overrides"], "setup_s": setup_s,
        "programs": aot.summary(progs), "peak": aot.epoch_peak(progs),
        "hbm": target.memory_bytes, "fits": aot.epoch_peak(progs) <= target.memory_bytes}),
        flush=True)


def run_child(spec, env):
    """This script's --child for `spec` in a subprocess: its lines printed, -> (process, the
    RESULT dict or None)."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                           json.dumps(spec)], env=env, cwd=ROOT, capture_output=True, text=True)
    res = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[len("RESULT "):])
        else:
            print(line, flush=True)
    return proc, res


def run_targets(a):
    """--target: every row of the named target(s), each in a subprocess on the CPU platform."""
    names = [t for t in TARGET_ROWS if t == a.target or t.split(":")[0] == a.target]
    if not names:
        raise SystemExit(f"--target={a.target!r}: choose one of {list(TARGET_ROWS)}, tpu or gpu")
    results = []
    for target in names:
        for preset, mesh, over in TARGET_ROWS[target]:
            spec = {"target": target, "preset": preset, "mesh": mesh, "config": a.config,
                    "overrides": {**over, **parse_sets(a.set)},
                    "programs": a.programs.split(",")}
            print(f"# {target}: {preset}, mesh {mesh}, overrides {spec['overrides']}",
                  flush=True)
            t0 = time.perf_counter()
            proc, res = run_child(spec, dict(os.environ, JAX_PLATFORMS="cpu"))
            if res is None:
                tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-3:]
                print(f"target={target} mesh={mesh} FAILED (exit {proc.returncode}): "
                      + " | ".join(tail)[-1500:], flush=True)
                results.append({"target": target, "mesh": list(mesh), "preset": preset,
                                "failed": " | ".join(tail)[-1500:]})
                continue
            res["wall_s"] = time.perf_counter() - t0
            results.append(res)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    finish("aot_memory", {"targets": results}, record=not a.no_record)


def load_config(path, overrides):
    arg = None
    if ":" in os.path.basename(path):
        path, arg = path.rsplit(":", 1)
    spec = importlib.util.spec_from_file_location("aot_config", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = mod.get_config(arg)
    for key, value in overrides.items():
        node = c
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    return c


def parse_sets(items):
    out = {}
    for item in items or ():
        key, _, value = item.partition("=")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def _extrapolate(a, b, la, lb, target):
    """Per-program figures at `target` layers from compiles at la < lb layers (every figure
    is affine in the layer count: per-layer weights, caches and saved activations)."""
    from jaxsocial.scale import aot
    out = []
    for pa, pb in zip(a, b):
        f = lambda x, y: int(round(x + (y - x) * (target - la) / (lb - la)))  # noqa: E731
        out.append(aot.ProgramMemory(
            name=pa.name, argument=f(pa.argument, pb.argument), output=f(pa.output, pb.output),
            temp=f(pa.temp, pb.temp), alias=f(pa.alias, pb.alias), other=f(pa.other, pb.other),
            compile_s=pa.compile_s + pb.compile_s))
    return out


def child(spec):
    """Runs inside the subprocess (jax sees the fake devices)."""
    from jaxsocial.models import llama
    from jaxsocial.scale import aot
    from jaxsocial.train import sharding

    overrides = dict(spec["overrides"])
    overrides["model.preset"] = spec["preset"]
    overrides["mesh.shape"] = tuple(spec["mesh"])
    c = load_config(os.path.join(ROOT, spec["config"]), overrides)
    mesh = sharding.make_mesh(tuple(spec["mesh"]))
    full = llama.PRESETS[spec["preset"]]["num_hidden_layers"]
    layers = [int(x) for x in spec.get("layers") or [full]]
    setup, compiled, run = 0.0, [], None
    for n in layers:
        t0 = time.perf_counter()
        run = aot.abstract_run(c, mesh, {"num_hidden_layers": n})
        setup += time.perf_counter() - t0
        progs = aot.compile_epoch(run, programs=tuple(spec["programs"]))
        print(aot.format_report(progs, prefix=f"row={spec['name']} layers={n} "), flush=True)
        compiled.append(progs)
    if len(layers) == 2 and layers[1] != full:
        progs = _extrapolate(*compiled, layers[0], layers[1], full)
        print(aot.format_report(progs, prefix=f"row={spec['name']} layers={full} "
                                              f"(extrapolated from {layers}) "), flush=True)
    else:
        progs = compiled[-1]
    res = {
        "name": spec["name"], "setup_s": setup, "programs": aot.summary(progs),
        "compiled_layers": layers, "xla_peak": aot.epoch_peak(progs),
        "prompt_len": run.setup.template.max_len,
        "response_len": run.setup.sampling.max_new_tokens,
        "trajectories": int(c.rollout.ticks_per_epoch) * run.setup.active,
        "params": run.setup.model_config.num_params(),
    }
    print("RESULT " + json.dumps(res), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated of {list(ROWS)}")
    ap.add_argument("--config", default="configs/general.py")
    ap.add_argument("--set", action="append", help="config override key=value (all rows)")
    ap.add_argument("--layers", default="", help="'' (default): the preset's depth; 'N': "
                    "compile an N-layer variant; 'A,B': compile A and B layers and extrapolate "
                    "to the preset's depth (not reliable: XLA's buffer assignment is not affine "
                    "in the layer count, docs/scaling.md)")
    ap.add_argument("--programs", default="rollout,score,update",
                    help="rollout,score,update (three programs) or epoch (the one-program epoch)")
    ap.add_argument("--cpu-scheduler", default="memory", choices=("memory", "concurrency"),
                    help="XLA CPU's instruction scheduler: 'memory' (default here: the "
                    "memory-minimising list scheduler) or 'concurrency' (the CPU backend's own "
                    "default, which issues independent work such as every layer's weight "
                    "all-gathers as early as it can: a CPU-only choice, not the target's)")
    ap.add_argument("--target", default="", help="compile with this target's own compiler "
                    f"(one of {list(TARGET_ROWS)}, or tpu / gpu: all rows of that kind) "
                    "instead of XLA's CPU backend over fake devices")
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--no_record", action="store_true", help=NO_RECORD_HELP)
    a = ap.parse_args()
    if a.child:
        spec = json.loads(a.child)
        (target_child if "target" in spec else child)(spec)
        return
    if a.target:
        if a.programs == "rollout,score,update" and "--programs" not in " ".join(sys.argv):
            a.programs = "epoch"  # the trainer's program unless told otherwise
        run_targets(a)
        return
    results, last = [], None
    for name in a.rows.split(","):
        preset, mesh, over, dev_gib, hw = ROWS[name]
        spec = {"name": name, "preset": preset, "mesh": mesh, "config": a.config,
                "overrides": {**over, **parse_sets(a.set)},
                "layers": [int(x) for x in a.layers.split(",") if x],
                "programs": a.programs.split(",")}
        n = mesh[0] * mesh[1] * mesh[2]
        sched = str(a.cpu_scheduler == "concurrency").lower()
        env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                                          f" --xla_force_host_platform_device_count={n}"
                                          " --xla_cpu_enable_concurrency_optimized_scheduler="
                                          + sched),
                   JAX_PLATFORMS="cpu")
        print(f"# {name}: {hw}, {preset}, mesh {mesh}, overrides {spec['overrides']}"
              + (f", {a.layers} layers" if a.layers else "")
              + f", cpu scheduler {a.cpu_scheduler}", flush=True)
        t0 = time.perf_counter()
        proc, res = run_child(spec, env)
        wall = time.perf_counter() - t0
        if res is None:
            print(f"row={name} FAILED (exit {proc.returncode}):\n{proc.stderr[-3000:]}",
                  flush=True)
            continue
        res.update(hardware=hw, mesh=list(mesh), device_gib=dev_gib, wall_s=wall,
                   cpu_scheduler=a.cpu_scheduler,
                   preset=preset, overrides=spec["overrides"], layers=a.layers)
        fits = res["xla_peak"] <= 0.9 * dev_gib * GIB
        res["fits"] = fits
        results.append(res)
        print(f"row={name} xla_peak_gib={res['xla_peak'] / GIB:.2f} "
              f"device_gib={dev_gib} fits={str(fits).lower()} wall_s={wall:.0f}", flush=True)
        last = res
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    figures = {"rows": results}
    if last is not None:
        m = "x".join(str(s) for s in last["mesh"])
        fits_80 = last["xla_peak"] <= 0.9 * 79.6 * GIB
        print(f"preset={last['preset']} mesh={m} xla_gib={last['xla_peak'] / GIB:.2f} "
              f"fits_80gb={str(fits_80).lower()}")
        figures.update(preset=last["preset"], mesh=m, xla_gib=last["xla_peak"] / GIB,
                       fits_80gb=fits_80)
    # Only after every child: this process imports jax for the machine's figures here.
    finish("aot_memory", figures, record=not a.no_record)


if __name__ == "__main__":
    main()
