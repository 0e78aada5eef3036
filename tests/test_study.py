"""launch/study.py and jaxsocial.study: the statistics against formulas written out here, the
aggregation of synthetic metrics.jsonl files, the launcher (with a stand-in for train.py),
bad input, and one end-to-end study of smoke runs."""
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from browser import page_problems, require_browser
from conftest import ONE_DEVICE_ENV, ROOT, load_launcher
from scipy import stats

from jaxsocial import study

STUDY = os.path.join(ROOT, "launch", "study.py")


@pytest.fixture(scope="module")
def launcher():
    return load_launcher("launch/study.py")


def record(epoch, likes, posts, sim=0.5, nothing=2, answers=32, zero=0.25):
    return {"epoch": epoch, "avg_likes_per_post": likes, "total_posts": posts,
            "zero_like_share": zero, "positive_engagement_share": 1 - zero,
            "crowd_interest_sim": sim, "interactions": answers,
            "action_mix": {"create_post": posts, "do_nothing": nothing,
                           "like_post": answers - posts - nothing}}


def write_jsonl(path, records, tail=""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records) + tail)


# ---------------------------------------------------------------------------- thirds


@pytest.mark.parametrize("epochs,k", [(12, 4), (4, 1), (2, 1), (1, 1), (3, 1), (7, 2)])
def test_third_is_floor_of_a_third_at_least_one(epochs, k):
    assert study.third(epochs) == k


@pytest.mark.parametrize("epochs", [12, 4, 2])
def test_first_and_last_third_means(epochs):
    likes = [float(e) ** 2 for e in range(1, epochs + 1)]
    s = study.run_summary([record(e, x, 10) for e, x in enumerate(likes, 1)])
    k = {12: 4, 4: 1, 2: 1}[epochs]
    first, last = np.mean(likes[:k]), np.mean(likes[-k:])
    # E=12: epochs 1-4 vs 9-12; E=4 and E=2: epoch 1 vs the last epoch.
    expected = {12: (7.5, 111.5), 4: (1.0, 16.0), 2: (1.0, 4.0)}[epochs]
    assert (first, last) == expected
    assert s["third"] == k and s["epochs"] == epochs
    assert s["first"]["avg_likes_per_post"] == pytest.approx(first)
    assert s["last"]["avg_likes_per_post"] == pytest.approx(last)
    assert s["change"]["avg_likes_per_post"] == pytest.approx(last - first)
    assert s["curves"]["avg_likes_per_post"] == likes


def test_epoch_values_total_likes_and_do_nothing_share():
    v = study.epoch_values(record(1, 2.5, 8, nothing=4, answers=32))
    assert v["total_likes"] == 20.0
    assert v["do_nothing_share"] == 4 / 32
    # No posts: no likes (the average may be NaN / null); no action_mix: NaN share.
    v = study.epoch_values({"epoch": 1, "avg_likes_per_post": None, "total_posts": 0})
    assert v["total_likes"] == 0.0 and math.isnan(v["do_nothing_share"])
    # interactions missing: the answers are the action_mix total.
    v = study.epoch_values({"epoch": 1, "action_mix": {"do_nothing": 1, "create_post": 3}})
    assert v["do_nothing_share"] == 0.25


# ---------------------------------------------------------------------- statistics


def test_mean_ci_is_the_t_interval():
    xs = np.array([1.0, 2.5, 4.0, 3.0])
    n = len(xs)
    s = math.sqrt(sum((x - xs.mean()) ** 2 for x in xs) / (n - 1))
    half = stats.t.ppf(0.975, n - 1) * s / math.sqrt(n)
    got = study.mean_ci(xs)
    assert got["mean"] == pytest.approx(2.625) and got["n"] == 4
    assert got["ci"] == pytest.approx(half)
    assert half == pytest.approx(3.182446 * s / 2, rel=1e-6)  # t_{0.975, 3}
    # A normal quantile (1.96) instead of t would be visibly narrower with 4 seeds.
    assert got["ci"] > 1.5 * 1.959964 * s / math.sqrt(n)


def test_mean_ci_of_one_seed_has_no_interval():
    got = study.mean_ci([3.0])
    assert got["mean"] == 3.0 and math.isnan(got["ci"])
    assert study.fmt(got["ci"]) == "n/a"
    assert math.isnan(study.mean_ci([])["mean"])
    assert study.mean_ci([1.0, float("nan"), 3.0])["n"] == 2  # a missing value is dropped


