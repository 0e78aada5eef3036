r"""Rollout / update throughput of a Social-RL config: tokens/s, ticks/s, trajectories/s,
PPO tokens/s, compile times, peak memory; optionally a jax.profiler trace.

    python launch/throughput.py --config=configs/demo.py
    python launch/throughput.py --config=configs/demo.py --config.mesh.shape='(8,1,1)'
    python launch/throughput.py --config=configs/general.py:smoke --trace_dir=/tmp/trace
    python launch/throughput.py --config=configs/general.py --config.model.preset=llama3_2_1b \
        --config.model.require_checkpoint=False --peak_tflops=989   # e.g. one H200, bf16 dense

Prints a table and writes --out (JSON). MFU = achieved model FLOP/s over --peak_tflops, with
2 * params FLOPs per generated token and 6 * params per trained token (+ the reference and
value passes of the update: 2 * params each per token).
"""



import functools
import json
import os
import resource
import time

from absl import app, flags
from ml_collections import config_flags

from jaxsocial import cli

_CONFIG = config_flags.DEFINE_config_file("config", "configs/demo.py", "Config file.",
                                          lock_config=True)
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed epochs after the compiling one.")
_OUT = flags.DEFINE_string("out", None, "Where to write the JSON results (default: "
                           "runs/<config.name>/throughput.json).")
_TRACE = flags.DEFINE_string("trace_dir", "", "Write a jax.profiler trace of one epoch here.")
_PEAK = flags.DEFINE_float("peak_tflops", 0.0, "Peak FLOP/s of one device for MFU (0 = skip).")


def _peak_memory_gb():
    import jax
    stats = getattr(jax.local_devices()[0], "memory_stats", lambda: None)()
    if stats and "peak_bytes_in_use" in stats:
        return stats["peak_bytes_in_use"] / 2**30, "device"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "host_rss"


def _bound(fn, compiled):
    """Call an AOT-compiled program the way the loop calls `fn`: the loop's wrappers pass frozen
    inputs (the rollout grammar, the society encoder's weights) as extra arguments: keywords for
    rollout / score (`fn.frozen`), positional for the update (`fn.grammar`)."""
    if hasattr(fn, "jitted") and hasattr(fn, "frozen"):
        return lambda *a: compiled(*a, **fn.frozen)
    if hasattr(fn, "_jitted") and hasattr(fn, "grammar"):
        return lambda *a: compiled(*a, fn.grammar)
    return compiled


def profile(config, repeats=2, trace_dir="", peak_tflops=0.0):
    """Measure one config. Returns a dict of figures (see module docstring)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxsocial.train import run as run_lib
    from jaxsocial.train import sharding

    t0 = time.perf_counter()
    run = run_lib.build_run(config)
    state = run.init_state()
    setup_s = time.perf_counter() - t0
    key = jax.random.key(0)
    args = (state.train.params, state.train.ref_params, state.society, key)
    t0 = time.perf_counter()
    compiled = [run.rollout.lower(*args).compile()]
    rollout = _bound(run.rollout, compiled[-1])
    compile_rollout = time.perf_counter() - t0
    soc, ro = rollout(*args)
    jax.block_until_ready(ro.tokens)
    bonus = jnp.zeros(ro.created_id.shape, jnp.float32)
    t0 = time.perf_counter()
    compiled.append(run.score.lower(state.train, ro, bonus).compile())
    score = _bound(run.score, compiled[-1])
    batch = score(state.train, ro, bonus)[0]
    # As run_epoch: trajectories along the data axes.
    batch = sharding.put_global(batch, sharding.tree_data_shardings(batch, run.mesh))
    compiled.append(run.setup.update.lower(state.train, batch).compile())
    update = _bound(run.setup.update, compiled[-1])
    compile_update = time.perf_counter() - t0
    roll_t, upd_t, tokens, trained = [], [], [], []
    for i in range(repeats):
        key = jax.random.fold_in(key, i)
        t0 = time.perf_counter()
        soc, ro = rollout(state.train.params, state.train.ref_params, soc, key)
        jax.block_until_ready(ro.tokens)
        roll_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        batch = score(state.train, ro, bonus)[0]
        batch = sharding.put_global(batch, sharding.tree_data_shardings(batch, run.mesh))
        new_train, _ = update(state.train, batch)
        jax.block_until_ready(new_train.step)
        upd_t.append(time.perf_counter() - t0)
        tokens.append(float(sharding.to_host(ro.mask).sum()))
        seq = batch.prompt_tokens.shape[1] + batch.response_tokens.shape[1]
        trained.append(batch.batch_size * seq)
    if trace_dir:
        with jax.profiler.trace(trace_dir):
            soc, ro = rollout(state.train.params, state.train.ref_params, soc, key)
            jax.block_until_ready(ro.tokens)
    ticks = int(config.rollout.ticks_per_epoch)
    traj = ticks * run.setup.num_agents
    roll, upd = float(np.median(roll_t)), float(np.median(upd_t))
    n_params = run.setup.model_config.num_params()
    out = {
        "config": config.name, "devices": jax.device_count(), "mesh": list(run.mesh.shape.values()),
        "backend": jax.default_backend(), "params": n_params,
        "setup_s": setup_s, "compile_rollout_s": compile_rollout,
        "compile_update_s": compile_update,
        "rollout_s": roll, "update_s": upd,
        "tokens_per_s": float(np.median(tokens)) / roll,
        "ticks_per_s": ticks / roll,
        "trajectories_per_s": traj / (roll + upd),
        "ppo_tokens_per_s": float(np.median(trained)) * int(config.rl.ppo_epochs) / upd,
    }
    mem, kind = _peak_memory_gb()
    out["peak_memory_gb"], out["peak_memory_kind"] = mem, kind
    # The compiler's own count beside the measured peak: the largest program's argument +
    # output + temp - alias bytes per device (`compiled.memory_analysis()`).
    out["compiled_memory_gb"] = max(_program_bytes(c) for c in compiled) / 1e9
    if peak_tflops:
        peak = peak_tflops * 1e12 * jax.device_count()
        out["rollout_mfu"] = 2 * n_params * out["tokens_per_s"] / peak
        out["update_mfu"] = (6 + 4) * n_params * out["ppo_tokens_per_s"] / peak
    return out


def _program_bytes(compiled) -> int:
    ma = compiled.memory_analysis()
    if ma is None:
        return 0
    return int(ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes
               - ma.alias_size_in_bytes)


def format_table(res):
    rows = [(k, f"{v:.4g}" if isinstance(v, float) else str(v)) for k, v in res.items()]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def main(argv):
    del argv
    res = profile(_CONFIG.value, _REPEATS.value, _TRACE.value, _PEAK.value)
    print(format_table(res))
    out = _OUT.value or os.path.join("runs", _CONFIG.value.name, "throughput.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=2)
    print(f"results: {os.path.abspath(out)}")
    print(json.dumps({k: res[k] for k in ("tokens_per_s", "ticks_per_s", "ppo_tokens_per_s")}))


if __name__ == "__main__":
    # It measures compile times: no persistent cache, every program compiled here.
    app.run(main, flags_parser=functools.partial(cli.parse_flags, compile_cache=False))
