"""Size bounds checked from the config alone (`train.bounds`, part of `checks.check`): a
persona, an agent count, a response length or a post ring too large for the machine is refused
in one line naming its key, before anything is allocated; and the set-up's memory check
(`setup.check_memory`) also runs on the CPU."""
import types

import jax
import jax.numpy as jnp
import pytest
from conftest import load_config_file

from jaxsocial.models import llama
from jaxsocial.train import bounds, checks, memory, sharding
from jaxsocial.train import config as run_config
from jaxsocial.train import run as run_lib
from jaxsocial.train import setup as setup_lib

GiB = memory.GiB
RAM = int(23.5 * GiB)  # the figures below are for a 23.5 GiB CPU host (the tests' 8 devices)


@pytest.fixture
def ram(monkeypatch):
    """Fix this machine's memory (CPU: RAM, shared by the devices); returns the setter."""
    def set_ram(n):
        monkeypatch.setattr(memory, "machine_memory", lambda: (int(n), "RAM", False))
    set_ram(RAM)
    return set_ram


def smoke(**overrides):
    """demo.py:smoke with {"section.key": value} overrides (the probes' base command)."""
    c = load_config_file("configs/demo.py", "smoke")
    for key, value in overrides.items():
        section, name = key.split(".")
        c[section][name] = value
    return c


