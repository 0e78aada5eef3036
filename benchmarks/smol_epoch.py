"""Wall time of configs/smol.py (SmolLM2-135M-Instruct agents) on this machine: set-up, each
epoch's rollout and update seconds, and the whole run. Targets (2-core CPU): one epoch <= 3 min,
the default run <= 20 min.

    python benchmarks/smol_epoch.py                       # the default run (all epochs)
    python benchmarks/smol_epoch.py --epochs 2            # set-up + 2 epochs
    python benchmarks/smol_epoch.py --set rl.lora_rank=8  # any config override, repeatable

Set-up = model load (GGUF dequantization) + tokenizer + the society's text embedded by the
encoder. Epoch 1 includes compiling the rollout, scoring and update programs; "update" is
scoring + PPO update (the epoch's wall time minus its rollout). The runner's checkpoint writes
are not included. The machine's 1-minute load average is printed at start and end (timings on
a shared machine are indicative only; process CPU seconds are printed beside them: on an idle
2-core machine wall time lies between half of and all of the CPU time). Summary line: one JSON
object, then `result: <file>` (benchmarks/results/) and the machine line, last.
"""
import importlib.util
import json
import os
import resource
import time

from absl import app, flags
from common import NO_RECORD_HELP, finish  # benchmarks/: the result file

FLAGS = flags.FLAGS
flags.DEFINE_integer("epochs", 0, "epochs to run (0 = the config's train.epochs)")
flags.DEFINE_string("variant", "", "config variant (e.g. smoke)")
flags.DEFINE_multi_string("set", [], "config override key=value (python literal values)")
flags.DEFINE_bool("no_record", False, NO_RECORD_HELP)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config():
    import ast
    spec = importlib.util.spec_from_file_location("smol", os.path.join(ROOT, "configs",
                                                                       "smol.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = mod.get_config(FLAGS.variant or None)
    for item in FLAGS.set:
        key, value = item.split("=", 1)
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            pass
        node = c
        *path, last = key.split(".")
        for p in path:
            node = node[p]
        node[last] = value
    return c


def _cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(_):
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    from jaxsocial.train import run as run_lib
    c = _config()
    run = run_lib.build_run(c)
    state = run.init_state()
    setup, setup_cpu = time.perf_counter() - t0, _cpu()
    print(f"set-up {setup:.1f} s (load average {load0:.1f}); "
          f"prompt slots {run.setup.template.max_len}, "
          f"new tokens {run.setup.sampling.max_new_tokens}, "
          f"agents {run.setup.num_agents}, ticks {int(c.rollout.ticks_per_epoch)}, "
          f"lora_rank {int(c.rl.lora_rank)}, ppo_epochs {int(c.rl.ppo_epochs)}", flush=True)
    epochs = FLAGS.epochs or int(c.train.epochs)
    rows = []
    for e in range(epochs):
        c0 = _cpu()
        state, m, _ = run.run_epoch(state)
        cpu = _cpu() - c0
        row = dict(epoch=e + 1, rollout_s=round(m["rollout_s"], 1),
                   update_s=round(m["wall_s"] - m["rollout_s"], 1), wall_s=round(m["wall_s"], 1),
                   cpu_s=round(cpu, 1), posts=m["total_posts"],
                   avg_likes=round(m["avg_likes_per_post"], 3))
        rows.append(row)
        print(f"epoch {row['epoch']}: rollout {row['rollout_s']} s, update {row['update_s']} s, "
              f"epoch {row['wall_s']} s (cpu {row['cpu_s']} s), posts {row['posts']}, "
              f"avg likes/post {row['avg_likes']}", flush=True)
    total = time.perf_counter() - t0
    steady = [r["wall_s"] for r in rows[1:]] or [rows[0]["wall_s"]]
    steady_cpu = [r["cpu_s"] for r in rows[1:]] or [rows[0]["cpu_s"]]
    out = dict(setup_s=round(setup, 1), setup_cpu_s=round(setup_cpu, 1),
               first_epoch_s=rows[0]["wall_s"], first_epoch_cpu_s=rows[0]["cpu_s"],
               epoch_cpu_s=round(sum(steady_cpu) / len(steady_cpu), 1),
               epoch_s=round(sum(steady) / len(steady), 1), max_epoch_s=max(r["wall_s"]
                                                                          for r in rows),
               epochs=epochs, total_s=round(total, 1), total_cpu_s=round(_cpu(), 1),
               load_start=round(load0, 1),
               load_end=round(os.getloadavg()[0], 1), overrides=FLAGS.set)
    print(json.dumps(out))
    out["epochs_detail"] = rows
    finish("smol_epoch", out, record=not FLAGS.no_record)


if __name__ == "__main__":
    app.run(main)
