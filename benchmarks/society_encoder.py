"""What `society.encoder="minilm"` costs the rollout: the compiled rollout of configs/demo.py
with the reference encoder and with MiniLM, measured in one process, and the MiniLM path's
parts alone (the host re-tokenization callback, the encoder forward on one tick's rows).

    python benchmarks/society_encoder.py                 # configs/demo.py, best of 3
    python benchmarks/society_encoder.py --ticks 4       # a shorter rollout

Each rollout is compiled first, then timed best of `--repeats` (same state, key and shapes).
Both sides run on the same cores in the same process. Last lines: `result:` and the machine.
"""
import argparse
import importlib.util
import os
import time

import jax
import numpy as np
from common import NO_RECORD_HELP, finish
from flax import nnx

from jaxsocial.train import run as run_lib
from jaxsocial.train import sharding, society_encoder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(encoder, ticks):
    spec = importlib.util.spec_from_file_location("demo", os.path.join(ROOT, "configs",
                                                                       "demo.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = mod.get_config()
    c.society.encoder = encoder
    c.society.embed_dim = society_encoder.DIMS.get(encoder, 16)
    if ticks:
        c.rollout.ticks_per_epoch = ticks
    return c


def _best(fn, repeats):
    out, times = None, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return min(times), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=0, help="agent ticks (0 = the config's)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no_record", action="store_true", help=NO_RECORD_HELP)
    args = ap.parse_args()
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    figures = {}
    for encoder in ("reference", "minilm"):
        run = run_lib.build_run(_config(encoder, args.ticks), mesh=mesh)
        state = run.init_state()
        key = jax.random.key(1)
        roll = lambda: run.rollout(state.train.params, state.train.ref_params,  # noqa: E731
                                    state.society, key)[1].embedding
        t0 = time.perf_counter()
        jax.block_until_ready(roll())
        figures[f"{encoder}_first_s"] = time.perf_counter() - t0
        figures[f"{encoder}_rollout_s"], _ = _best(roll, args.repeats)
        print(f"{encoder:>9}: rollout {figures[f'{encoder}_rollout_s']:.3f} s "
              f"(first call, compiling: {figures[f'{encoder}_first_s']:.1f} s)")
        if encoder == "minilm":
            rows = np.asarray(run.text.crowd_text.posts.tokens[:run.setup.active])
            enc = run.setup.encoder
            figures["callback_s"], (ids, mask) = _best(lambda: enc.retokenizer(rows),
                                                       args.repeats * 10)
            fwd = jax.jit(lambda p, i, m: nnx.merge(enc.graphdef, p).hidden_states(i, m))
            jax.block_until_ready(fwd(run.encoder, ids, mask))
            figures["encoder_forward_s"], _ = _best(
                lambda: fwd(run.encoder, ids, mask), args.repeats * 10)
            ticks = int(run.config.rollout.ticks_per_epoch)
            figures["ticks"] = ticks
            print(f"  per agent tick ({run.setup.active} rows): re-tokenize callback "
                  f"{1e3 * figures['callback_s']:.2f} ms, encoder forward "
                  f"{1e3 * figures['encoder_forward_s']:.2f} ms ({ticks} ticks a rollout)")
    figures["ratio"] = figures["minilm_rollout_s"] / figures["reference_rollout_s"]
    print(f"minilm_rollout_s={figures['minilm_rollout_s']:.3f} "
          f"reference_rollout_s={figures['reference_rollout_s']:.3f} "
          f"ratio={figures['ratio']:.2f}")
    finish("society_encoder", figures, record=not args.no_record)


if __name__ == "__main__":
    main()