def _welch_by_hand(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    na, nb = len(a), len(b)
    va = sum((x - a.mean()) ** 2 for x in a) / (na - 1) / na
    vb = sum((x - b.mean()) ** 2 for x in b) / (nb - 1) / nb
    se = math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1))
    t = (a.mean() - b.mean()) / se
    return a.mean() - b.mean(), stats.t.ppf(0.975, dof) * se, dof, 2 * stats.t.sf(abs(t), dof)


def _pooled_p_by_hand(a, b):
    """Student's t-test with a pooled variance: the wrong test for unequal variances."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    na, nb = len(a), len(b)
    sp2 = ((na - 1) * a.var(ddof=1) + (nb - 1) * b.var(ddof=1)) / (na + nb - 2)
    t = (a.mean() - b.mean()) / math.sqrt(sp2 * (1 / na + 1 / nb))
    return 2 * stats.t.sf(abs(t), na + nb - 2)


def test_welch_matches_the_formulas_and_not_a_pooled_test():
    a = [0.9, 1.4, 2.8, 0.2, 1.9]      # large variance, 5 seeds
    b = [0.10, 0.12, 0.08]             # small variance, 3 seeds
    diff, half, dof, p = _welch_by_hand(a, b)
    got = study.welch(a, b)
    assert got["diff"] == pytest.approx(diff)
    assert got["dof"] == pytest.approx(dof)
    assert got["ci"] == pytest.approx(half)
    assert got["p"] == pytest.approx(p)
    assert 4 < dof < 4.1  # Welch-Satterthwaite: about n_a - 1 here, not n_a + n_b - 2 = 6
    # Negative control: the pooled-variance test gives a clearly different p, so this test
    # would catch code that pooled the variances.
    pooled = _pooled_p_by_hand(a, b)
    assert abs(pooled - got["p"]) > 0.01
    assert pooled == pytest.approx(stats.ttest_ind(a, b, equal_var=True).pvalue)


def test_welch_is_undefined_with_one_seed_or_no_variance():
    one = study.welch([1.0], [0.0, 0.5])
    assert one["diff"] == 0.75 and all(math.isnan(one[k]) for k in ("ci", "dof", "p"))
    flat = study.welch([1.0, 1.0], [0.0, 0.0])
    assert flat["diff"] == 1.0 and math.isnan(flat["p"])


def test_formatting():
    assert study.fmt(3.14159) == "3.14" and study.fmt(0.0123) == "0.012"
    assert study.fmt(12.34) == "12.3" and study.fmt(1234.5) == "1234"
    assert study.fmt(0.5, signed=True) == "+0.500" and study.fmt(-2.0, True) == "-2.00"
    assert study.fmt(float("nan")) == "n/a" and study.fmt(None) == "n/a"
    assert study.fmt_p(0.0004) == "<0.001" and study.fmt_p(0.04567) == "0.046"


# ----------------------------------------------------------------------- arm specs


def test_parse_arm():
    assert study.parse_arm("zero:reward.non_post_mode=zero") == (
        "zero", [("reward.non_post_mode", "zero")])
    assert study.parse_arm("skip:reward.non_post_mode=skip,rl.kl_per=sequence") == (
        "skip", [("reward.non_post_mode", "skip"), ("rl.kl_per", "sequence")])
    # A comma inside a value (a tuple) does not start a new override.
    assert study.parse_arm("t:crowd_text.topics=('cooking', 'travel'),rl.learning_rate=1e-4") == (
        "t", [("crowd_text.topics", "('cooking', 'travel')"), ("rl.learning_rate", "1e-4")])
    assert study.parse_arm("base:") == ("base", [])


@pytest.mark.parametrize("spec", ["noarm", ":rl.learning_rate=0", "a b:rl.learning_rate=0",
                                  "a:rl.learning_rate", "a:=1", "a:1x=2"])
def test_parse_arm_refuses_malformed_specs(spec):
    with pytest.raises(ValueError, match=r"expected NAME:key=value"):
        study.parse_arm(spec)


# -------------------------------------------------------------- aggregation, table

# Three epochs per run (thirds of one epoch: first = epoch 1, last = epoch 3).
# trained: likes/post 1 -> 3 (seed 0) and 1 -> 4 (seed 1); posts 10 -> 9 and 10 -> 10;
# crowd sim +0.2 and +0.4. control: likes/post 2 -> 2 and 2 -> 2.5; posts 10 -> 10;
# crowd sim +0.0 and +0.1.
SYNTHETIC = {
    "trained": {0: [(1.0, 10, 0.1), (2.0, 10, 0.2), (3.0, 9, 0.3)],
                1: [(1.0, 10, 0.1), (2.5, 10, 0.3), (4.0, 10, 0.5)]},
    "control": {0: [(2.0, 10, 0.2), (2.0, 10, 0.2), (2.0, 10, 0.2)],
                1: [(2.0, 10, 0.2), (2.2, 10, 0.2), (2.5, 10, 0.3)]},
}


def _write_synthetic(root):
    for arm, by_seed in SYNTHETIC.items():
        for seed, rows in by_seed.items():
            write_jsonl(os.path.join(root, f"{arm}-seed{seed}", "metrics.jsonl"),
                        [record(e, likes, posts, sim) for e, (likes, posts, sim)
                         in enumerate(rows, 1)])


def test_aggregation_of_synthetic_runs(tmp_path):
    _write_synthetic(tmp_path)
    runs = {arm: {s: study.read_metrics(str(tmp_path / f"{arm}-seed{s}" / "metrics.jsonl"))
                  for s in by_seed} for arm, by_seed in SYNTHETIC.items()}
    result = study.analyze(runs)
    assert result["control"] == "control" and list(result["comparisons"]) == ["trained"]
    t = result["stats"]["trained"]["avg_likes_per_post"]
    t975_1 = stats.t.ppf(0.975, 1)  # 12.706: two seeds
    assert t["first"]["mean"] == 1.0 and t["last"]["mean"] == 3.5
    assert t["change"]["mean"] == 2.5
    assert t["change"]["ci"] == pytest.approx(t975_1 * np.std([2.0, 3.0], ddof=1) / math.sqrt(2))
    c = result["comparisons"]["trained"]["avg_likes_per_post"]
    assert c["diff"] == pytest.approx(2.5 - 0.25)
    assert c["p"] == pytest.approx(stats.ttest_ind([2.0, 3.0], [0.0, 0.5],
                                                   equal_var=False).pvalue)
    tl = result["stats"]["trained"]["total_likes"]  # likes/post x posts: 10 -> 27, 10 -> 40
    assert (tl["first"]["mean"], tl["last"]["mean"]) == (10.0, 33.5)
    dn = result["stats"]["trained"]["do_nothing_share"]
    assert dn["first"]["mean"] == pytest.approx(2 / 32) and dn["change"]["mean"] == 0
    verdicts = {v["name"]: v for v in result["criteria"]["trained"]}
    assert verdicts["likes_per_post_up"] == dict(verdicts["likes_per_post_up"], ok=True,
                                                 seeds_ok=2, seeds=2)
    assert verdicts["posts_kept"]["ok"] and verdicts["posts_kept"]["seeds_ok"] == 2
    assert verdicts["crowd_sim_beats_control"]["ok"]
    assert verdicts["crowd_sim_beats_control"]["seeds_ok"] == 2  # 0.2 > 0.0, 0.4 > 0.1
    ctrl = {v["name"]: v for v in result["criteria"]["control"]}
    assert ctrl["likes_per_post_up"]["ok"] and ctrl["likes_per_post_up"]["seeds_ok"] == 1
    assert ctrl["crowd_sim_beats_control"]["ok"] is None

    text = study.markdown(result, "python launch/study.py --seeds=2")
    lines = text.splitlines()
    assert lines[0] == ("| metric | trained: first -> last (change ± CI) | control: first -> "
                        "last (change ± CI) | trained - control (± CI) | p (trained) |")
    half = t975_1 * np.std([2.0, 3.0], ddof=1) / math.sqrt(2)            # 8.98
    chalf = t975_1 * np.std([0.0, 0.5], ddof=1) / math.sqrt(2)           # 4.49
    wdiff, whalf, _, wp = _welch_by_hand([2.0, 3.0], [0.0, 0.5])
    assert lines[2] == (f"| likes/post | 1.00 -> 3.50 (+2.50 ± {half:.2f}) | 2.00 -> 2.25 "
                        f"(+0.250 ± {chalf:.2f}) | +2.25 ± {whalf:.2f} | {wp:.3f} |")
    assert "| posts | 10.0 -> 9.50 (-0.500 ± " in text
    assert "- **trained**: likes/post up: yes (2/2 seeds); total likes up: yes (2/2 seeds); " \
           "posts in the last third >= 80% of the first's: yes (2/2 seeds); " \
           "crowd_interest_sim up more than in control: yes (2/2 seeds)" in lines
    control_line = [line for line in lines if line.startswith("- **control**: ")]
    assert control_line[0].endswith("crowd_interest_sim up more than in control: n/a")
    assert "2 seed(s) per arm (0, 1), 3 epochs; first/last = mean over the first/last 1 " \
           "epoch(s)" in text
    assert text.endswith("```\npython launch/study.py --seeds=2\n```\n")


def test_one_seed_reports_no_interval_and_no_p(tmp_path):
    runs = {"trained": {0: [record(1, 1.0, 10), record(2, 2.0, 10)]},
            "control": {0: [record(1, 1.0, 10), record(2, 1.0, 10)]}}
    text = study.markdown(study.analyze(runs))
    assert "| likes/post | 1.00 -> 2.00 (+1.00 ± n/a) | 1.00 -> 1.00 (+0.000 ± n/a) | " \
           "+1.00 ± n/a | n/a |" in text


def test_read_metrics_drops_a_torn_last_line_and_keeps_a_repeated_epochs_last(tmp_path):
    path = str(tmp_path / "metrics.jsonl")
    write_jsonl(path, [record(1, 1.0, 5), record(2, 9.0, 5), record(2, 2.0, 5)],
                tail='{"epoch": 3, "avg_li')
    got = study.read_metrics(path)
    assert [r["epoch"] for r in got] == [1, 2] and got[1]["avg_likes_per_post"] == 2.0
    assert study.read_metrics(str(tmp_path / "missing.jsonl")) == []


def test_write_outputs_of_synthetic_runs(launcher, tmp_path, capsys):
    """The launcher's last step on finished runs: study.json / md / png."""
    from ml_collections import ConfigDict
    _write_synthetic(tmp_path)
    arms = {"trained": [], "control": [("rl.learning_rate", "0")]}
    runs = [launcher.Run(arm, seed, str(tmp_path / f"{arm}-seed{seed}"), ["--x"],
                         ConfigDict({"train": {"epochs": 3}}))
            for seed in (0, 1) for arm in arms]
    launcher.write_outputs(str(tmp_path), arms, runs, ["--config.train.epochs=3"],
                           "configs/demo.py:smoke", print)
    out = capsys.readouterr().out
    assert "| likes/post | 1.00 -> 3.50" in out and "wrote " in out
    with open(tmp_path / "study.json") as f:
        data = json.load(f)
    assert data["config"] == "configs/demo.py:smoke"
    assert data["overrides"] == ["--config.train.epochs=3"]
    assert data["arms"] == {"trained": [], "control": ["rl.learning_rate=0"]}
    assert data["seeds"] == [0, 1] and sorted(data["runs"]) == ["control", "trained"]
    run = data["runs"]["trained"]["1"]
    assert run["first"]["avg_likes_per_post"] == 1.0 and run["last"]["total_posts"] == 10
    assert run["train_command"] == "python launch/train.py --x"
    assert run["epochs_s"] is None  # the synthetic metrics carry no wall_s
    assert launcher._epoch_seconds([{"wall_s": 60.0}, {"wall_s": 61.25}]) == 121.2
    assert launcher._epoch_seconds([{"wall_s": 60.0}, {}]) is None
    assert set(data["git"]) == {"commit", "dirty"} and data["date"]
    assert data["comparisons"]["trained"]["avg_likes_per_post"]["diff"] == pytest.approx(2.25)
    assert os.path.exists(tmp_path / "study.md")
    # --record: the same record as a benchmark result, with the command, commit, date and
    # machine beside it; a name that is no file name is refused.
    rec = launcher.write_outputs(str(tmp_path), arms, runs, [], "configs/demo.py:smoke", print)
    path = launcher.record_result("demo_study", rec, argv=["launch/study.py", "--seeds=2"],
                                  directory=str(tmp_path / "results"))
    assert os.path.basename(path).startswith("demo_study-") and path.endswith("Z.json")
    with open(path) as f:
        result = json.load(f)
    assert result["benchmark"] == "demo_study"
    assert result["command"] == "python launch/study.py --seeds=2"
    assert result["machine"]["cores"] >= 1 and result["date"].endswith("Z")
    assert result["figures"]["comparisons"] == data["comparisons"]
    with pytest.raises(ValueError, match="--record='a/b'"):
        launcher.record_result("a/b", rec, directory=str(tmp_path / "results"))
    pytest.importorskip("matplotlib")
    assert os.path.getsize(tmp_path / "study.png") > 1000


