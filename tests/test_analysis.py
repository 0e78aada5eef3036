"""Run analysis helpers (the notebook's logic)."""
import json

import numpy as np
import pytest

from jaxsocial import analysis


def _write_run(tmp_path):
    recs = [dict(epoch=2, avg_likes_per_post=0.8, zero_like_share=0.4,
                 positive_engagement_share=0.6, total_posts=10, reward_mean=0.8, reward_std=1.0,
                 parse_failures=0, likes_hist=[4, 3, 3]),
            dict(epoch=1, avg_likes_per_post=0.5, zero_like_share=0.5,
                 positive_engagement_share=0.5, total_posts=8, reward_mean=0.5, reward_std=0.7,
                 parse_failures=1, likes_hist=[4, 4])]
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    return str(tmp_path)


def test_load_sort_curves_and_distribution(tmp_path):
    run = analysis.load_run(_write_run(tmp_path))
    c = analysis.curves(run)
    np.testing.assert_array_equal(c["epoch"], [1, 2])  # sorted by epoch
    np.testing.assert_allclose(c["avg_likes_per_post"], [0.5, 0.8])
    d = analysis.likes_distribution(run)
    np.testing.assert_allclose(d, [[0.5, 0.5, 0.0], [0.4, 0.3, 0.3]])
    d1 = analysis.likes_distribution(run, max_likes=1)  # 2+ likes folded into the last column
    np.testing.assert_allclose(d1[1], [0.4, 0.6])
    table = analysis.summary_table(run)
    assert "avg_likes_per_post" in table and "+0.3000" in table


def test_missing_run_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        analysis.load_run(str(tmp_path / "nope"))


def test_resolve_workdir_prefers_where_the_command_ran(tmp_path, monkeypatch):
    here = tmp_path / "shell"
    (here / "runs" / "x").mkdir(parents=True)
    monkeypatch.setenv("PWD", str(here))
    monkeypatch.chdir(tmp_path)  # the kernel's cwd (the notebook's folder) is elsewhere
    # Not there yet: falls back to the repository root, which load_run then names.
    assert analysis.resolve_workdir("runs/x") == f"{analysis.repo_root()}/runs/x"
    _write_run(here / "runs" / "x")
    assert analysis.resolve_workdir("runs/x") == str(here / "runs" / "x")
    monkeypatch.setenv(analysis.WORKDIR_ENV, "runs/x")
    assert analysis.resolve_workdir() == str(here / "runs" / "x")
    assert analysis.resolve_workdir(str(tmp_path / "abs")) == str(tmp_path / "abs")


def test_plot_run_saves_a_png(tmp_path):
    run = analysis.load_run(_write_run(tmp_path))
    analysis.plot_run(run, str(tmp_path / "a.png"))
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cascade_ccdf_from_the_size_histogram(tmp_path):
    recs = [dict(epoch=1, cascades=dict(roots=4, size_hist=[4])),
            dict(epoch=2, cascades=dict(roots=10, size_hist=[5, 3, 0, 2]))]
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    run = analysis.load_run(str(tmp_path))
    sizes, share = analysis.cascade_ccdf(run)
    # 10 posts: 5 of size >= 1, 2 of size >= 3 (size 2 never occurs: no point)
    assert sizes.tolist() == [1, 3] and np.allclose(share, [0.5, 0.2])
    assert analysis.cascade_ccdf(run, epoch=1)[0].size == 0  # nothing spread in epoch 1
    assert analysis.cascade_ccdf({"metrics": [dict(epoch=1)]})[0].size == 0  # older runs
