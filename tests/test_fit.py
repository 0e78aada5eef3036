"""The compiler as the memory model (`train.fit`): the epoch compiled before the first epoch,
XLA's figures for it plus the process's resident set against the machine; a run that cannot
fit is refused in one line before its workdir is written, an automatic micro-batch is halved
until it fits, and the compiled executable is the one that runs."""
import dataclasses
import os

import jax
import pytest
from conftest import load_config_file

from jaxsocial.train import fit, machine, runner, sharding
from jaxsocial.train import run as run_lib

GiB = 2 ** 30


def smoke(**rl):
    c = load_config_file("configs/demo.py", "smoke")
    c.train.epochs = 1
    c.train.export_hf = False
    for k, v in rl.items():
        c.rl[k] = v
    return c


def one_device_run(c):
    return run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))


@pytest.fixture(scope="module")
def built():
    """demo.py:smoke with the whole epoch's 32 rows in one micro-batch (rl.micro_tokens=0),
    compiled once."""
    run = one_device_run(smoke(micro_tokens=0))
    state = run.init_state()
    return run, state, run.compile_epoch(state)


def test_the_prediction_is_xla_figures_plus_the_resident_set(built):
    run, state, compiled = built
    ma = compiled.memory_analysis()
    pred = fit.predict(compiled, devices=1, machine=(64 * GiB, "RAM", False))
    assert pred.temp == ma.temp_size_in_bytes > 0
    assert pred.program == ma.temp_size_in_bytes + max(
        0, ma.output_size_in_bytes - ma.alias_size_in_bytes)
    assert 0.1 * GiB < pred.resident < 16 * GiB  # this process, JAX and the run loaded
    assert pred.peak == pred.resident + pred.program and pred.fits
    # Per device on an accelerator: no resident set, the arguments count.
    dev = fit.predict(compiled, devices=1, machine=(80 * GiB, "device memory", True))
    assert dev.resident == 0 and dev.program == (ma.argument_size_in_bytes
                                                 + ma.output_size_in_bytes
                                                 - ma.alias_size_in_bytes
                                                 + ma.temp_size_in_bytes)


def test_a_run_that_cannot_fit_is_refused_before_its_workdir_is_written(built, tmp_path,
                                                                        monkeypatch):
    run, state, compiled = built
    pred = fit.predict(compiled, devices=1, machine=(64 * GiB, "RAM", False))
    # A machine a little smaller than the prediction; the user's own micro-batch (32 rows).
    c = smoke(micro_batch=32)
    tight = pred.resident + pred.program // 2
    monkeypatch.setattr(machine, "machine_memory", lambda: (tight, "RAM", False))
    fixed = one_device_run(c)
    w = tmp_path / "w"
    with pytest.raises(ValueError) as e:
        runner.train(c, str(w), run=fixed)
    msg = str(e.value)
    assert "\n" not in msg and "the epoch would need" in msg and "rl.micro_batch" in msg, msg
    assert "GiB of RAM" in msg
    assert not os.path.exists(w / "config.json") and not os.path.exists(w / "metrics.jsonl")
    # Control: the same run on a machine with room trains its epoch.
    monkeypatch.setattr(machine, "machine_memory", lambda: (64 * GiB, "RAM", False))
    summary = runner.train(c, str(w), run=fixed)
    assert summary["epochs"] == 1


def test_an_automatic_micro_batch_is_halved_until_it_fits(built, monkeypatch):
    run, state, _ = built
    c = smoke()  # automatic: demo.py:smoke's 32 rows of ~520 tokens -> 4-row micro-batches
    auto = one_device_run(c)
    start = auto.setup.rl_config.micro_batch
    assert 1 < start < 32
    real = fit.predict
    seen = []

    def only_small_fits(compiled, devices, machine=None):
        p = real(compiled, devices, (64 * GiB, "RAM", False))
        seen.append(p.temp)  # the first program does not fit, the second does
        return dataclasses.replace(p, limit=p.peak if len(seen) >= 2 else p.peak - 1)
    monkeypatch.setattr(fit, "predict", only_small_fits)
    fitted, compiled, pred = fit.fit_run(auto, auto.init_state())
    assert pred.fits and fitted.setup.rl_config.micro_batch == start // 2
    assert seen[1] < seen[0]  # the smaller micro-batch's program needs fewer temporaries
    assert fitted.compiled["epoch"] is compiled
    # The fitted run trains with the executable it was checked with.
    new, metrics, _ = fitted.run_epoch(fitted.init_state())
    assert metrics["ppo"]["grad_norm"] > 0 and fitted.traces.count == 1
