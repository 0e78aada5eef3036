"""report.html (jaxsocial.train.report_page, launch/report.py): a run's and a study's page from
their files, drawn by headless Chromium with no error and no request leaving the machine, each
check with a broken page it rejects; the study's bands against scipy's t-interval; the feed's
search box and sorting in the browser. The pages of real runs are checked where those runs are
made (tests/test_cohorts.py, tests/test_study.py)."""
import json
import os

import numpy as np
import pytest
from browser import launched, opened, page_problems, require_browser
from conftest import load_launcher
from scipy import stats

from jaxsocial.train import report_page

RUN_SECTIONS = ("numbers", "drift", "feed", "actions", "cohorts", "cascades")
HOSTILE = "<script>document.title='owned'</script></table>"


def _record(epoch):
    cohort = {"avg_likes_per_post": 1.0 + epoch, "zero_like_share": 0.2, "total_posts": 4,
              "total_likes": 4 * (1 + epoch), "positive_engagement_share": 0.5,
              "crowd_interest_sim": 0.1 * epoch}
    return {
        "epoch": epoch, "avg_likes_per_post": 1.5 * epoch, "zero_like_share": 0.5 / epoch,
        "positive_engagement_share": 0.4, "total_posts": 8, "crowd_interest_sim": 0.2,
        "persona_sim": 0.3, "reward_mean": 1.0, "parse_failures": epoch, "invalid_actions": 1,
        "parse_failures_by_kind": {"no_json": epoch, "unknown_action": 0, "bad_argument": 0},
        "action_mix": {"create_post": 8, "like_post": 5 + epoch, "do_nothing": 3},
        "reward_box": {"min": 0.0, "q1": 0.5, "median": 1.0, "q3": 1.5, "max": 4.0},
        "likes_hist": [2, 3, 1, 2], "drift": {"mean_post_words": 7.0, "distinct_2": 0.8},
        "ppo": {"loss": 0.1, "approx_kl": 0.01, "entropy": 2.0, "grad_norm": 1.0},
        "cohorts": {"likes": dict(cohort, likes_given={"likes": 3, "comments": 1, "crowd": 2}),
                    "comments": dict(cohort, likes_given={"likes": 0, "comments": 2,
                                                          "crowd": epoch})},
        "cascades": {"roots": 6, "size_hist": [3, 2, 1]},
        "cascade_trees": [{"root": 5, "size": 2, "text": HOSTILE, "nodes": [
            {"id": 5, "parent": -1, "author": 1, "kind": "post", "created_at": 0},
            {"id": 9, "parent": 5, "author": 2, "kind": "repost", "created_at": 1},
            {"id": 11, "parent": 9, "author": 3, "kind": "quote", "created_at": 2}]}],
        "polarisation": {"homophily": 0.3, "modularity": 0.1, "exposure_diversity": 0.5},
    }


@pytest.fixture
def run_dir(tmp_path):
    """A run directory of three epochs with cohorts, cascades and a feed (hostile text too)."""
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(_record(e)) + "\n" for e in (1, 2, 3))
    posts = [{"tick": t, "agent": t % 4, "persona": f"persona {t % 4}", "cohort": "likes",
              "text": f"post number {t}", "likes": (7 * t) % 5, "reposts": 0, "comments": 1}
             for t in range(12)] + [{"tick": 12, "agent": 0, "persona": "p", "cohort": "likes",
                                     "text": HOSTILE, "likes": 9, "reposts": 1, "comments": 0}]
    with open(tmp_path / "feed.jsonl", "w") as f:
        f.writelines(json.dumps({"epoch": e, "posts": posts}) + "\n" for e in (1, 2, 3))
    return tmp_path


def test_band_is_the_t_interval_over_seeds_per_epoch():
    rng = np.random.default_rng(0)
    curves = rng.normal(size=(4, 5))
    curves[3, 3:] = np.nan  # a run with 3 epochs only
    mean, lo, hi = report_page.band(curves)
    for e in range(5):
        x = curves[:, e][np.isfinite(curves[:, e])]
        a, b = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
        assert mean[e] == pytest.approx(x.mean()) and (lo[e], hi[e]) == pytest.approx((a, b))
    one = report_page.band(curves[:1])  # one seed: the mean, no band
    assert np.allclose(one[0], curves[0]) and np.isnan(one[1]).all() and np.isnan(one[2]).all()