# ---------------------------------------------------------- command line, launcher


def test_split_overrides(launcher):
    rest, over = launcher.split_overrides(
        ["study.py", "--config=configs/demo.py:smoke", "--config.train.epochs=6", "--seeds=2",
         "--config.rl.learning_rate", "1e-4", "--config.train.fused_epoch",
         "--noconfig.train.export_hf", "--control"])
    assert rest == ["study.py", "--config=configs/demo.py:smoke", "--seeds=2", "--control"]
    assert over == ["--config.train.epochs=6", "--config.rl.learning_rate=1e-4",
                    "--config.train.fused_epoch", "--noconfig.train.export_hf"]
    assert [launcher.override_key(o) for o in over] == [
        "train.epochs", "rl.learning_rate", "train.fused_epoch", "train.export_hf"]


def _inputs(launcher, tmp_path, config="configs/demo.py:smoke", overrides=(), arms=(),
            control=True, seeds=2, seed_start=0, parallel=2):
    cwd = os.getcwd()
    os.chdir(ROOT)  # config paths are relative to the repository, as in the docs
    try:
        return launcher.check_inputs(config, list(overrides), list(arms), control, seeds,
                                     seed_start, parallel, str(tmp_path / "w"))
    finally:
        os.chdir(cwd)


def test_plan_of_a_study(launcher, tmp_path):
    arms, runs = _inputs(launcher, tmp_path, overrides=["--config.train.epochs=3",
                                                        "--config.rl.kl_coef=0.2"],
                         arms=["zero:reward.non_post_mode=constant,rl.kl_coef=0.5",
                               "skip:reward.non_post_mode=skip,rl.kl_per=sequence"],
                         seed_start=4)
    assert list(arms) == ["zero", "skip", "control"]
    assert [r.name for r in runs] == ["zero-seed4", "skip-seed4", "control-seed4",
                                      "zero-seed5", "skip-seed5", "control-seed5"]
    zero, skip, control = runs[:3]
    assert zero.argv == ["--config=configs/demo.py:smoke",
                         f"--workdir={tmp_path / 'w' / 'zero-seed4'}",
                         "--config.train.epochs=3", "--config.reward.non_post_mode=constant",
                         "--config.rl.kl_coef=0.5", "--config.seed=4", "--noprogress"]
    assert zero.config.rl.kl_coef == 0.5 and skip.config.rl.kl_coef == 0.2  # the arm wins
    assert skip.config.rl.kl_per == "sequence" and skip.config.reward.non_post_mode == "skip"
    assert control.config.rl.learning_rate == 0
    assert zero.config.rl.learning_rate == 1e-3 and runs[4].config.seed == 5
    assert all(r.epochs == 3 for r in runs) and zero.log == zero.workdir + ".log"
    assert not os.path.exists(tmp_path / "w")  # planning writes nothing