def persona(chars: int) -> str:
    """A persona of `chars` characters: the default personas repeated."""
    text = " ".join(run_config.PERSONAS)
    return (text * (chars // len(text) + 1))[:chars].strip()


def refusal(c, machine: bool = True) -> str:
    with pytest.raises(ValueError) as e:
        checks.check(c, machine=machine)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


# ---------------------------------------------------------------------------------------------
# the probes: refused in one line naming the key; a smaller value passes


@pytest.mark.parametrize("bad,good,named", [
    # 10,000 characters: 6,240 tokens of the tiny tokenizer (the set-up's text-bank pass
    # needed 149 GiB and ended in an XLA OOM); 2,213 characters (1,384 tokens) still run.
    ({"agents.personas": (persona(10_000),)}, {"agents.personas": (persona(2_213),)},
     ("agents.personas", "6240 tokens", "MAX_PERSONA_TOKENS=2048")),
    # Every agent acts each tick: 1e7 prompts at once (set up for minutes before); per device
    # on the 8 devices (the update in automatic micro-batches of rl.micro_tokens), 32,000
    # agents fit, 64,000 need ~26 GiB.
    ({"agents.num_agents": 10_000_000, "society.num_users": 10_000_000},
     {"agents.num_agents": 1_000, "society.num_users": 1_000},
     ("agents.num_agents=10000000", "23.5 GiB of RAM")),
    ({"agents.num_agents": 64_000, "society.num_users": 64_000},
     {"agents.num_agents": 32_000, "society.num_users": 32_000},
     ("agents.num_agents=64000", "23.5 GiB of RAM")),
    # 1e6 new tokens (an XLA OOM after ~56 s); 10,000 fit, 20,000 need ~54 GiB.
    ({"rollout.max_new_tokens": 1_000_000}, {"rollout.max_new_tokens": 4_000},
     ("rollout.max_new_tokens=1000000", "23.5 GiB of RAM")),
    ({"rollout.max_new_tokens": 20_000}, {"rollout.max_new_tokens": 10_000},
     ("rollout.max_new_tokens=20000",)),
    # 1e9 post slots (an XLA OOM after ~56 s); 8e7 need ~18 GiB, 1.6e8 ~35 GiB.
    ({"society.post_capacity": 1_000_000_000}, {"society.post_capacity": 80_000_000},
     ("society.post_capacity=1000000000", "23.5 GiB of RAM")),
    ({"society.post_capacity": 160_000_000}, {"society.post_capacity": 80_000_000},
     ("society.post_capacity=160000000",)),
])
def test_probe_is_refused_in_one_line_naming_its_key(ram, bad, good, named):
    checks.check(smoke())  # control: the smoke config passes
    checks.check(smoke(**good))  # control: a smaller value passes
    msg = refusal(smoke(**bad))
    assert all(n in msg for n in named), msg


def test_a_persona_the_text_bank_pass_cannot_hold_is_refused(ram):
    """Under the hard limit, a long persona is refused by the memory of the set-up's text-bank
    pass (every interest and persona padded to it, 64 rows at a time)."""
    c = smoke(**{"agents.personas": (persona(2_213),)})
    checks.check(c)  # 23.5 GiB: fits (~7.5 GiB)
    ram(4 * GiB)
    msg = refusal(c)
    assert "agents.personas: the longest persona is 1384 tokens" in msg
    assert "text-bank pass" in msg and "4.0 GiB of RAM" in msg, msg
    checks.check(smoke(**{"agents.personas": (persona(1_000),)}))  # ~1.6 GiB: fits


def test_hard_limits_hold_whatever_the_memory(ram):
    ram(2 ** 50)
    count, exact = bounds.token_counter(smoke())
    assert exact  # the tiny tokenizer's tokenizer.json
    base = "You are Ada, a"
    at_limit = base + " x" * ((bounds.MAX_PERSONA_TOKENS - count(" " + base)) // count(" x"))
    assert count(" " + at_limit) <= bounds.MAX_PERSONA_TOKENS
    checks.check(smoke(**{"agents.personas": (at_limit,)}))
    msg = refusal(smoke(**{"agents.personas": (at_limit + " x x",)}))
    assert "agents.personas" in msg and "MAX_PERSONA_TOKENS" in msg, msg
    checks.check(smoke(**{"society.post_capacity": bounds.MAX_ID}))
    msg = refusal(smoke(**{"society.post_capacity": bounds.MAX_ID + 1}))
    assert f"society.post_capacity={bounds.MAX_ID + 1}" in msg and "int32" in msg, msg


def test_without_a_tokenizer_json_the_count_is_a_byte_bound(ram):
    c = smoke(**{"agents.personas": (persona(2_213),)})
    c.tokenizer = "/nonexistent/tokenizer"
    count, exact = bounds.token_counter(c)
    assert not exact and count("abc") == 4 and count("é") == 3
    assert bounds.shapes(c).persona == 2_213 + 2  # " " + persona, + 1
    ram(4 * GiB)
    assert "UTF-8 bytes + 1" in refusal(c)


def test_shipped_configs_pass():
    """On this machine: the demo and the smoke variants, and general.py as the tests build it
    (an abstract 8B: only the bytes its shapes add are compared, not the 8B's weights)."""
    for path, variant in [("configs/demo.py", None), ("configs/demo.py", "smoke"),
                          ("configs/general.py", None), ("configs/general.py", "smoke"),
                          ("configs/code.py", "smoke"), ("configs/cohorts.py", "smoke"),
                          ("configs/cohorts.py", "control"), ("configs/cohorts.py", "objectives")]:
        c = load_config_file(path, variant)
        c.model.require_checkpoint = False  # as aot.abstract_run builds it
        checks.check(c)
    for overrides in [{"rl.algo": "grpo"}, {"rl.lora_rank": 4}, {"society.feed_comments": 2},
                      {"agents.action_mode": "tool_call", "rollout.max_new_tokens": 40},
                      {"model.remat": True, "model.scan_layers": True}]:
        checks.check(smoke(**overrides))  # the smoke run's switches
    for path, variant in [("configs/social_learning.py", "small"),
                          ("configs/skill_evolution.py", "smoke")]:
        assert bounds.problems(load_config_file(path, variant)) == []  # not Social-RL runs


def test_multi_process_runs_keep_only_the_hard_limits(ram):
    """The backend must not start before jax.distributed.initialize: no memory comparison."""
    c = smoke(**{"rollout.max_new_tokens": 1_000_000})
    c.distributed.enabled = True
    checks.check(c)
    c = smoke(**{"agents.personas": (persona(10_000),)})
    c.distributed.enabled = True
    assert "MAX_PERSONA_TOKENS" in refusal(c)


def test_abstract_builds_keep_only_the_hard_limits(ram):
    """`checks.check(config, machine=False)` (for scale.aot's abstract runs, compiled for
    another machine)."""
    c = smoke(**{"rollout.max_new_tokens": 1_000_000})
    checks.check(c, machine=False)
    assert "MAX_PERSONA_TOKENS" in refusal(smoke(**{"agents.personas": (persona(10_000),)}),
                                           machine=False)
    assert "rollout.max_new_tokens" in refusal(c)  # and with the machine, the memory again


def test_the_launcher_refuses_before_the_workdir(ram, tmp_path, monkeypatch, capsys):
    import os

    from absl import flags
    from conftest import ROOT, load_launcher

    from jaxsocial.train import runner

    def reached(*a, **k):
        raise AssertionError("the run started")
    monkeypatch.setattr(runner, "train", reached)
    mod = load_launcher("launch/train.py")
    try:
        mod.parse_flags(["train.py", "--noprogress",
                         f"--config={os.path.join(ROOT, 'configs', 'demo.py')}:smoke",
                         f"--workdir={tmp_path / 'w'}"])
        mod._CONFIG.value.rollout.max_new_tokens = 1_000_000
        with pytest.raises(SystemExit) as e:
            mod.main([])
    finally:
        flags.FLAGS.unparse_flags()
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert e.value.code == 1 and len(errors) == 1, errors
    assert "rollout.max_new_tokens=1000000" in errors[0]
    assert not (tmp_path / "w").exists()


# ---------------------------------------------------------------------------------------------
# the estimates behind the bounds


def test_prompt_len_bounds_the_built_template():
    """`Shapes.prompt_len` >= `PromptTemplate.max_len` (and within two 64-token buckets)."""
    from jaxsocial.agents import prompting
    from jaxsocial.models import tokenizer

    tok = tokenizer.tiny_tokenizer()
    cases = [smoke(), smoke(**{"agents.personas": (persona(2_213),)}),
             smoke(**{"agents.action_mode": "tool_call"}), smoke(**{"society.feed_comments": 2}),
             smoke(**{"agents.newest_comment": False, "society.num_users": 10 ** 8})]
    for c in cases:
        s = c.society
        from jaxsocial.agents import tool_calls
        from jaxsocial.train import config as run_config
        instruction, footer = run_config.prompt_text(
            c, lambda: tool_calls.tool_instruction(c.agents.actions, s.feed_size))
        built = prompting.PromptTemplate.build(
            tok, list(c.agents.personas), instruction, footer, s.feed_size,
            s.content_len, newest_comment=bool(c.agents.newest_comment),
            num_users=s.num_users, feed_comments=s.get("feed_comments", 0)).max_len
        bound = bounds.shapes(c).prompt_len
        assert built <= bound <= built + 128, (built, bound)


def test_encode_bytes_follows_xla():
    """`memory.encode_bytes` against XLA's temp for the text-bank pass (the tiny preset)."""
    from flax import nnx

    from jaxsocial.train import society_encoder

    cfg = llama.preset("tiny")
    graphdef, state = nnx.split(nnx.eval_shape(lambda: llama.Llama(cfg, rngs=nnx.Rngs(0))))
    fn = jax.jit(lambda s, x: society_encoder.pooled_states(graphdef, s, x))
    rows, length = 16, 512
    temp = fn.lower(state, jax.ShapeDtypeStruct((rows, length), jnp.int32)).compile() \
        .memory_analysis().temp_size_in_bytes
    est = memory.encode_bytes(cfg, rows, length)
    assert 0.95 < est / temp < 1.2, (est, temp)
    # Negative control: the attention scores alone (one block) are a quarter of it.
    assert rows * cfg.num_attention_heads * length * length * 4 < 0.5 * temp


def test_update_without_remat_follows_xla():
    """memory.estimate's update without remat (the demo's) against XLA's temp: the attention's
    saved scores dominate at long prompts (a long persona)."""
    from jaxsocial.rl import ppo
    from jaxsocial.scale import aot
    from jaxsocial.train import sharding

    cfg = llama.preset("tiny")
    rows, prompt, response = 16, 512, 8
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    fn, args = aot.abstract_update(cfg, ppo.PPOConfig(ppo_epochs=1, num_minibatches=1), mesh,
                                   rows=rows, prompt_len=prompt, response_len=response)
    mem, _ = aot.program_memory("update", fn, args)
    est = memory.estimate(cfg, (1, 1, 1), batch=rows, prompt_len=prompt,
                          response_len=response, trajectories=rows, train_micro_batch=rows)
    assert 0.95 < est.working["update"] / mem.temp < 1.15, (est.working, mem)
    # Negative control: Korthikanti's 5 bytes per score at 16 bits (10 in float32) per layer.
    scores = rows * cfg.num_attention_heads * (prompt + response) ** 2
    assert cfg.num_hidden_layers * 10 * scores < 0.7 * mem.temp


# ---------------------------------------------------------------------------------------------
# the set-up's memory check runs on every backend


def _setup_stub(c, monkeypatch):
    """A set-up on a (2, 1, 1) mesh whose estimate is 6 GiB per device (`memory_estimate`
    patched: the check itself is under test)."""
    est = memory.MemoryEstimate(params=GiB, grads=GiB, optimizer=2 * GiB, reference=GiB,
                                kv_cache=GiB, activations=GiB,
                                programs={"epoch": 6 * GiB})
    monkeypatch.setattr(setup_lib, "memory_estimate", lambda setup: est)
    return types.SimpleNamespace(
        config=c, mesh=types.SimpleNamespace(local_devices=jax.devices()[:2],
                                             shape={"data": 2, "fsdp": 1, "tensor": 1}))


def test_check_memory_refuses_on_the_cpu(ram, monkeypatch):
    c = smoke()
    setup = _setup_stub(c, monkeypatch)
    assert memory.device_memory_bytes() is None  # the CPU backend reports none
    setup_lib.check_memory(setup)  # 2 devices x 6 GiB in 23.5 GiB: fits
    ram(10 * GiB)
    with pytest.raises(ValueError) as e:
        setup_lib.check_memory(setup)
    msg = str(e.value)
    assert "\n" not in msg and "model.preset='tiny'" in msg and "mesh.shape=(2, 1, 1)" in msg
    assert "12.0 GiB" in msg and "10.0 GiB of RAM" in msg, msg
    # The set-up refuses it; an abstract run (scale.aot: ShapeDtypeStruct weights) allocates
    # nothing and is not checked against this machine.
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    ram(5 * GiB)
    with pytest.raises(ValueError, match="GiB of RAM"):
        setup_lib.build_setup(c, mesh)
    run = run_lib.abstract_run(c, mesh)
    assert isinstance(jax.tree.leaves(run.weights.ref)[0], jax.ShapeDtypeStruct)