def test_run_page_draws_every_section_offline_searches_and_a_broken_page_is_caught(
        run_dir):
    require_browser()
    path = report_page.write(str(run_dir))
    assert path == str(run_dir / "report.html")
    text = open(path, encoding="utf-8").read()
    assert "post number 11" in text and "&lt;script&gt;document.title" in text  # escaped
    # Negative controls: each broken page is rejected, for its own reason.
    broken = {
        "uncaught": text.replace("Plotly.newPlot(", "Plotly.newPlott(", 1),
        "charts did not render": text.replace("Plotly.newPlot(", "(function(){})(", 1),
        "request: http": text.replace("<body>", "<body><img src='http://example.invalid/x.png'>"),
        "console error": text.replace("<body>", "<body><script>console.error('x')</script>"),
        "no section #cohorts": text.replace("id='cohorts'", "id='elsewhere'"),
    }
    with launched() as browser:
        assert page_problems(path, RUN_SECTIONS, browser) == []
        with opened(path, browser) as (page, problems):  # the feed's search box and sorting
            rows = "#feed-last tbody tr"
            assert page.locator(rows).count() == 13
            page.fill("input[data-table='feed-last']", "number 1")  # 1, 10, 11
            assert page.locator(rows + ":visible").count() == 3
            page.fill("input[data-table='feed-last']", "")
            likes = "els => els.map(e => +e.cells[0].textContent)"
            assert page.eval_on_selector_all(rows, likes)[0] == 9  # most liked first
            page.click("#feed-last th:has-text('likes')")  # ascending
            got = page.eval_on_selector_all(rows, likes)
            assert got == sorted(got) and got[0] < got[-1]
            page.click("#feed-last th:has-text('likes')")  # descending again
            got = page.eval_on_selector_all(rows, likes)
            assert got == sorted(got, reverse=True)
            assert problems == []
        for reason, page_text in broken.items():
            bad = run_dir / f"broken-{len(reason)}.html"
            bad.write_text(page_text, encoding="utf-8")
            problems = page_problems(str(bad), RUN_SECTIONS, browser)
            assert any(reason in p for p in problems), (reason, problems)


def test_study_page_and_the_command_line(tmp_path, run_dir, capsys):
    require_browser()
    seeds = {"0": [1.0, 2.0, 3.0], "1": [2.0, 2.5, 5.0]}
    study = {"level": 0.95, "metrics": ["avg_likes_per_post"], "runs": {
        arm: {s: {"curves": {"avg_likes_per_post": [v * k for v in c]},
                  "workdir": str(run_dir) if (arm, s) == ("trained", "0") else None}
              for s, c in seeds.items()} for arm, k in (("trained", 1.0), ("control", 0.5))}}
    work = tmp_path / "study"
    work.mkdir()
    (work / "study.json").write_text(json.dumps(study))
    (work / "study.md").write_text("# Study\n\n| arm | likes/post |\n|---|---:|\n"
                                   "| trained | 1.50 -> 3.33 |\n")
    report_page.write(str(run_dir))
    cli = load_launcher("launch/report.py")
    assert cli.main(["report.py", str(work)]) == 0
    assert capsys.readouterr().out == str(work / "report.html") + "\n"
    assert page_problems(str(work / "report.html"), ("curves", "table", "runs")) == []
    text = (work / "report.html").read_text()
    assert "<td>1.50 -&gt; 3.33</td>" in text and "trained (n=2)" in text
    assert "fill\":\"tonexty" in text  # two seeds: a band
    assert os.path.relpath(run_dir / "report.html", work) in text  # the run's own page
    with pytest.raises(SystemExit) as exit_:
        cli.main(["report.py", str(tmp_path / "nothing")])
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and err.count("\n") == 1
    assert err.startswith(f"error: {tmp_path / 'nothing'}: neither a run directory")


def test_the_feed_is_read_first_and_last_and_a_failing_page_does_not_stop_a_run(
        tmp_path, monkeypatch):
    path = tmp_path / "feed.jsonl"
    rows = [json.dumps({"epoch": e, "posts": []}) for e in (1, 2, 3)]
    path.write_text(rows[0] + "\n")
    assert [r["epoch"] for r in report_page._first_and_last(str(path))] == [1, 1]
    path.write_text("\n".join(rows) + "\n" + '{"epoch": 4, "po')  # a torn last line
    assert [r["epoch"] for r in report_page._first_and_last(str(path))] == [1, 3]
    assert report_page._first_and_last(str(tmp_path / "none.jsonl")) == []
    # A page that cannot be written is a warning; the run goes on (runner._write_report).
    from absl import logging as absl_logging

    from jaxsocial.train import runner
    said = []
    monkeypatch.setattr(absl_logging, "warning", lambda msg, *a: said.append(msg % a))
    monkeypatch.setattr(report_page, "write", lambda w: 1 / 0)
    assert runner._write_report(str(tmp_path)) is None
    assert said == ["report.html not written: ZeroDivisionError: division by zero"]
