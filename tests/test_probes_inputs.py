"""Bad inputs to the launchers and loaders are refused in one line naming the key, before any
model, data or workdir: launch/eval.py, launch/simulate.py, launch/tournament.py,
launch/skill_evolution.py, activation profiles, persona and corpus texts, non-finite text-bank
embeddings and GGUF values. Every check here runs on the validation path only (no model is
built, nothing is compiled), with a valid input beside each bad one."""
import os
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest
from conftest import ROOT, TEST_XLA_FLAGS, load_config_file, load_launcher

from jaxsocial.social import activation, text_bank
from jaxsocial.social.state import SocialParams

IFBENCH = os.path.join(ROOT, "tests", "fixtures", "ifbench_sample.jsonl")


def _console(args, cwd=ROOT):
    """Run a launcher; -> (exit status, stderr lines)."""
    env = dict(os.environ, XLA_FLAGS=TEST_XLA_FLAGS, JAX_PLATFORMS="cpu")
    p = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=120)
    return p.returncode, p.stderr.strip().splitlines()


# ---------------------------------------------------------------------------------- eval.py
def _eval_flags(checkpoint, **kw):
    base = dict(checkpoint=checkpoint, baseline=None, tasks=["humaneval"], data_dir=None,
                output=None, limit=2, batch_size=2, max_gen_toks=None, dtype="float32", seed=0,
                apply_chat_template=False, sandbox_timeout=5.0, sandbox_memory_mb=512,
                judge=None, alpaca_file=None, alpaca_reference="file", alpaca_max_gen_toks=8,
                alpaca_difficulty=None)
    return types.SimpleNamespace(**{**base, **kw})


