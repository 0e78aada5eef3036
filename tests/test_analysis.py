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