def test_plan_without_arms_is_trained_and_control(launcher, tmp_path):
    arms, runs = _inputs(launcher, tmp_path, seeds=1)
    assert arms == {"trained": [], "control": [("rl.learning_rate", "0")]}
    assert [r.name for r in runs] == ["trained-seed0", "control-seed0"]


BAD_INPUT = [
    (dict(seeds=0), "--seeds=0 must be >= 1"),
    (dict(parallel=0), "--parallel=0 must be >= 1"),
    (dict(seed_start=-1), "--seed_start=-1 must be >= 0"),
    (dict(arms=["zero"]), "--arm='zero': expected NAME:key=value[,key=value...]"),
    (dict(arms=["zero:rl.learning_rate"]),
     "--arm='zero:rl.learning_rate': expected NAME:key=value"),
    (dict(arms=["a:rl.learning_rate=1e-4", "a:rl.learning_rate=1e-5"]),
     "--arm='a:rl.learning_rate=1e-5': arm 'a' is given twice"),
    (dict(arms=["control:rl.learning_rate=0"]),
     "--arm='control:rl.learning_rate=0': the arm name 'control' is taken by --control"),
    (dict(config="configs/nope.py"), "--config=configs/nope.py: no such config file"),
    (dict(config="configs/demo.py:bogus"), "--config=configs/demo.py:bogus: ValueError: "
     "unknown demo variant 'bogus'"),
    (dict(overrides=["--config.reward.bogus=1"]), "--config.reward.bogus=1: 'bogus' is not a "
     "key of this config"),
    (dict(arms=["z:reward.bogus=1"]), "arm z: --config.reward.bogus=1: 'bogus' is not a key"),
    (dict(arms=["z:reward.non_post_mode=nope"]), "arm z: invalid config: "
     "reward.non_post_mode='nope'"),
    (dict(overrides=["--config.seed=3"]), "--config.seed: the study sets seed itself"),
    (dict(arms=["a:seed=3"]), "--arm='a:seed=3': seed is set by the study"),
]


