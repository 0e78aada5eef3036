"""The pod proof from the real compiler (`jaxsocial.scale`): a general.py-shaped epoch compiled
by libtpu for a TPU topology on this CPU, and `train.preflight`, which refuses a run whose
epoch does not fit its target."""
import os
import subprocess
import sys

import pytest
from conftest import ONE_DEVICE_ENV, ROOT, load_config_file

from jaxsocial.scale import preflight, targets
from jaxsocial.train import checks

pytest.importorskip("libtpu", reason="libtpu is in the [test] extra ([tpu-aot])")


def small_general(micro_batch: int = 8):
    """configs/general.py's smoke shapes, 4 ticks, on every device of the target."""
    c = load_config_file("configs/general.py", "smoke")
    c.mesh.shape = (-1, 1, 1)
    c.rl.micro_batch = micro_batch
    c.rollout.ticks_per_epoch = 4
    return c


def test_libtpu_is_in_the_test_extra():
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        text = f.read()
    assert '"tpu-aot": TPU_AOT' in text and "+ TPU_AOT" in text


def test_the_epoch_compiles_for_a_tpu_topology():
    two_layers = {"num_hidden_layers": 2}
    full = preflight.preflight(small_general(8), "tpu:v5e:2x2", two_layers)
    assert full.target.compiler == "libtpu" and len(full.target.devices) == 4
    assert full.mesh_shape == (4, 1, 1)
    (epoch,) = full.programs  # one donated program
    assert epoch.name == "epoch" and epoch.argument > 0 and epoch.temp > 0 and full.fits
    assert full.target.memory_bytes == 16 * targets.GiB  # v5e's HBM
    line = full.lines()[0]
    assert line.startswith("target=tpu:v5e:2x2 mesh=4x1x1 preset=tiny program=epoch ")
    assert "hbm_gib=16.0 fits=true" in line
    # (That a smaller micro-batch shrinks the compiler's temporaries, and that an automatic one
    # is halved until the run fits, is tested on the CPU's compile: tests/test_fit.py.)


def test_a_mesh_that_does_not_cover_the_target_is_refused():
    t = targets.resolve("tpu:v5e:2x2")
    assert tuple(targets.mesh(t, (2, 2, 1)).shape.values()) == (2, 2, 1)  # control
    with pytest.raises(ValueError, match=r"mesh.shape=\(3, 1, 1\) does not cover the 4 devices"):
        targets.mesh(t, (3, 1, 1))
    with pytest.raises(ValueError, match="unknown TPU chip 'v9'"):
        targets.resolve("tpu:v9:2x2")
    with pytest.raises(ValueError, match="name one as"):
        targets.resolve("h100")


def test_checks_name_a_malformed_preflight_target():
    c = small_general()
    c.train.preflight = "h100x8"
    with pytest.raises(ValueError, match="train.preflight='h100x8'"):
        checks.check(c)
    c.train.preflight = "gpu:h100:8"  # control: well formed (resolved only by the pre-flight)
    checks.check(c)


def test_preflight_refuses_a_run_that_does_not_fit(monkeypatch):
    """`train.preflight=auto`: this process's CPU devices; with a 1 MiB "device" the epoch does
    not fit and the refusal is one line naming the target and the sizes."""
    from jaxsocial.train import machine

    c = load_config_file("configs/demo.py", "smoke")
    c.mesh.shape = (1, 1, 1)
    c.train.preflight = "auto"
    monkeypatch.setattr(machine, "device_memory_bytes", lambda: 1 << 20)
    monkeypatch.setattr(targets.jax, "devices", lambda: targets.jax.local_devices()[:1])
    with pytest.raises(ValueError) as e:
        preflight.check(c)
    msg = str(e.value)
    assert "\n" not in msg and "train.preflight='auto'" in msg, msg
    assert "more than the device's 0.0 GiB" in msg and "mesh.shape=(1, 1, 1)" in msg, msg
    # control: with room, the same compile passes and reports the program
    monkeypatch.setattr(machine, "device_memory_bytes", lambda: 1 << 40)
    report = preflight.check(c)
    assert report.fits and report.programs[0].name == "epoch" and report.peak > 0


def test_the_launcher_runs_the_preflight_first(tmp_path):
    """launch/train.py with `--config.train.preflight`: a malformed target is one line before
    any workdir exists; `auto` prints the compiler's line and the run goes on."""
    base = [sys.executable, os.path.join(ROOT, "launch", "train.py"),
            "--config=" + os.path.join(ROOT, "configs", "demo.py") + ":smoke",
            "--config.train.epochs=1", "--noprogress", "--config.mesh.shape=(1,1,1)"]
    env = ONE_DEVICE_ENV
    out = subprocess.run(base + ["--config.train.preflight=tpu:v9:1x1",
                                 f"--workdir={tmp_path / 'bad'}"],
                         env=env, capture_output=True, text=True, timeout=600)
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert out.returncode == 1 and len(errors) == 1, out.stderr[-2000:]
    assert "unknown TPU chip 'v9'" in errors[0] and not (tmp_path / "bad").exists()
    out = subprocess.run(base + ["--config.train.preflight=auto",
                                 f"--workdir={tmp_path / 'ok'}"],
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "target=auto mesh=1x1x1 preset=tiny program=epoch" in out.stdout, out.stdout[-2000:]
    assert (tmp_path / "ok" / "metrics.jsonl").exists()
