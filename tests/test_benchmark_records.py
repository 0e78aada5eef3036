"""Benchmark records (benchmarks/common.py): the result file's fields, the machine line, and
the fair default of rl_step.py's PyTorch peer -- each with a negative control that the same
check catches."""
import json
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import common  # noqa: E402  benchmarks/common.py

LINE = re.compile(r'^machine: cpu="[^"]*" cores=(\d+) sgemm_gflops=(\d+) backend=\S+')


def record_problems(rec: dict) -> list:
    """What a result record lacks (empty: complete)."""
    out = [k for k in ("benchmark", "command", "commit", "dirty", "date", "machine", "figures")
           if k not in rec]
    if not str(rec.get("command", "")).startswith("python benchmarks/"):
        out.append("command")
    if not re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", str(rec.get("date", ""))):
        out.append("date")
    m = rec.get("machine") or {}
    if not isinstance(m.get("cpu"), str):
        out.append("machine.cpu")
    if not isinstance(m.get("cores"), int) or m["cores"] < 1:
        out.append("machine.cores")
    if not (m.get("sgemm_gflops") or 0) > 0:
        out.append("machine.sgemm_gflops")
    if not rec.get("figures"):
        out.append("figures")
    return out


def line_problems(line: str) -> list:
    """What a machine line lacks: cpu, cores >= 1, a positive sgemm figure."""
    got = LINE.match(line)
    if not got:
        return ["format"]
    return [k for k, ok in (("cores", int(got[1]) >= 1), ("sgemm", int(got[2]) > 0)) if not ok]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """One real record (the machine measured once for the module)."""
    d = tmp_path_factory.mktemp("results")
    figures = {"ours_tok_s": 812.5, "hf_tok_s": float("nan"), "ratio": 2.5, "rows": [{"n": 1}]}
    path = common.write_result("unit", figures, argv=["benchmarks/unit.py", "--rows", "a b"],
                               directory=str(d))
    with open(path) as f:
        return path, json.load(f)


def test_write_result_records_command_commit_date_machine_figures(written):
    path, rec = written
    assert os.path.basename(path).startswith("unit-") and path.endswith(".json")
    assert record_problems(rec) == []
    assert rec["benchmark"] == "unit"
    assert rec["command"] == "python benchmarks/unit.py --rows 'a b'"
    assert rec["figures"]["ours_tok_s"] == 812.5
    assert rec["figures"]["hf_tok_s"] is None  # nan is not JSON: null
    if rec["commit"] is not None:  # a checkout: the commit it measured
        assert re.fullmatch(r"[0-9a-f]{40}", rec["commit"]) and isinstance(rec["dirty"], bool)
    # Negative control: a record whose machine has no sgemm figure is caught.
    bad = dict(rec, machine={k: v for k, v in rec["machine"].items() if k != "sgemm_gflops"})
    assert record_problems(bad) == ["machine.sgemm_gflops"]


def test_write_result_without_git_records_null_commit(written, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on the PATH
    path = common.write_result("unit", {"x": 1}, argv=["benchmarks/unit.py"],
                               directory=str(tmp_path), machine_info=written[1]["machine"])
    rec = json.load(open(path))
    assert rec["commit"] is None and rec["dirty"] is None
    assert record_problems(rec) == []
    # Two runs in one second do not overwrite each other.
    again = common.write_result("unit", {"x": 2}, argv=["benchmarks/unit.py"],
                                directory=str(tmp_path), machine_info=written[1]["machine"])
    assert again != path and json.load(open(path))["figures"] == {"x": 1}


def test_machine_line_names_cpu_cores_and_sgemm(written):
    m = written[1]["machine"]
    line = common.machine_line(m)
    assert line_problems(line) == [], line
    assert f"cores={m['cores']}" in line and f'cpu="{m["cpu"]}"' in line
    assert m["cores"] == common.cores()
    # Negative control: a machine without a measured sgemm gives a line the check rejects.
    assert line_problems(common.machine_line({"cpu": "x", "cores": 2, "backend": "cpu"})) \
        == ["sgemm"]


def test_finish_prints_the_machine_line_last_and_honours_no_record(written, tmp_path,
                                                                   monkeypatch, capsys):
    monkeypatch.setattr(common, "machine", lambda *a, **k: written[1]["machine"])
    common.finish("unit", {"x": 1}, argv=["benchmarks/unit.py"], directory=str(tmp_path))
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-2].startswith("result: ") and line_problems(out[-1]) == []
    assert len(os.listdir(tmp_path)) == 1
    # Negative controls: --no_record and JAXSOCIAL_NO_RECORD=1 write nothing, still print it.
    common.finish("unit", {"x": 1}, record=False, directory=str(tmp_path))
    monkeypatch.setenv(common.NO_RECORD_ENV, "1")
    common.finish("unit", {"x": 1}, directory=str(tmp_path))
    out = capsys.readouterr().out.strip().splitlines()
    assert len(os.listdir(tmp_path)) == 1 and len(out) == 2
    assert all(line_problems(x) == [] for x in out)