def _hf_dir(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")  # the check reads the listing, not the config
    return str(path)


@pytest.mark.parametrize("limit", [0, -1])
def test_eval_refuses_a_limit_below_one(tmp_path, limit):
    launch = load_launcher("launch/eval.py")
    ckpt = _hf_dir(tmp_path / "ck")
    with pytest.raises(ValueError, match=rf"^--limit={limit} must be an integer >= 1"):
        launch.check_inputs(_eval_flags(ckpt, limit=limit))
    for ok in (1, None):  # control: the same check passes a real limit, or none
        launch.check_inputs(_eval_flags(ckpt, limit=ok))


def test_eval_refuses_an_export_without_config_json(tmp_path):
    launch = load_launcher("launch/eval.py")
    export = tmp_path / "run" / "export"
    export.mkdir(parents=True)
    (export / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"--checkpoint=.*export: no config\.json"):
        launch.check_inputs(_eval_flags(str(export)))
    with pytest.raises(ValueError, match=r"--baseline=.*export: no config\.json"):
        launch.check_inputs(_eval_flags(_hf_dir(tmp_path / "ok"), baseline=str(export)))
    with pytest.raises(ValueError, match=r"--checkpoint=.*missing: no such directory"):
        launch.check_inputs(_eval_flags(str(tmp_path / "missing")))
    (export / "config.json").write_text("{}")  # control: now it is a checkpoint directory
    launch.check_inputs(_eval_flags(str(export)))


def test_eval_console_is_one_line_and_exit_1(tmp_path):
    ckpt = _hf_dir(tmp_path / "ck")
    out = tmp_path / "out" / "r.json"
    rc, err = _console(["launch/eval.py", f"--checkpoint={ckpt}", "--limit=0",
                        f"--output={out}"])
    assert rc == 1 and err == ["error: --limit=0 must be an integer >= 1; leave it unset to "
                               "evaluate every example"], err
    assert not (tmp_path / "out").exists()


def test_a_failed_eval_leaves_no_directories_it_made(tmp_path, monkeypatch):
    launch = load_launcher("launch/eval.py")

    def fails(flags_, out_dir):  # e.g. "nothing to evaluate" once the task files are written
        os.makedirs(out_dir)
        open(os.path.join(out_dir, "mbpp.yaml"), "w").close()
        raise ValueError("nothing to evaluate")

    monkeypatch.setattr(launch, "_evaluate", fails)
    ckpt = _hf_dir(tmp_path / "run" / "export")
    with pytest.raises(ValueError, match="nothing to evaluate"):
        launch.evaluate(_eval_flags(ckpt))  # default output: run/eval_export/results.json
    assert sorted(os.listdir(tmp_path / "run")) == ["export"]
    kept = tmp_path / "mine"  # control: a directory that was there before is kept
    kept.mkdir()
    with pytest.raises(ValueError):
        launch.evaluate(_eval_flags(ckpt, output=str(kept / "r.json")))
    assert kept.is_dir() and not (kept / "r_tasks").exists()


# ------------------------------------------------------------------------------ simulate.py
def _sim_config(**society):
    c = load_config_file("configs/million.py", "tiny")
    c.society.update(society)
    return c


@pytest.mark.parametrize("users", [0, 1, 2**31, 2**28])
def test_simulate_refuses_user_counts_outside_the_int32_range(users):
    sim = load_launcher("launch/simulate.py")
    with pytest.raises(ValueError, match=rf"^society\.num_users={users} is out of range: "
                                         r"allowed 2 to 67,108,863"):
        sim.check_config(_sim_config(num_users=users))
    assert sim.check_config(_sim_config(num_users=2)).num_users == 2  # control
    # the bound follows the widest per-user buffer (here 32: max_following, ...)
    assert (2**31 - 1) // 32 == 67_108_863


def test_simulate_refuses_zero_ticks_and_post_id_overflow():
    sim = load_launcher("launch/simulate.py")
    c = _sim_config()
    c.ticks = 0
    with pytest.raises(ValueError, match=r"^ticks=0 must be an integer >= 1"):
        sim.check_config(c)
    c.ticks = 2**31 // c.society.crowd_budget
    with pytest.raises(ValueError, match=r"society\.crowd_budget.*2\*\*31 post ids"):
        sim.check_config(c)
    c.ticks = 4  # control
    sim.check_config(c)


def test_simulate_console_leaves_no_workdir(tmp_path):
    work = tmp_path / "sim"
    rc, err = _console(["launch/simulate.py", "--config=configs/million.py:tiny",
                        f"--config.society.num_users={2**31}", f"--workdir={work}"])
    assert rc == 1 and len(err) == 1 and err[0].startswith(
        f"error: society.num_users={2**31} is out of range: allowed 2 to"), err
    assert not work.exists()


# ---------------------------------------------------------------------------- tournament.py
@pytest.mark.parametrize("key, value, match", [
    ("num_seeds", 0, r"^num_seeds=0 must be an integer >= 1"),
    ("num_seeds", -1, r"^num_seeds=-1 must be an integer >= 1"),
    ("env.num_rounds", 0, r"^env\.num_rounds must be >= 1, got 0"),
    ("env.num_arms", 1, r"^env\.num_arms must be >= 2, got 1"),
    ("llm.num_seeds", 0, r"^llm\.num_seeds=0 must be an integer >= 1"),
    ("llm.num_rounds", -1, r"^llm\.num_rounds=-1 must be an integer >= 0"),
    ("llm.max_pull_tokens", 0, r"^llm\.max_pull_tokens=0 must be an integer >= 1"),
])
def test_tournament_refuses_zero_counts_by_key(tmp_path, key, value, match):
    mod = load_launcher("launch/tournament.py")
    c = load_config_file("configs/social_learning.py", "tiny_llm")
    mod.check_config(c)  # control: the variant as shipped passes
    sub, _, leaf = key.rpartition(".")
    setattr(c[sub] if sub else c, leaf, value)
    with pytest.raises(ValueError, match=match):
        mod.run(c, str(tmp_path / "t"))  # run checks first: nothing compiled, no workdir
    assert not (tmp_path / "t").exists()


# ----------------------------------------------------------------------- skill_evolution.py
@pytest.mark.parametrize("key, value, match", [
    ("num_seeds", 0, r"^num_seeds must be >= 1, got 0"),
    ("env.num_rounds", 0, r"^env\.num_rounds must be an integer >= 1, got 0"),
    ("data.num_train", 0, r"^data\.num_train must be >= 1, got 0"),
    ("data.num_heldout", -1, r"^data\.num_heldout must be >= 0, got -1"),
    ("data.path", "/nonexistent/IFBench.jsonl", r"^data\.path='/nonexistent/IFBench\.jsonl': "
                                                r"no such file"),
    ("llm.checkpoint", "/nonexistent/ckpt", r"^llm\.checkpoint='/nonexistent/ckpt': no such"),
    ("llm.checkpoint", "", r"^llm\.checkpoint is empty"),
])
def test_skill_evolution_refuses_bad_counts_and_missing_files(tmp_path, key, value, match):
    mod = load_launcher("launch/skill_evolution.py")
    c = load_config_file("configs/skill_evolution.py", "smoke")
    c.data.path = IFBENCH
    mod.check_config(c)  # control
    sub, _, leaf = key.rpartition(".")
    setattr(c[sub] if sub else c, leaf, value)
    with pytest.raises(ValueError, match=match):
        mod.run(c, str(tmp_path / "se"))
    assert not (tmp_path / "se").exists()


# ------------------------------------------------------------------------ activation profiles
def _profile_config(tmp_path, rows, active=4):
    c = load_config_file("configs/demo.py", "smoke")
    c.agents.active_per_tick = active
    c.agents.activation.enabled = True
    path = tmp_path / "profile.npy"
    np.save(path, np.asarray(rows, np.float64))
    c.agents.activation.profile_path = str(path)
    return c


@pytest.mark.parametrize("rows, match", [
    (np.zeros((8, 24)), r"every weight is 0"),
    (np.full((8, 24), 1e300), r"weights must be finite in float32 \(agent 0, hour 0 is inf"),
    (np.r_[np.ones((2, 24)), np.zeros((6, 24))],
     r"hour 0 has 2 agents with a positive weight, fewer than agents\.active_per_tick=4"),
])
def test_activation_profiles_that_would_make_zero_weight_agents_act(tmp_path, rows, match):
    c = _profile_config(tmp_path, rows)
    with pytest.raises(ValueError, match=r"^agents\.activation\.profile_path='.*profile\.npy': "
                                         + match):
        activation.check_config(c)
    # control: 1e30 is finite in float32, and 4 agents of weight > 0 suffice for B = 4
    activation.check_config(_profile_config(tmp_path, np.r_[np.full((4, 24), 1e30),
                                                            np.zeros((4, 24))]))


def test_activation_counts_only_the_hours_the_run_reaches(tmp_path):
    c = _profile_config(tmp_path, np.ones((8, 24)))
    hours = activation.hours_of_run(c)
    assert hours == (0, 1, 22, 23)  # demo smoke: 4 ticks from 22:13 on the society's clock
    rows = np.zeros((8, 24))
    rows[:, list(hours)] = 1.0  # only those hours are active
    activation.check_config(_profile_config(tmp_path, rows))
    w = activation.load_profile(c.agents.activation.profile_path, 8)
    with pytest.raises(ValueError, match=r"hour 2 has 0 agents.*every hour of the day"):
        activation.check_profile(rows, active_per_tick=4)  # hours not given: all 24
    assert w.dtype == np.float32


def test_hours_used_matches_the_society_clock_tick_by_tick():
    import jax.numpy as jnp
    for start, spt, ticks, epochs, settle in [(1_700_000_000, 3600, 4, 3, 1), (5, 7, 3, 40, 2),
                                              (0, 1800, 3, 40, 13), (123, 86_400, 8, 5, 0),
                                              (1_700_000_123, 1234, 4, 30, 7)]:
        p = SocialParams(start_seconds=start, seconds_per_tick=spt)
        agent_ticks = [e * (ticks + settle) + t for e in range(epochs) for t in range(ticks)]
        want = sorted({int(activation.hour_of_tick(jnp.int32(t), p)) for t in agent_ticks})
        assert activation.hours_used(start, spt, ticks, epochs, settle) == tuple(want)


# ---------------------------------------------------------------------------- personas, texts
@pytest.mark.parametrize("texts, match", [
    ((), r"^agents\.personas is empty: give at least one persona$"),
    ("You are Ada, a poet.", r"^agents\.personas is a single str, not a sequence"),
    ((b"You are Ada, \xff a poet.",), r"^agents\.personas\[0\] is not UTF-8 text: byte 13 "
                                      r"\(0xff\)"),
    (("You are Ada.", 3), r"^agents\.personas\[1\] is int, not a string"),
    (("You are Ada, \udcff a poet.",), r"^agents\.personas\[0\] holds an undecodable character "
                                       r"at position 13"),
    (("  ",), r"^agents\.personas\[0\] is blank"),
])
def test_persona_texts_are_checked_by_key(texts, match):
    with pytest.raises(ValueError, match=match):
        text_bank.check_texts(texts, "agents.personas", "persona")
    assert text_bank.check_texts(["You are Ada, a poet."], "agents.personas", "persona") == (
        "You are Ada, a poet.",)  # control


def test_text_files_name_the_path_and_byte_offset(tmp_path):
    bad = tmp_path / "personas.txt"
    head = "You are Ada.\nYou are Bo, ".encode()  # 25 bytes, then a Latin-1 "é"
    bad.write_bytes(head + b"\xe9 a poet.\n")
    with pytest.raises(ValueError, match=r"^agents\.personas='.*personas\.txt' is not UTF-8 "
                                         rf"text: byte {len(head)} \(0xe9\)"):
        text_bank.read_lines(str(bad), "agents.personas", "persona")
    corpus = tmp_path / "corpus.json"
    corpus.write_bytes(b'{"topics": []}' + b" " * 9000 + b"\xff")  # past the first read chunk
    with pytest.raises(ValueError, match=r"corpus\.json' is not UTF-8 text: byte 9014 "):
        text_bank.load_corpus(str(corpus))
    good = tmp_path / "good.txt"  # control
    good.write_text("You are Ada.\n\nYou are Bo, é poet.\n", encoding="utf-8")
    assert text_bank.read_lines(str(good), "agents.personas") == ("You are Ada.",
                                                                  "You are Bo, é poet.")


def test_non_finite_embeddings_are_named_as_such():
    tokens, topic = np.zeros((2, 3), np.int32), [0, 1]
    emb = np.eye(2, 4, dtype=np.float32)
    text_bank.make_bank(tokens, emb, topic)  # control: unit norm, finite
    emb[1, 0] = np.nan
    with pytest.raises(ValueError, match=r"^text bank embeddings are non-finite: 1 of 2 rows "
                                         r"hold NaN or inf \(1 NaN\)"):
        text_bank.make_bank(tokens, emb, topic)
    with pytest.raises(ValueError, match="must be unit norm"):
        text_bank.make_bank(tokens, 2 * np.eye(2, 4, dtype=np.float32), topic)


def test_gguf_passes_non_finite_values_on_without_a_cast_warning(tmp_path):
    gguf_lib = pytest.importorskip("gguf")
    from jaxsocial.models import gguf

    path = str(tmp_path / "x.gguf")
    w = gguf_lib.GGUFWriter(path, "llama")
    w.add_tensor("t", np.asarray([[1e300, 1.0]], np.float64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tensor = gguf.open_reader(path).tensors[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would fail here
        out = gguf.dequantize_tensor(path, tensor)
    assert out.dtype == np.float32 and out.shape == (1, 2)
    assert np.isinf(out[0, 0]) and out[0, 1] == 1.0


# ------------------------------------------------------------------ python -m jaxsocial.eval
def test_eval_module_refuses_a_limit_of_zero():
    from jaxsocial.eval import __main__ as cli

    for bad in (["--limit", "0"], ["--limit=-1"], ["--limit", "x"]):
        with pytest.raises(ValueError, match=r"^--limit=\S+ must be a number > 0"):
            cli.check_limit(["--model", "jaxsocial", *bad])
    cli.check_limit(["--limit", "2"])  # control: a count, or a fraction below 1
    cli.check_limit(["--limit=0.5", "--tasks", "x"])
