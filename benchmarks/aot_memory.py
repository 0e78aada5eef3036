r"""Per-device memory of configs/general.py's epoch on its target meshes, by XLA's own count.

    python benchmarks/aot_memory.py --programs=epoch      # all rows, the one-program epoch
    python benchmarks/aot_memory.py --rows=h200_1b,h100   # the three programs
    python benchmarks/aot_memory.py --rows=h100 --set rl.micro_batch=4 --layers=8
    python benchmarks/aot_memory.py --programs=epoch --set model.scan_layers=False  # unrolled

configs/general.py scans its decoder layers (`model.scan_layers=True`: one `lax.scan` over
weights stacked inside the program); `--set model.scan_layers=False` compiles the unrolled
layers, and the printed estimate follows the switch (`SocialRL.memory_estimate`).

Each row compiles the preset at its full depth (1-2 min per row and program set on a 2-core
CPU: the layers' shapes repeat, so XLA's compile time grows slowly with depth).

Each row runs in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=N (the
target's device count) set before jax is imported, builds the run with an abstract model
(`jaxsocial.train.aot`: ShapeDtypeStruct weights with the loop's shardings, nothing
allocated), lowers and compiles the rollout, scoring and update programs for the (data, fsdp,
tensor) mesh, and prints XLA's `compiled.memory_analysis()` per device beside
`jaxsocial.train.memory.estimate`. The summary line is the last row's (the 8 x H100 row by
default), followed by `result: <file>` (benchmarks/results/) and the machine line, last:

    preset=llama3_8b mesh=1x8x1 xla_gib=X estimate_gib=Y fits_80gb=true|false

xla_gib is the epoch's per-device peak (the largest program's argument + output + temp - alias,
plus the buffers the loop keeps alive beside it); fits = xla_gib <= 90% of the device's memory
(the headroom `memory.check_fits` uses). --layers N compiles an N-layer variant of the preset
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
    from jaxsocial.train import aot
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
    from jaxsocial.train import aot, sharding

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
    run.model_config = run.model_config.replace(num_hidden_layers=full)
    est = run.memory_estimate()
    print(f"row={spec['name']} estimate (GiB): "
          + " ".join(f"{k}={v / GIB:.3f}" for k, v in est.programs.items()), flush=True)
    for p in progs:  # each compiled program beside its estimate
        e = est.programs.get(p.name, est.peak)
        print(f"row={spec['name']} program={p.name} xla_gib={p.peak / GIB:.2f} "
              f"estimate_gib={e / GIB:.2f} ratio={e / max(p.peak, 1):.2f} "
              f"(xla temp {p.temp / GIB:.2f}, estimate working set "
              f"{est.working[p.name] / GIB:.2f})", flush=True)
    res = {
        "name": spec["name"], "setup_s": setup, "programs": aot.summary(progs),
        "compiled_layers": layers, "xla_peak": aot.epoch_peak(progs),
        "estimate": max(est.programs.get(p.name, est.peak) for p in progs),
        "estimate_programs": dict(est.programs), "estimate_table": est.table(),
        "prompt_len": run.template.max_len, "response_len": run.sampling.max_new_tokens,
        "trajectories": int(c.rollout.ticks_per_epoch) * run.active,
        "params": run.model_config.num_params(),
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
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--no_record", action="store_true", help=NO_RECORD_HELP)
    a = ap.parse_args()
    if a.child:
        child(json.loads(a.child))
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
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                               json.dumps(spec)], env=env, cwd=ROOT, capture_output=True,
                              text=True)
        wall = time.perf_counter() - t0
        res = None
        for line in proc.stdout.splitlines():
            if line.startswith("RESULT "):
                res = json.loads(line[len("RESULT "):])
            else:
                print(line, flush=True)
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
              f"estimate_gib={res['estimate'] / GIB:.2f} "
              f"ratio={res['estimate'] / max(res['xla_peak'], 1):.2f} "
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
              f"estimate_gib={last['estimate'] / GIB:.2f} "
              f"fits_80gb={str(fits_80).lower()}")
        figures.update(preset=last["preset"], mesh=m, xla_gib=last["xla_peak"] / GIB,
                       estimate_gib=last["estimate"] / GIB, fits_80gb=fits_80)
    # Only after every child: this process imports jax for the machine's figures here.
    finish("aot_memory", figures, record=not a.no_record)


if __name__ == "__main__":
    main()
