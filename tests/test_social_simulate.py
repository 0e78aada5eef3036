"""launch/simulate.py end to end on the tiny variant of configs/million.py."""
import importlib.util
import json
import os

import pytest
from conftest import load_launcher

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def sim():
    return load_launcher("launch/simulate.py")  # defines absl flags: load once


def test_simulate_tiny_writes_metrics_and_summary(tmp_path, sim):
    cfg = _load("million_cfg", "configs/million.py")
    config = cfg.get_config("tiny")
    summary = sim.run(config, str(tmp_path), progress=False)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == config.ticks
    records = [json.loads(x) for x in lines]
    assert [r["tick"] for r in records] == list(range(config.ticks))
    for r in records:
        for key in ("posts_created", "avg_likes_per_post", "zero_like_share",
                    "positive_engagement_share", "likes_gini", "followers_gini",
                    "action_mix", "crowd_invalid", "seconds"):
            assert key in r
        assert 0.0 <= r["zero_like_share"] <= 1.0 and 0.0 <= r["likes_gini"] <= 1.0
        assert r["active_crowd"] > 0 and r["action_counts"].get("like_post", 0) > 0
    # totals in the summary are the sums of the per-tick action counts
    assert summary["total_actions"]["like_post"] == sum(
        r["action_counts"].get("like_post", 0) for r in records)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["ticks"] == config.ticks and on_disk["final"] == records[-1]
    assert on_disk["config"]["society"]["num_users"] == 600


def test_config_variants(sim):
    cfg = _load("million_cfg2", "configs/million.py")
    assert cfg.get_config().society.num_users == 1_000_000
    assert cfg.get_config("small").society.num_users == 10_000
    with pytest.raises(ValueError, match="huge"):
        cfg.get_config("huge")
    with pytest.raises(ValueError, match="workdir"):
        sim.run(cfg.get_config("tiny"), "")
