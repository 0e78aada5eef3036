"""Every PPO/GRPO setting reachable from --config under its own field name,
one shared base for the common settings, and adaptive KL starting from kl_coef."""
import dataclasses

import jax
import ml_collections
import pytest

from jaxsocial.rl import config as rl_classes
from jaxsocial.rl import grpo, optim, ppo
from jaxsocial.train import config as run_config

FIXED = dict(stop_token_ids=(2,), temperature=0.9, top_k=3, top_p=0.8)
LOOP_KEYS = run_config.RL_LOOP_KEYS


def _build(rl, **kw):
    return run_config.from_run_config(rl, loop_keys=LOOP_KEYS, **{**FIXED, **kw})


def test_one_shared_base():
    assert issubclass(ppo.PPOConfig, rl_classes.OptimConfig)
    assert issubclass(grpo.GRPOConfig, rl_classes.OptimConfig)
    shared = {f.name for f in dataclasses.fields(rl_classes.OptimConfig)}
    for name in ("learning_rate", "num_minibatches", "micro_batch", "logits_chunk", "clip_eps",
                 "clip_eps_high", "kl_coef", "lr_schedule", "warmup_steps", "max_grad_norm"):
        assert name in shared


def test_defaults_build_the_dataclass_defaults():
    c = run_config.base_config()
    got = _build(c.rl, reward_norm="none")
    assert got == ppo.PPOConfig(**FIXED)
    c.rl.algo = "grpo"
    g = _build(c.rl, group_size=4)
    # shared fields follow c.rl (PPO's defaults), GRPO's own fields its defaults
    assert g == grpo.GRPOConfig(**FIXED, **{n: getattr(got, n) for n in
                                            rl_classes.base_field_names()}, group_size=4)


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_every_field_is_reachable_under_its_own_name(algo):
    cls = ppo.PPOConfig if algo == "ppo" else grpo.GRPOConfig
    names = set(run_config.run_config_fields())
    own = [f for f in dataclasses.fields(cls) if f.name in names]
    # all but the loop-set fields (sampling from c.rollout, reward_norm from c.reward)
    assert {f.name for f in dataclasses.fields(cls)} - names <= set(run_config.LOOP_SET)
    assert len(own) >= len(dataclasses.fields(cls)) - len(run_config.LOOP_SET)
    new_values = {
        "learning_rate": 1e-4, "lr_schedule": "cosine", "warmup_steps": 3, "decay_steps": 7,
        "end_lr_ratio": 0.1, "weight_decay": 0.01, "adam_b1": 0.8, "adam_b2": 0.99,
        "adam_eps": 1e-6, "max_grad_norm": 0.5, "ppo_epochs": 2, "num_minibatches": 2,
        "grad_accum_steps": 2, "micro_batch": 4, "logits_chunk": 16, "clip_eps": 0.1,
        "clip_eps_high": 0.28, "ent_coef": 0.01, "kl_coef": 0.2, "kl_estimator": "k2",
        "missing_stop_penalty": 1.0, "value_clip": 0.3, "vf_coef": 0.5, "gamma": 0.9,
        "lam": 0.9, "whiten_advantages": False, "whiten_rewards": True, "reward_clip": 3.0,
        "adaptive_kl": True, "adaptive_kl_init": 0.3, "kl_target": 2.0, "kl_horizon": 500.0,
        "group_size": 4, "loss_aggregation": "seq_mean", "scale_rewards": False,
        "std_eps": 1e-3, "std_ddof": 0, "old_logprobs": "rescore", "prompt_group": 4,
        "kl_per": "sequence", "old_values": "rollout",
    }
    assert set(new_values) == names  # the test covers every field
    c = run_config.base_config()
    c.rl.algo = algo
    own = [f for f in own if f.name != "micro_batch"]  # excludes grad_accum_steps: below
    for f in own:
        assert new_values[f.name] != getattr(cls(), f.name), f.name  # a real change
        setattr(c.rl, f.name, new_values[f.name])
    got = _build(c.rl, group_size=c.rl.group_size)
    for f in own:
        assert getattr(got, f.name) == new_values[f.name], f.name
    c.rl.grad_accum_steps = 1
    c.rl.micro_batch = 4
    assert _build(c.rl, group_size=c.rl.group_size).micro_batch == 4


