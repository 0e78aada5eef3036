"""What is refused before anything is built: the hard limits (`train.bounds`, part of
`checks.check`) and a state that cannot fit this machine (`fit.check_state`: the run's state
by `jax.eval_shape` of its initialisers), each in one line naming its key, before the launcher
writes a workdir; a value just inside each limit passes."""
import os

import jax
import pytest
from conftest import ROOT, load_config_file, load_launcher

from jaxsocial.train import bounds, checks, dataset, fit, machine, sharding
from jaxsocial.train import config as run_config
from jaxsocial.train import run as run_lib
from jaxsocial.train import setup as setup_lib

GiB = machine.GiB
RAM = int(23.5 * GiB)  # the probes' figures are for a 23.5 GiB CPU host


@pytest.fixture
def ram(monkeypatch):
    """Fix this machine's memory (CPU: RAM, shared by the devices); returns the setter."""
    def set_ram(n, kind="RAM", per_device=False):
        monkeypatch.setattr(machine, "machine_memory", lambda: (int(n), kind, per_device))
    set_ram(RAM)
    return set_ram


def config(variant=None, **overrides):
    """demo.py (or a variant) with {"section.key": value} overrides."""
    c = load_config_file("configs/demo.py", variant)
    for key, value in overrides.items():
        section, name = key.split(".")
        c[section][name] = value
    return c