@pytest.mark.parametrize("kwargs,message", BAD_INPUT, ids=[m[:24] for _, m in BAD_INPUT])
def test_bad_input_is_one_line(launcher, tmp_path, kwargs, message):
    with pytest.raises(ValueError) as e:
        _inputs(launcher, tmp_path, **kwargs)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "w")


@pytest.mark.parametrize("args,message", [
    (["--seeds=0"], "error: --seeds=0 must be >= 1"),
    (["--config=configs/nope.py"], "error: --config=configs/nope.py: no such config file"),
    (["--record=../x"], "error: --record='../x': letters, digits, '_' and '.' only"),
])
def test_bad_input_on_the_command_line(tmp_path, args, message):
    """The console contract: one `error:` line, exit status 1, nothing written."""
    cmd = [sys.executable, STUDY, "--config=configs/demo.py:smoke", "--control",
           f"--workdir={tmp_path / 'w'}", *args]
    p = subprocess.run(cmd, cwd=ROOT, env=ONE_DEVICE_ENV, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 1, p.stderr
    assert p.stderr.strip().splitlines() == [message] and p.stdout == ""
    assert not os.path.exists(tmp_path / "w")


FAKE_TRAIN = """
import os, sys, time
wd = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--workdir=")][0]
with open(os.path.join(os.path.dirname(wd), "times.txt"), "a") as f:
    f.write(f"start {time.time()}\\n")
time.sleep(0.6)
with open(os.path.join(os.path.dirname(wd), "times.txt"), "a") as f:
    f.write(f"end {time.time()}\\n")
if "bad" in wd:
    print("error: boom (full log: x)")
    sys.exit(1)
"""


def test_launcher_runs_at_most_parallel_and_names_the_failed_log(launcher, tmp_path,
                                                                 monkeypatch):
    fake = tmp_path / "fake_train.py"
    fake.write_text(FAKE_TRAIN)
    monkeypatch.setattr(launcher, "TRAIN", str(fake))
    from ml_collections import ConfigDict
    cfg = ConfigDict({"train": {"epochs": 1}})
    runs = [launcher.Run(arm, s, str(tmp_path / f"{arm}-seed{s}"),
                         [f"--workdir={tmp_path / f'{arm}-seed{s}'}"], cfg)
            for s in range(2) for arm in ("good", "bad")]
    lines = []
    out = type("Out", (), {"write": lambda self, t: lines.append(t), "flush": lambda self: 0})()
    rcs = launcher.Launcher(parallel=2, out=out).run(runs)
    assert rcs == {"good-seed0": 0, "bad-seed0": 1, "good-seed1": 0, "bad-seed1": 1}
    events = sorted((float(t), kind) for kind, t in
                    (line.split() for line in (tmp_path / "times.txt").read_text().split("\n")
                     if line))
    live = peak = 0
    for _, kind in events:
        live += 1 if kind == "start" else -1
        peak = max(peak, live)
    assert peak == 2
    said = []
    # The good runs wrote no metrics: they are incomplete, the bad ones failed.
    assert launcher.report_problems(runs, rcs, said.append) == 4
    assert (f"failed: bad-seed0 (exit 1): error: boom (full log: x) "
            f"(log: {tmp_path / 'bad-seed0'}.log)") in said
    assert (f"failed: good-seed1 (not all 1 epochs in metrics.jsonl) "
            f"(log: {tmp_path / 'good-seed1'}.log)") in said


FAKE_TRAIN_UNTIL_STOPPED = """
import os, signal, sys, time
wd = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--workdir=")][0]
def stop(signum, frame):
    open(wd + ".stopped", "w").write(signal.Signals(signum).name)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(wd + ".started", "w").close()
time.sleep(60)
"""


def test_a_stop_signal_is_passed_on_and_nothing_new_starts(launcher, tmp_path, monkeypatch):
    import signal
    import threading
    fake = tmp_path / "fake_train.py"
    fake.write_text(FAKE_TRAIN_UNTIL_STOPPED)
    monkeypatch.setattr(launcher, "TRAIN", str(fake))
    runs = [launcher.Run("a", s, str(tmp_path / f"a-seed{s}"),
                         [f"--workdir={tmp_path / f'a-seed{s}'}"], None) for s in range(3)]

    def stop_when_both_started():
        deadline = time.time() + 60
        while time.time() < deadline and not all(
                os.path.exists(f"{r.workdir}.started") for r in runs[:2]):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_when_both_started, daemon=True).start()
    out = type("Out", (), {"write": lambda self, t: None, "flush": lambda self: 0})()
    t0 = time.time()
    worker = launcher.Launcher(parallel=2, out=out)
    rcs = worker.run(runs)
    assert worker.stopped == "SIGTERM" and time.time() - t0 < 50
    assert rcs == {"a-seed0": 0, "a-seed1": 0}  # the third never started
    for r in runs[:2]:
        assert open(f"{r.workdir}.stopped").read() == "SIGTERM"
    assert not os.path.exists(f"{runs[2].workdir}.started")
    assert signal.getsignal(signal.SIGTERM) != worker._on_signal  # handlers restored