def test_unknown_and_loop_set_keys_are_one_clear_error():
    c = run_config.base_config()
    c.rl.lrr = 1.0
    with pytest.raises(ValueError, match=r"unknown config key\(s\) rl\.lrr;"):
        _build(c.rl)
    c = run_config.base_config()
    c.rl.temperature = 0.5
    with pytest.raises(ValueError, match=r"rl\.temperature \(set by rollout\.temperature\)"):
        _build(c.rl)
    c = run_config.base_config()
    c.rl.clip_eps = 1.5
    with pytest.raises(ValueError, match="clip_eps must be in"):
        _build(c.rl)


def test_renamed_keys_are_one_error_naming_the_new_key():
    c = run_config.base_config()
    for old, new in run_config.RENAMED.items():
        assert old not in c.rl and new in c.rl
    d = c.rl.to_dict()
    assert _build(d).learning_rate == c.rl.learning_rate  # control: the block as it is
    d["lr"] = 1e-3
    with pytest.raises(ValueError, match=r"rl\.lr \(now rl\.learning_rate\)"):
        _build(d)
    # A workdir's config.json from before the rename holds both names: it still resumes (the
    # old keys are ignored), and a real change of the new key is still refused.
    stored = run_config.as_plain(c)
    stored["rl"].update(lr=c.rl.learning_rate, minibatches=c.rl.num_minibatches,
                        entropy_coef=c.rl.ent_coef)
    assert run_config.resume_differences(stored, c) == ({}, {})
    stored["rl"]["learning_rate"] = 1.0
    assert "rl.learning_rate" in run_config.resume_differences(stored, c)[1]


def test_a_key_added_after_a_run_does_not_refuse_its_resume():
    """A config.json written before a key existed resumes while the key stays at its default;
    the same key set to anything else is refused."""
    c = run_config.base_config()
    stored = run_config.as_plain(c)
    del stored["agents"]["interviews"], stored["train"]["fork_from"]
    assert run_config.resume_differences(stored, c) == ({}, {})
    c.agents.interviews = ("What do you post about?",)  # control: a real change
    assert "agents.interviews" in run_config.resume_differences(stored, c)[1]


def test_placeholder_fields_override_from_the_command_line():
    """Optional fields (None by default) are typed placeholders: --config.rl.x=... sets them."""
    import os
    import subprocess
    import sys
    script = ("from absl import app, flags\n"
              "from ml_collections import config_flags\n"
              "config_flags.DEFINE_config_file('config')\n"
              "def main(_):\n"
              "    r = flags.FLAGS.config.rl\n"
              "    print(r.clip_eps_high, r.micro_batch, r.learning_rate, r.adaptive_kl_init)\n"
              "app.run(main)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", script, "--config=configs/demo.py",
                          "--config.rl.clip_eps_high=0.28", "--config.rl.micro_batch=8",
                          "--config.rl.learning_rate=0.002"], cwd=root, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-4:] == ["0.28", "8", "0.002", "None"]


def test_adaptive_kl_starts_from_kl_coef():
    cfg = ppo.PPOConfig(adaptive_kl=True, kl_coef=0.07)
    assert cfg.initial_kl_coef == 0.07
    from test_rl_common import tiny_policy
    pdef, params, ref = tiny_policy("head")
    state = optim.init_train_state(cfg, pdef, params, ref, jax.random.PRNGKey(0))
    assert float(state.kl.coef) == pytest.approx(0.07)
    assert ppo.PPOConfig(adaptive_kl=True, kl_coef=0.07, adaptive_kl_init=0.2) \
        .initial_kl_coef == 0.2  # an explicit start still wins
    with pytest.raises(ValueError, match="adaptive_kl starts from kl_coef"):
        ppo.PPOConfig(adaptive_kl=True, kl_coef=0.0)


def test_loop_builds_grpo_groups_and_checks_them():
    c = ml_collections.ConfigDict(run_config.base_config())
    c.rl.algo = "grpo"
    c.rl.group_size = 3
    cfg = _build(c.rl, group_size=3)
    assert cfg.group_size == 3 and isinstance(cfg, grpo.GRPOConfig)