def persona(chars: int) -> str:
    """A persona of `chars` characters: the default personas repeated."""
    text = " ".join(run_config.PERSONAS)
    return (text * (chars // len(text) + 1))[:chars].strip()


def check(c):
    """What the launcher checks before the workdir: the config, then its state."""
    checks.check(c)
    fit.check_state(c)


def refusal(c) -> str:
    with pytest.raises(ValueError) as e:
        check(c)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def state_bytes(c) -> int:
    return sum(fit.state_parts(setup_lib.config_state(c)).values())


# The four probes on demo.py, each with a value just inside its limit.
PROBES = [
    # 10,000 characters: 6,240 tokens of the tiny tokenizer (MAX_PERSONA_TOKENS).
    ({"agents.personas": (persona(10_000),)}, {"agents.personas": (persona(3_000),)},
     ("agents.personas", "6240 tokens", "MAX_PERSONA_TOKENS=2048")),
    # demo.py's 2,048 users cannot hold 1e7 agents.
    ({"agents.num_agents": 10_000_000}, {"agents.num_agents": 2_048},
     ("agents.num_agents=10000000", "society.num_users=2048")),
    # 1e9 post slots: 1,531 GiB of post ring (its state by jax.eval_shape).
    ({"society.post_capacity": 1_000_000_000}, {"society.post_capacity": 4_000_000},
     ("society.post_capacity=1000000000", "post ring", "23.5 GiB of RAM")),
    # 1e6 new tokens: more than the tiny model's context of 1,024 positions.
    ({"rollout.max_new_tokens": 1_000_000}, {"rollout.max_new_tokens": 1_023},
     ("rollout.max_new_tokens=1000000", "max_position_embeddings=1024")),
]


@pytest.mark.parametrize("bad,good,named", PROBES)
def test_probe_is_refused_in_one_line_naming_its_key(ram, bad, good, named):
    check(config(**good))  # control: a value inside the limit passes
    msg = refusal(config(**bad))
    assert all(n in msg for n in named), msg


def launch_refused(tmp_path, monkeypatch, capsys, values) -> str:
    """launch/train.py on demo.py with `values` set: its one error line; no workdir, no run."""
    from absl import flags

    from jaxsocial.train import runner

    def reached(*a, **k):
        raise AssertionError("the run started")
    monkeypatch.setattr(runner, "train", reached)
    mod = load_launcher("launch/train.py")
    try:
        mod.parse_flags(["train.py", "--noprogress",
                         f"--config={os.path.join(ROOT, 'configs', 'demo.py')}",
                         f"--workdir={tmp_path / 'w'}"])
        for key, value in values.items():
            section, name = key.split(".")
            mod._CONFIG.value[section][name] = value
        with pytest.raises(SystemExit) as e:
            mod.main([])
    finally:
        flags.FLAGS.unparse_flags()
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert e.value.code == 1 and len(errors) == 1, errors
    assert not (tmp_path / "w").exists()
    return errors[0]


@pytest.mark.parametrize("bad,good,named", PROBES)
def test_the_launcher_refuses_before_the_workdir(ram, tmp_path, monkeypatch, capsys, bad, good,
                                                 named):
    line = launch_refused(tmp_path, monkeypatch, capsys, bad)
    assert all(n in line for n in named), line


def test_an_unreadable_checkpoint_is_one_line_before_the_workdir(tmp_path, monkeypatch, capsys):
    line = launch_refused(tmp_path, monkeypatch, capsys,
                          {"model.checkpoint": str(tmp_path / "missing")})
    assert "checkpoint directory not found" in line, line


def test_hard_limits_at_their_edges(ram):
    """Each hard limit holds whatever the memory: at the limit passes, one past it does not."""
    ram(2 ** 60)
    c = config("smoke")
    count, exact = bounds.token_counter(c)
    assert exact  # the tiny tokenizer's tokenizer.json
    base = "You are Ada, a"
    at_limit = base + " x" * ((bounds.MAX_PERSONA_TOKENS - count(" " + base)) // count(" x"))
    assert count(" " + at_limit) <= bounds.MAX_PERSONA_TOKENS
    checks.check(config("smoke", **{"agents.personas": (at_limit,)}))
    msg = refusal(config("smoke", **{"agents.personas": (at_limit + " x x",)}))
    assert "agents.personas" in msg and "MAX_PERSONA_TOKENS" in msg, msg
    checks.check(config("smoke", **{"society.post_capacity": bounds.MAX_ID}))
    msg = refusal(config("smoke", **{"society.post_capacity": bounds.MAX_ID + 1}))
    assert f"society.post_capacity={bounds.MAX_ID + 1}" in msg and "int32" in msg, msg
    checks.check(config("smoke", **{"rollout.max_new_tokens": 1023}))
    msg = refusal(config("smoke", **{"rollout.max_new_tokens": 1024}))
    assert "rollout.max_new_tokens=1024 leaves no room for a prompt" in msg, msg


def test_without_a_tokenizer_json_the_count_is_a_byte_bound(ram):
    text = persona(2_100)
    c = config("smoke", **{"agents.personas": (text,)})
    checks.check(c)  # ~1,300 tokens of the tiny tokenizer
    c.tokenizer = "/nonexistent/tokenizer"
    count, exact = bounds.token_counter(c)
    assert not exact and count("abc") == 4 and count("é") == 3
    msg = refusal(c)
    assert f"{len(text) + 2} tokens" in msg and "UTF-8 bytes + 1" in msg, msg  # " " + it, + 1


def test_the_state_is_the_one_init_state_builds():
    """`setup.config_state` (from the config alone) has the shapes of the state the set-up's
    own `init_state` builds (its abstract run), the crowd's text banks aside."""
    for variant, path in [("smoke", "configs/demo.py"), ("smoke", "configs/cohorts.py")]:
        c = load_config_file(path, variant)
        run = run_lib.abstract_run(c, sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
        built = setup_lib.abstract_state(run.setup, run.weights, run.text)
        alone = setup_lib.config_state(c)
        shapes = lambda t: [(x.shape, x.dtype) for x in jax.tree.leaves(t)]  # noqa: E731
        assert shapes(alone.train) == shapes(built.train), path
        assert shapes(alone.society.replace(text=None)) == shapes(
            built.society.replace(text=None)), path
        assert shapes((alone.key, alone.epoch)) == shapes((built.key, built.epoch))


def test_the_state_is_judged_against_the_machine_at_its_edge(ram):
    """Refused one byte short of the state's bytes, passed at them; the key named is the one
    behind the largest part."""
    c = config(**{"society.post_capacity": 400_000})
    need = state_bytes(c)
    parts = fit.state_parts(setup_lib.config_state(c))
    assert max(parts, key=parts.get) == "society.post_capacity"
    ram(need)
    fit.check_state(c)
    ram(need - 1)
    msg = refusal(c)
    assert msg.startswith("society.post_capacity=400000: the run's state needs"), msg
    # An accelerator: one device holds at least its even share over the mesh's 8 devices.
    c.mesh.shape = (-1, 1, 1)
    ram(-(-need // 8), "device memory", True)
    fit.check_state(c)
    ram(-(-need // 8) - 1, "device memory", True)
    msg = refusal(c)
    assert "per device over mesh.shape=(-1, 1, 1)" in msg and "device memory" in msg, msg


def test_an_8b_state_is_refused_on_this_ram_and_lora_fits(ram):
    """configs/general.py: the 8B's weights, reference and Adam state (60 GiB) cannot fit 23.5
    GiB of RAM; with LoRA adapters (the base frozen, the reference) they do."""
    c = load_config_file("configs/general.py")
    c.model.require_checkpoint = False
    checks.check(c)
    msg = refusal(c)
    assert msg.startswith("model.preset='llama3_8b': the run's state needs 60 GiB"), msg
    assert "rl.lora_rank" in msg, msg
    c.rl.lora_rank = 16
    fit.check_state(c)


def test_shipped_configs_pass():
    """The hard limits of every shipped config; the state of those this machine runs."""
    for path, variant in [("configs/demo.py", None), ("configs/demo.py", "smoke"),
                          ("configs/general.py", None), ("configs/general.py", "smoke"),
                          ("configs/code.py", "smoke"), ("configs/cohorts.py", "smoke"),
                          ("configs/cohorts.py", "control"), ("configs/cohorts.py", "objectives")]:
        c = load_config_file(path, variant)
        c.model.require_checkpoint = False
        if dataset.missing():  # the [tfds] extra is not installed here: tests/test_dataset.py
            c.train.dataset = False
        checks.check(c)
        if path != "configs/general.py":
            fit.check_state(c)
    for overrides in [{"rl.algo": "grpo"}, {"rl.lora_rank": 4}, {"society.feed_comments": 2},
                      {"agents.action_mode": "tool_call", "rollout.max_new_tokens": 40},
                      {"model.remat": True, "model.scan_layers": True}]:
        check(config("smoke", **overrides))
    for path, variant in [("configs/social_learning.py", "small"),
                          ("configs/skill_evolution.py", "smoke")]:
        assert bounds.problems(load_config_file(path, variant)) == []  # not Social-RL runs


def test_multi_process_runs_keep_only_the_hard_limits(ram):
    """The backend must not start before jax.distributed.initialize: no memory comparison."""
    c = config(**{"society.post_capacity": 1_000_000_000})
    c.distributed.enabled = True
    check(c)
    c = config(**{"agents.personas": (persona(10_000),)})
    c.distributed.enabled = True
    assert "MAX_PERSONA_TOKENS" in refusal(c)


def test_the_config_is_checked_once_per_launch(tmp_path, monkeypatch, capsys):
    """launch/train.py checks the config (and its state) before the workdir, and the trainer,
    the set-up and the pre-flight's abstract build do not check it again."""
    from absl import flags

    calls = []
    real = checks.check

    def counted(c):
        calls.append("check")
        return real(c)

    def stop(run, state):  # the run is built: stop before the compile
        raise ValueError("stopped after the build")
    monkeypatch.setattr(checks, "check", counted)
    monkeypatch.setattr(fit, "fit_run", stop)
    mod = load_launcher("launch/train.py")
    try:
        mod.parse_flags(["train.py", "--noprogress", "--verbose",
                         f"--config={os.path.join(ROOT, 'configs', 'demo.py')}:smoke",
                         f"--workdir={tmp_path / 'w'}"])
        with pytest.raises(SystemExit):
            mod.main([])
    finally:
        flags.FLAGS.unparse_flags()
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == ["error: stopped after the build"], errors
    assert calls == ["check"]
    assert not (tmp_path / "w").exists()  # the refused start is taken back