# --------------------------------------------------------------------- end to end


def _weights(path):
    from safetensors.numpy import load_file
    out = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, name)))
    assert out, f"no weights in {path}"
    return out


def _same_weights(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_study_of_smoke_runs_end_to_end(tmp_path):
    """1 seed x (trained, control) of demo.py:smoke, 2 epochs each; then the same command
    again skips every finished run. The control's policy stays its initial one. (Seeds reaching
    train.py, and more than one of them, are covered by the plan tests without training.)"""
    work = tmp_path / "study"
    cmd = [sys.executable, STUDY, "--config=configs/demo.py:smoke", "--seeds=1", "--seed_start=1",
           "--control", f"--workdir={work}", "--config.train.epochs=2"]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, env=ONE_DEVICE_ENV, capture_output=True, text=True,
                       timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for name in ("study.json", "study.md", "study.png", "report.html", "trained-seed1.log",
                 "control-seed1.log", "trained-seed1/report.html"):
        assert (work / name).exists(), name
    with open(work / "study.json") as f:
        data = json.load(f)
    assert data["arms"] == {"trained": [], "control": ["rl.learning_rate=0"]}
    assert data["seeds"] == [1] and data["control"] == "control"
    assert {a: sorted(r) for a, r in data["runs"].items()} == {"trained": ["1"],
                                                               "control": ["1"]}
    assert all(r["epochs"] == 2 for by_seed in data["runs"].values() for r in by_seed.values())
    assert "| likes/post | " in (work / "study.md").read_text()
    runs = data["runs"]
    # Epoch 1 is sampled before any update: the same seed gives the control the same first
    # epoch as the trained arm (the seed reaches train.py).
    assert runs["control"]["1"]["curves"]["avg_likes_per_post"][0] == pytest.approx(
        runs["trained"]["1"]["curves"]["avg_likes_per_post"][0])
    assert runs["control"]["1"]["curves"]["total_posts"][0] == \
        runs["trained"]["1"]["curves"]["total_posts"][0]
    with open(work / "control-seed1" / "config.json") as f:
        cfg = json.load(f)
    assert cfg["rl"]["learning_rate"] == 0 and cfg["seed"] == 1
    # Frozen: the final policy is the initial one, weight for weight; the trained arm's is not
    # (so the comparison can tell them apart).
    ctrl, trained = work / "control-seed1", work / "trained-seed1"
    assert _same_weights(_weights(ctrl / "export"), _weights(ctrl / "initial"))
    assert not _same_weights(_weights(trained / "export"), _weights(trained / "initial"))
    first_s = time.time() - t0
    again = subprocess.run(cmd, cwd=ROOT, env=ONE_DEVICE_ENV, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 to run, 2 finished" in again.stdout and "start " not in again.stdout
    print(f"study of 2 smoke runs: {first_s:.0f} s")
    require_browser()
    assert page_problems(str(work / "report.html"), ("curves", "table", "runs")) == []


def test_parse_failures_by_kind_over_epochs():
    """`failures`: each kind's share of the answers per epoch (mean over seeds) and its
    first-third -> last-third change, by hand; constrained runs count none (control)."""
    def rec(no_json, bad, answers=16):
        return {"interactions": answers, "parse_failures": no_json + bad,
                "parse_failures_by_kind": {"no_json": no_json, "unknown_action": 0,
                                           "bad_argument": bad}}
    runs = {"trained": {0: [rec(8, 0), rec(6, 2), rec(4, 4)],
                        1: [rec(4, 0), rec(4, 0), rec(8, 0)]}}
    f = study.failures(runs)["trained"]
    assert f["kinds"] == ["failed", "no_json", "unknown_action", "bad_argument"]
    assert np.allclose(f["curves"]["failed"], [0.375, 0.375, 0.5])
    assert np.allclose(f["curves"]["bad_argument"], [0.0, 1 / 16, 0.125])
    assert np.isclose(f["change"]["failed"]["mean"], (0.0 + 0.25) / 2)  # third = 1 epoch
    assert f["rose"] == {"failed": 1, "no_json": 1, "unknown_action": 0, "bad_argument": 1}
    assert "| 3 | 0.500 | 0.375 | 0.000 | 0.125 |" in study.failures_markdown(
        study.failures(runs))
    plain = {"trained": {0: [{"interactions": 16, "avg_likes_per_post": 1.0}] * 3}}
    assert study.failures(plain) == {} and study.failures_markdown({}) == ""


def _cohort_record(epoch, trained_likes, frozen_likes, posts=4):
    def one(likes):
        return {"avg_likes_per_post": likes / posts, "total_posts": posts, "total_likes": likes,
                "zero_like_share": 0.0, "positive_engagement_share": 1.0,
                "crowd_interest_sim": 0.1, "action_mix": {"create_post": posts}}
    rec = {"epoch": epoch, "cohorts": {"trained": one(trained_likes),
                                       "frozen": one(frozen_likes)}}
    rec["cohorts"]["trained"].update(topic_share={"cooking": 0.75, "books": 0.25},
                                     drift={"mean_post_words": 7.0 + epoch})
    rec["cohorts"]["frozen"].update(topic_share={"cooking": 0.25, "tech": 0.75})
    return rec


def test_cohort_runs_make_each_cohort_a_column_with_its_share_of_the_likes():
    runs = {"trained": {s: [_cohort_record(e, 10 + 5 * e + s, 10) for e in range(1, 7)]
                        for s in range(3)}}
    by_cohort = study.cohort_runs(runs)
    assert set(by_cohort) == {"trained", "frozen"} and set(by_cohort["trained"]) == {0, 1, 2}
    share = [r["likes_share"] for r in by_cohort["trained"][0]]
    np.testing.assert_allclose(share, [(15 + 5 * i) / (25 + 5 * i) for i in range(6)])
    res = study.analyze(by_cohort, control="frozen", metrics=study.COHORT_METRICS,
                        pair_seeds=True)
    assert res["control"] == "frozen" and "trained" in res["comparisons"]
    # paired by seed: the difference of each seed's changes, its t interval and paired p
    d = [by - bf for by, bf in zip(
        [res["runs"]["trained"][s]["change"]["likes_share"] for s in range(3)],
        [res["runs"]["frozen"][s]["change"]["likes_share"] for s in range(3)])]
    cmp = res["comparisons"]["trained"]["likes_share"]
    np.testing.assert_allclose(cmp["diff"], np.mean(d))
    np.testing.assert_allclose(cmp["p"], stats.ttest_rel(
        [res["runs"]["trained"][s]["change"]["likes_share"] for s in range(3)],
        [res["runs"]["frozen"][s]["change"]["likes_share"] for s in range(3)]).pvalue)
    welch = study.welch(*[[res["runs"][a][s]["change"]["likes_share"] for s in range(3)]
                          for a in ("trained", "frozen")])
    assert not np.isclose(welch["p"], cmp["p"])  # control: not the unpaired test
    assert res["stats"]["trained"]["likes_share"]["change"]["mean"] > 0
    assert res["stats"]["frozen"]["total_likes"]["change"]["mean"] == 0
    assert "| share of likes |" in study.markdown(res)
    # topic distance: TV between the cohorts' topic shares; words per post from the drift
    rec = by_cohort["trained"][0][0]
    np.testing.assert_allclose(rec["topic_distance"], 0.5 * (0.5 + 0.25 + 0.75))
    assert rec["topic_distance"] == by_cohort["frozen"][0][0]["topic_distance"]
    assert rec["post_words"] == 8.0 and math.isnan(by_cohort["frozen"][0][0]["post_words"])
    # several arms: "arm/cohort" columns; a run without cohorts is refused by name
    two = study.cohort_runs({"a": runs["trained"], "b": runs["trained"]})
    assert set(two) == {"a/trained", "a/frozen", "b/trained", "b/frozen"}
    with pytest.raises(ValueError, match="no per-cohort metrics"):
        study.cohort_runs({"x": {0: [record(1, 10, 4)]}})


def test_write_outputs_of_a_cohort_study(launcher, tmp_path, capsys):
    """--cohorts: the cohorts are the columns, the config's first frozen cohort the control."""
    from ml_collections import ConfigDict
    for seed in (0, 1):
        write_jsonl(os.path.join(tmp_path, f"trained-seed{seed}", "metrics.jsonl"),
                    [_cohort_record(e, 10 + 5 * e + seed, 10) for e in range(1, 4)])
    arms = {"trained": []}
    runs = [launcher.Run("trained", seed, str(tmp_path / f"trained-seed{seed}"), ["--x"],
                         ConfigDict({"train": {"epochs": 3}})) for seed in (0, 1)]
    launcher.write_outputs(str(tmp_path), arms, runs, [], "configs/cohorts.py:control", print,
                           cohorts=True)
    out = capsys.readouterr().out
    assert "trained - frozen" in out and "| share of likes |" in out
    with open(tmp_path / "study.json") as f:
        data = json.load(f)
    assert data["control"] == "frozen" and set(data["runs"]) == {"trained", "frozen"}
    assert data["runs"]["frozen"]["1"]["workdir"].endswith("trained-seed1")