def test_rl_step_gives_torch_as_many_threads_as_jax_has_cores(monkeypatch):
    import rl_step

    args = rl_step.build_parser().parse_args([])
    assert rl_step.torch_threads(args) == common.cores()
    assert common.thread_handicap(rl_step.torch_threads(args)) is None
    # Negative control: a one-thread TRL is flagged where JAX has more cores (4 here, whatever
    # this machine has); the default follows the cores.
    monkeypatch.setattr(common, "cores", lambda: 4)
    one = rl_step.build_parser().parse_args(["--torch_threads", "1"])
    assert rl_step.torch_threads(one) == 1
    assert "UNFAIR" in common.thread_handicap(rl_step.torch_threads(one))
    assert rl_step.torch_threads(rl_step.build_parser().parse_args([])) == 4


WIRED = ("forward", "generate", "rl_step", "ppo_update", "society_scale", "tournament",
         "smol_epoch", "aot_memory", "prefill", "decode_buckets")


def _source(name):
    with open(os.path.join(BENCH, name + ".py")) as f:
        return f.read()


def test_peer_benchmarks_record_and_end_with_the_machine_line():
    for name in WIRED:
        src = _source(name)
        assert "finish(" in src and "no_record" in src, name
    # Negative control: a profile that records nothing fails the same check.
    src = _source("decode_attention")
    assert not ("finish(" in src and "no_record" in src)


NOTEBOOK = re.compile(r"\bissue\s*#?\d+|\bissue's\b|\bold path\b|\bthis (evening|morning)\b", re.I)


def test_benchmark_sources_carry_no_notebook_references():
    for name in sorted(os.listdir(BENCH)):
        if name.endswith((".py", ".sh")):
            with open(os.path.join(BENCH, name)) as f:
                assert not NOTEBOOK.search(f.read()), name
    # Negative control: the pattern catches what it is for.
    assert NOTEBOOK.search("Setting (issue 19 item 5)") and NOTEBOOK.search("the old path")


@pytest.mark.parametrize("imports_common", [True, False])
def test_benchmarks_point_jax_at_the_cpu_before_libtpu_can_start(imports_common):
    # With libtpu installed and no TPU, a JAX backend started before jaxsocial is imported
    # lets libtpu print its TPU-host errors: common.py imports jaxsocial first, which points
    # JAX at the CPU. Control: a bare `import jax` leaves the platform to JAX.
    pytest.importorskip("libtpu")
    import subprocess

    from jax._src import hardware_utils
    if (hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
            or hardware_utils.has_visible_nvidia_gpu()):
        pytest.skip("an accelerator is attached: JAX is meant to start its backend")
    first = "import common" if imports_common else "import jax"
    code = (f"import os, sys; sys.path.insert(0, {os.path.join(ROOT, 'benchmarks')!r}); "
            f"{first}; import jax; print(jax.config.jax_platforms)")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    got = out.stdout.strip().splitlines()[-1]
    assert (got == "cpu") == imports_common, (got, out.stderr[-2000:])


def test_rl_step_lora_rows_train_the_same_adapters_on_both_sides(tmp_path):
    """rl_step.py --lora: our adapters and PEFT's on the same (tiny) Llama have the same
    rank, alpha, targets and trainable count, and PEFT freezes the base."""
    pytest.importorskip("peft")
    import jax
    import rl_step
    from flax import nnx
    from generate import torch_model
    from peft import get_peft_model

    from jaxsocial.models import llama
    from jaxsocial.rl import lora, policy

    args = rl_step.build_parser().parse_args(["--lora"])
    ours, peft = rl_step.lora_config(args), rl_step.peft_config(args)
    assert (peft.r, peft.lora_alpha, peft.lora_dropout) == (ours.rank, ours.alpha, 0.0)
    assert sorted(peft.target_modules) == sorted(ours.targets) == sorted(lora.DEFAULT_TARGETS)
    model = llama.Llama(llama.preset("tiny", dtype="float32", param_dtype="float32"),
                        rngs=nnx.Rngs(0))
    _, params, _ = policy.init_policy(model, jax.random.PRNGKey(0), value_mode="none",
                                      lora=ours)
    wrapped = get_peft_model(torch_model(model, str(tmp_path)), peft)
    trainable, total = wrapped.get_nb_trainable_parameters()
    assert lora.num_params(params) == trainable < total
    assert trainable == sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    # Negative control: another rank on our side gives another count.
    other = lora.LoraConfig(rank=ours.rank * 2, alpha=ours.alpha, targets=ours.targets)
    _, params2, _ = policy.init_policy(model, jax.random.PRNGKey(0), value_mode="none",
                                       lora=other)
    assert lora.num_params(params2) != trainable
