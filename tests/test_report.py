"""Text-drift indicators and summary.md (jaxsocial/train/report.py), against hand counts."""
import pytest

from jaxsocial.train import report


def test_text_drift_hand_counts():
    texts = ["Great match tonight! #football",          # hashtag, "!"
             "great match tonight #football",            # near-duplicate of 0 (other author)
             "Soup with basil \U0001F60B",               # emoji
             "Three tips for crispy potatoes"]
    d = report.text_drift(texts, authors=[0, 1, 2, 3])
    assert d["mean_post_words"] == pytest.approx((4 + 4 + 3 + 5) / 4)
    # bigrams: 3 + 3 + 2 + 4 = 12, posts 0 and 1 share all 3 (lower-cased) -> 9 distinct
    assert d["distinct_2"] == pytest.approx(9 / 12)
    assert d["hashtag_share"] == 0.5
    assert d["exclamation_share"] == 0.25
    assert d["emoji_share"] == 0.25
    assert d["near_duplicate_share"] == 0.5


def test_near_duplicates_by_the_same_agent_do_not_count():
    texts = ["the same words here again", "the same words here again"]
    assert report.text_drift(texts, authors=[5, 5])["near_duplicate_share"] == 0.0
    assert report.text_drift(texts, authors=[5, 6])["near_duplicate_share"] == 1.0


def test_empty_and_bad_input():
    assert report.text_drift([]) == {k: 0.0 for k in report.DRIFT_KEYS}
    with pytest.raises(ValueError, match="2 texts but 1 authors"):
        report.text_drift(["a", "b"], authors=[0])


def test_summary_markdown(tmp_path):
    first = {"epoch": 1, "avg_likes_per_post": 0.5, "zero_like_share": 0.75,
             "positive_engagement_share": 0.25, "total_posts": 8,
             "drift": report.text_drift(["hello there!"]),
             "posts": [{"text": "hello  there!", "likes": 2}]}
    last = dict(first, epoch=4, avg_likes_per_post=1.25, total_posts=12, posts=[])
    path = tmp_path / "summary.md"
    report.write_summary_md({"first": first, "last": last}, str(path))
    md = path.read_text()
    assert "| avg likes per post | 0.5000 | 1.2500 |" in md
    assert "| total posts | 8 | 12 |" in md
    assert "| exclamation_share | 1.0000 | 1.0000 |" in md
    assert "- (2 likes) hello there!" in md
    assert "(no posts)" in md
    assert "No epochs" in report.summary_markdown({"first": None})


def test_console_story(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "export").mkdir()
    hist = [{"epoch": e, "avg_likes_per_post": v, "zero_like_share": 0.5, "total_posts": 4,
             "posts": [{"text": f"best  {e}\nline", "likes": 7}],
             "worst_post": {"text": f"worst {e}", "likes": 0}} for e, v in
            enumerate([1.0, 3.0, 2.0], start=1)]
    out = report.console_story({"history": hist}, str(tmp_path), non_post_mode="mean")
    assert "\u2581\u2588\u2585" in out and "(1.000 -> 2.000)" in out  # min, max, middle
    assert "best post of epoch 1 (7 likes): 'best 1 line'" in out  # the first epoch beside
    assert "best post of epoch 3 (7 likes): 'best 3 line'" in out  # the last
    assert "epoch 2 (" not in out
    assert "worst post of epoch 3 (0 likes): 'worst 3'" in out
    assert "reward.non_post_mode='mean'" in out
    assert "left out of the update" in report.console_story({"history": hist}, str(tmp_path),
                                                            non_post_mode="skip")
    assert out.splitlines()[-1] == f"wrote {tmp_path}/: metrics.jsonl, export/"
    assert "non_post" not in report.console_story({"history": hist}, str(tmp_path))
    assert "byte noise" in report.console_story({"history": hist}, str(tmp_path),
                                                random_model=True)
    one = report.console_story({"history": hist[:1]}, str(tmp_path))
    assert one.count("best post of epoch 1") == 1  # one epoch: its best post once
    assert report.sparkline([2.0, 2.0]) == "\u2581\u2581" and report.sparkline([]) == ""
    long = report.console_story({"history": hist * 6}, str(tmp_path), max_rows=5)
    assert long.count("...") >= 1 and len(long.splitlines()) < 12
