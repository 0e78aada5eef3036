"""Cohorts (agents.cohorts): multi-LoRA generation and scoring against each cohort run on its
own, the per-cohort update, per-cohort rewards and metrics, resume and export."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from browser import page_problems, require_browser
from conftest import load_config_file
from flax import nnx
from test_lora import merged
from test_train_loop import mismatches, perturbed, trained_parts

from jaxsocial.generation.generate import generate_from_state
from jaxsocial.generation.sampling import SamplingConfig
from jaxsocial.models import checkpoint_hf, llama
from jaxsocial.rl import buffer as buffer_lib
from jaxsocial.rl import lora as lora_lib
from jaxsocial.rl import policy as policy_lib
from jaxsocial.rl.config import PPOConfig
from jaxsocial.train import cohorts as cohorts_lib
from jaxsocial.train import report, runner, sharding
from jaxsocial.train import run as run_lib

ROWS = np.array([1, 0, -1, 1, 0, -1], np.int32)  # the adapter of each row (-1: the base)


def _model_and_adapters(scan=False, k=2, rank=4):
    cfg = llama.preset("tiny").replace(scan_layers=scan)
    graphdef, state = nnx.split(llama.init(cfg, 0))
    base = nnx.to_pure_dict(state)
    lc = lora_lib.LoraConfig(rank=rank, alpha=2.0 * rank)
    # B = 0 at init: give every adapter a real, different delta
    ads = [jax.tree.map(lambda x, i=i: x + 0.3 * jax.random.normal(jax.random.key(9 + i),
                                                                   x.shape),
                        lora_lib.init_adapters(base, lc, jax.random.key(i))) for i in range(k)]
    return cfg, graphdef, base, lc, ads


def _prompts(cfg, rows=len(ROWS), length=9):
    ids = jax.random.randint(jax.random.key(3), (rows, length), 3, cfg.vocab_size)
    mask = jnp.ones((rows, length), bool).at[::2, :3].set(False)  # some left padding
    return ids, mask


def _per_cohort(fn, base, ads, lc, rows):
    """fn(weights, row_ids) run once per adapter (merged) and once for the base, reassembled
    in row order: each cohort on its own."""
    out = {}
    for k in sorted(set(rows.tolist())):
        sel = np.nonzero(rows == k)[0]
        weights = base if k < 0 else merged(base, ads[k], lc.scale)
        out.update(zip(sel.tolist(), fn(weights, sel)))
    return [out[i] for i in range(len(rows))]


@pytest.mark.parametrize("scan", [False, True])
def test_multi_lora_generation_equals_each_cohort_alone(scan):
    cfg, graphdef, base, lc, ads = _model_and_adapters(scan)
    ids, mask = _prompts(cfg)
    sampling = SamplingConfig(max_new_tokens=6, temperature=0.0, stop_token_ids=())
    key = jax.random.key(0)

    def gen(weights, sel):
        out = generate_from_state(graphdef, weights, ids[sel], mask[sel], key, sampling)
        return list(zip(np.asarray(out.tokens), np.asarray(out.logprobs)))

    def batched(rows):
        out = generate_from_state(graphdef, lora_lib.adapt(base, lora_lib.stack(ads), lc,
                                                           rows=jnp.asarray(rows)),
                                  ids, mask, key, sampling)
        return np.asarray(out.tokens), np.asarray(out.logprobs)

    ref = _per_cohort(gen, base, ads, lc, ROWS)
    ref_tok = np.stack([t for t, _ in ref])
    ref_lp = np.stack([lp for _, lp in ref])
    tok, lp = batched(ROWS)
    np.testing.assert_array_equal(tok, ref_tok)
    np.testing.assert_allclose(lp, ref_lp, atol=1e-5)
    # The adapters matter: the base alone answers differently from each adapter.
    assert not np.array_equal(ref_tok[ROWS == 0], ref_tok[ROWS == -1][:2])
    # Negative control: the adapters swapped between the cohorts are caught.
    swapped = np.where(ROWS >= 0, 1 - ROWS, ROWS)
    tok_s, lp_s = batched(swapped)
    assert not np.allclose(lp_s[ROWS >= 0], ref_lp[ROWS >= 0], atol=1e-5)
    np.testing.assert_allclose(lp_s[ROWS < 0], ref_lp[ROWS < 0], atol=1e-5)  # base rows kept


def test_unmerged_scoring_equals_merged():
    """A cohort's (and the single policy's) scoring and update forward (x W + s (x A) B)
    against the plain policy on merged weights W + s A B: log-probs and values within 1e-5."""
    cfg, graphdef, base, lc, ads = _model_and_adapters(k=1)
    ids, mask = _prompts(cfg, rows=4)
    resp = jax.random.randint(jax.random.key(4), (4, 5), 3, cfg.vocab_size)
    rmask = jnp.ones((4, 5), bool).at[1, 3:].set(False)
    batch = buffer_lib.make_trajectory(ids, mask, resp, rmask, scores=jnp.zeros(4))
    head = {"kernel": jax.random.normal(jax.random.key(5), (cfg.hidden_size,)) * 0.1,
            "bias": jnp.float32(0.3)}
    params = {"policy": ads[0], "value": {"head": head}}
    rl = PPOConfig(temperature=1.0)
    adapted = policy_lib.evaluate(policy_lib.PolicyDef(graphdef=graphdef, lora=lc), params,
                                  base, batch, rl)
    pdef = policy_lib.PolicyDef(graphdef=graphdef)
    ref = policy_lib.evaluate(pdef, {"policy": merged(base, ads[0], lc.scale),
                                     "value": {"head": head}}, base, batch, rl)
    np.testing.assert_allclose(adapted.logprobs, ref.logprobs, atol=1e-5)
    np.testing.assert_allclose(adapted.values, ref.values, atol=1e-5)
    # negative control: the base alone is far from the adapted policy
    plain = policy_lib.evaluate(pdef, {"policy": base, "value": {"head": head}}, base, batch, rl)
    assert np.max(np.abs(np.asarray(plain.logprobs - ref.logprobs))) > 1e-2


# ---------------------------------------------------------------------------------------------
# the plan


def _config(cohorts, **rl):
    c = load_config_file("configs/demo.py", "smoke")
    c.rl.lora_rank = 4
    c.rl.learning_rate = 1e-3
    for k, v in rl.items():
        setattr(c.rl, k, v)
    c.agents.cohorts = cohorts
    c.train.export_hf = False
    return c


TWO = (dict(name="likes", share=0.5, reward=dict(like=1.0)),
       dict(name="comments", share=0.5, reward=dict(like=0.0, comment=1.0)))


@pytest.mark.parametrize("cohorts,lora,message", [
    ((dict(name="a", share=0.5), dict(name="b", share=0.4)), 4, "sum to 0.9"),
    ((dict(name="a", ids=(0, 1, 2)), dict(name="b", ids=(2, 3, 4, 5, 6, 7))), 4,
     "exactly one cohort"),
    ((dict(name="a", ids=(0, 1, 2, 3)), dict(name="b", share=0.5)), 4, "not a mix"),
    ((dict(name="a", share=1.0, colour="red"),), 4, "unknown keys ['colour']"),
    ((dict(name="a", share=1.0, reward=dict(dislikes=1.0)),), 4, "unknown keys ['dislikes']"),
    ((dict(name="a", share=0.5), dict(name="a", share=0.5)), 4, "distinct"),
    ((dict(name="a", share=0.5, trainable=False), dict(name="b", share=0.5, trainable=False)),
     4, "no cohort is trainable"),
    (TWO, 0, "rl.lora_rank > 0"),
    ((dict(name="a", share=0.25), dict(name="b", share=0.75)), 4, "act equally often"),
])
def test_bad_cohorts_are_refused_by_name(cohorts, lora, message):
    c = _config(cohorts)
    c.rl.lora_rank = lora
    with pytest.raises(ValueError, match="agents.cohorts") as e:
        cohorts_lib.from_config(c)
    assert message in str(e.value)


def test_uneven_activity_is_refused_and_personas_are_per_cohort():
    c = _config((dict(name="a", share=0.25, trainable=False),
                 dict(name="b", share=0.75, personas=("You are Zed, a baker.",))))
    c.agents.active_per_tick = 2  # 8 agents: a cohort of 2 would act 0.5 times a tick
    with pytest.raises(ValueError, match="whole number"):
        cohorts_lib.from_config(c)
    c.agents.active_per_tick = 4
    co = cohorts_lib.from_config(c)
    assert co.active == (1, 3) and co.slots == (-1, 0) and co.num_trainable == 1
    np.testing.assert_array_equal(co.row_slot, [-1, 0, 0, 0])
    p = cohorts_lib.personas(co, ["p%d" % i for i in range(8)])
    assert p[:2] == ("p0", "p1") and set(p[2:]) == {"You are Zed, a baker."}


def test_reports_and_dislikes_are_recorded_only_where_a_reward_weighs_them():
    from jaxsocial.train import config as run_config
    c = _config(())
    assert run_config.engagement_channels(c) == 3  # the default record: unchanged
    assert run_config.society_fields(c)["engagement_channels"] == 3
    c.reward.report = -1.0
    assert run_config.engagement_channels(c) == 5
    c = _config((dict(name="a", share=0.5), dict(name="b", share=0.5, reward=dict(dislike=-2))))
    assert run_config.engagement_channels(c) == 5
    co = cohorts_lib.from_config(c)
    col = cohorts_lib.REWARD_KEYS.index
    assert co.reward[1, col("dislike")] == -2 and co.reward[0, col("dislike")] == 0
    assert co.reward[1, col("like")] == c.reward.like  # unset keys: the run's reward.*
    c.agents.cohorts = ("not a cohort",)  # malformed: the config check names it, not this
    assert run_config.engagement_channels(c) == 3


def test_rows_of_each_cohort():
    co = cohorts_lib.from_config(_config(TWO))
    np.testing.assert_array_equal(co.rows(2), [[0, 1, 2, 3, 8, 9, 10, 11],
                                               [4, 5, 6, 7, 12, 13, 14, 15]])


# ---------------------------------------------------------------------------------------------
# the epoch


def _rolled(c):
    """(run, state, Rollout, Trajectory, score, engagement) of one rollout of config `c`, layers
    scanned (general.py's setting), on one device."""
    c.model.scan_layers = True
    run = run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    state = run.init_state()
    key, k_roll = run.fns.begin(state)
    soc, ro = run.rollout(state.train.params, state.train.ref_params, state.society, k_roll)
    bonus = jnp.zeros(ro.created_id.shape, jnp.float32)
    batch, score, eng, _ = run.score(state.train, ro, bonus)
    return run, state, ro, batch, score, eng


@pytest.fixture(scope="module")
def two():
    """Two trainable cohorts: one rewarded for likes, one for comments."""
    return _rolled(_config(TWO))


@pytest.fixture
def dislikes():
    """`two` with the comments cohort rewarded for comments minus dislikes (five channels
    recorded), in a crowd that dislikes often enough to matter."""
    c = _config((TWO[0], dict(TWO[1], reward=dict(like=0.0, comment=1.0, dislike=-1.0))))
    c.society.dislike_bias = 0.0
    return _rolled(c)


@pytest.mark.parametrize("fixture,channels", [("two", 3), ("dislikes", 5)])
def test_each_cohort_scores_its_own_rows_by_its_own_weights(fixture, channels, request):
    run, state, ro, batch, score, eng = request.getfixturevalue(fixture)
    co = run.setup.cohorts
    t = ro.agent.shape[0]
    rows = co.rows(t)
    agents = np.asarray(ro.agent).reshape(-1)
    for k, c in enumerate(co.trained):
        # cohort k's trajectories are exactly its own agents' answers
        assert set(agents[rows[k]]) == set(co.members[c].tolist())
        np.testing.assert_array_equal(np.asarray(batch.response_tokens[k]),
                                      np.asarray(ro.tokens).reshape(t * len(agents) // t, -1)
                                      [rows[k]])
    # The demo's reward: posts by their cohort's weights (likes; comments, or comments minus
    # dislikes: five channels recorded); non-posts the cohort's mean post score
    assert run.setup.social_params.engagement_channels == channels
    e = np.asarray(eng).reshape(-1, channels)
    made = np.asarray(ro.created_id).reshape(-1) >= 0
    w = co.reward[co.row_cohort][np.tile(np.arange(len(co.row_cohort)), t)][:, :channels]
    s = np.asarray(score).reshape(-1)
    np.testing.assert_allclose(s[made], np.sum(e * w, -1)[made], rtol=1e-6)
    if channels == 5:  # negative control: the dislikes count (leaving them out disagrees)
        assert e[:, 4].sum() > 0
        assert not np.allclose(s[made], np.sum(e[:, :3] * w[:, :3], -1)[made])
    cohort = co.agent_cohort[agents]
    for c in range(co.num):
        mine = cohort == c
        mean = s[mine & made].mean() if (mine & made).any() else 0.0
        np.testing.assert_allclose(s[mine & ~made], mean, rtol=1e-6)
    assert e[:, 2].sum() > 0 and e[:, 0].sum() > 0  # both weights met something


def test_each_cohort_updates_on_its_own_trajectories_only(two):
    run, state, ro, batch, _, _ = two
    grammar = run.setup.grammar
    upd = jax.jit(run.fns.update)
    new, metrics = upd(state.train, batch, grammar)
    before, after = trained_parts(state.train), trained_parts(new)
    assert np.all(np.asarray(metrics["grad_norm"]) > 0)
    # both cohorts moved, and apart from each other
    for part in ("params", "mu", "nu"):
        assert mismatches(before[part], after[part])
    pol = sharding.to_host(new.params["policy"])
    a0 = jax.tree.map(lambda x: x[0], pol)
    a1 = jax.tree.map(lambda x: x[1], pol)
    assert mismatches({"p": a0}, {"p": a1})
    # Cohort 0's update is the single-policy update on its rows alone ...
    k0 = jax.tree.map(lambda x: x[0], new.replace(ref_params=None))
    one = cohorts_lib.cohort_params(state.train, 0)
    alone = state.train.replace(**{f: jax.tree.map(lambda x: x[0], getattr(state.train, f))
                                   for f in ("params", "opt_state", "kl", "reward_stats",
                                             "step", "key", "nonfinite_skips",
                                             "learning_rate")})
    assert jax.tree.structure(alone.params) == jax.tree.structure(one)
    ref, _ = jax.jit(run.setup.update.fn)(alone, jax.tree.map(lambda x: x[0], batch), grammar)
    assert mismatches(trained_parts(ref), trained_parts(k0.replace(ref_params=ref.ref_params)),
                      rtol=1e-5, atol=1e-6) == []
    # ... and does not see cohort 1's: new scores for cohort 1 leave cohort 0 as it was
    scores = batch.scores.at[1].set(-batch.scores[1] + 5.0)
    new2, _ = upd(state.train, batch.replace(scores=scores), grammar)
    t0 = lambda s: trained_parts(jax.tree.map(lambda x: x[0], s.replace(ref_params=None)))  # noqa
    t1 = lambda s: trained_parts(jax.tree.map(lambda x: x[1], s.replace(ref_params=None)))  # noqa
    assert mismatches(t0(new), t0(new2)) == []
    assert mismatches(t1(new), t1(new2))  # negative control: cohort 1 did see them
    assert mismatches(t0(new), perturbed(t0(new)), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def two_epoch(two):
    """(metrics, trained parts before, after) of `two`'s first epoch from a fresh state."""
    from test_train_loop import _one_epoch
    return _one_epoch(two[0])


def test_per_cohort_metrics(two, two_epoch):
    run = two[0]
    m = two_epoch[0]
    co = m["cohorts"]
    assert set(co) == {"likes", "comments"}
    assert sum(c["total_posts"] for c in co.values()) == m["total_posts"]
    assert sum(c["agents"] for c in co.values()) == run.setup.num_agents
    for c in co.values():
        assert set(c["likes_given"]) == {"likes", "comments", "crowd"}
        assert {"avg_likes_per_post", "zero_like_share", "positive_engagement_share",
                "total_likes", "crowd_interest_sim", "drift", "action_mix", "ppo"} <= set(c)
        assert c["ppo"]["grad_norm"] > 0
    total_likes = sum(c["total_likes"] for c in co.values())
    assert total_likes == pytest.approx(m["avg_likes_per_post"] * m["total_posts"])
    mixes = sum(sum(c["action_mix"].values()) for c in co.values())
    assert mixes == m["interactions"]


def test_cohort_run_resumes_to_the_same_state_and_exports_each_cohort(tmp_path):
    control = (dict(name="trained", share=0.5), dict(name="frozen", share=0.5, trainable=False))
    c = _config(control)
    c.train.epochs = 2
    c.train.checkpoint_every = 1
    c.train.export_hf = True
    run = run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    straight, halves = tmp_path / "straight", tmp_path / "halves"
    runner.train(c, str(straight), run=run)
    runner.train(c, str(halves), run=run, stop_after=1)
    runner.train(c, str(halves), run=run)

    def final(w):
        from jaxsocial.train import checkpointing
        ck = checkpointing.Checkpointer(str(w))
        s, _, step = ck.restore(run.init_state())
        ck.close()
        assert step == 2
        return trained_parts(s.train)
    a, b = final(straight), final(halves)
    assert mismatches(a, b) == []
    assert mismatches(a, perturbed(b), rtol=1e-6)  # negative control
    assert jax.tree.leaves(a["params"])[0].shape[0] == 1  # one trainable cohort, stacked
    # export/<cohort>/ for the trainable cohort, each a complete HF directory
    assert sorted(os.listdir(straight / "export")) == ["trained"]
    assert checkpoint_hf.export_problem(str(straight / "export" / "trained")) is None
    assert checkpoint_hf.export_problem(str(straight / "initial")) is None
    rows = [json.loads(x) for x in open(straight / "metrics.jsonl")]
    assert [sorted(r["cohorts"]) for r in rows] == [["frozen", "trained"]] * 2
    assert "ppo" in rows[0]["cohorts"]["trained"] and "ppo" not in rows[0]["cohorts"]["frozen"]
    md = open(straight / "summary.md").read()
    assert "## Cohorts" in md and "| frozen | total likes |" in md and "likes given" in md
    plain = {"first": dict(rows[0], cohorts=None), "last": dict(rows[-1], cohorts=None)}
    assert "## Cohorts" not in report.summary_markdown(plain)  # control: not without cohorts
    # The report's feed: one line per epoch, the resumed run's the same as the straight one's
    # (the posts carry their cohort), and the page of the run draws every section.
    feeds = [open(w / "feed.jsonl").read().splitlines() for w in (straight, halves)]
    assert len(feeds[0]) == 2 and feeds[0] == feeds[1]
    posts = json.loads(feeds[0][1])["posts"]
    assert posts and {p["cohort"] for p in posts} <= {"trained", "frozen"}
    assert len(posts) == rows[1]["total_posts"]
    assert sum(p["likes"] for p in posts) == pytest.approx(
        rows[1]["avg_likes_per_post"] * len(posts))
    require_browser()
    assert page_problems(str(straight / "report.html"), (
        "numbers", "drift", "feed", "actions", "cohorts", "cascades")) == []


def test_cohort_epoch_on_eight_devices_equals_one(two, two_epoch):
    """Adapted kernels under the (2, 2, 2) mesh's sharding hints (`gather_in_place` pins W
    alone; the adapters sharded, `adapter_shardings`) and stacked by the scanned layers: the
    same answers, rewards and per-cohort updates as on one device."""
    from test_train_loop import DEVICE_TOL, _one_epoch

    run8 = run_lib.build_run(two[0].config, mesh=sharding.make_mesh((2, 2, 2)))
    assert run8.mesh.devices.size == 8
    (m1, init1, t1), (m8, init8, t8) = two_epoch, _one_epoch(run8)
    for name in ("likes", "comments"):
        a, b = m1["cohorts"][name], m8["cohorts"][name]
        assert a["total_posts"] == b["total_posts"] and a["action_mix"] == b["action_mix"]
        np.testing.assert_allclose(a["ppo"]["grad_norm"], b["ppo"]["grad_norm"], rtol=1e-4)
        assert a["ppo"]["grad_norm"] > 0
    assert mismatches(init1, init8) == []
    assert mismatches(t1, t8, **DEVICE_TOL) == []
    assert mismatches(t1, perturbed(t8), **DEVICE_TOL)  # negative control
    assert mismatches(t1, init8, **DEVICE_TOL)


def test_copy_from_takes_the_source_adapter_after_the_epoch(two):
    import dataclasses

    # `two`'s run and programs (copy_from changes no program) with "comments" copying "likes"
    co = dataclasses.replace(two[0].setup.cohorts, copy_from=("", "likes"), copy_every=(1, 1))
    run = dataclasses.replace(two[0], setup=dataclasses.replace(two[0].setup, cohorts=co))
    state, m, _ = run.run_epoch(run.init_state())
    assert m["cohorts"]["comments"]["copied_from"] == "likes"
    assert "copied_from" not in m["cohorts"]["likes"]
    parts = trained_parts(state.train)
    take = lambda t, k: jax.tree.map(lambda x: x[k], t)  # noqa: E731
    for part in ("params", "mu", "nu"):
        assert mismatches(take(parts[part], 0), take(parts[part], 1)) == [], part
    # the copy is of a trained adapter (not the untouched init), and the step counters stay
    assert mismatches(take(parts["params"], 0),
                      take(trained_parts(run.init_state().train)["params"], 0))


def test_copies_from_the_best_and_refusals():
    co = cohorts_lib.from_config(_config((dict(TWO[0], copy_from="best", copy_every=2),
                                          dict(TWO[1], copy_from="best"))))
    rewards = {"likes": 1.0, "comments": 2.0}
    assert cohorts_lib.copies(co, 1, rewards) == {}  # likes copies every 2nd epoch;
    assert cohorts_lib.copies(co, 2, rewards) == {"likes": "comments"}  # comments is best
    assert cohorts_lib.copies(co, 2, {"likes": 3.0, "comments": 2.0}) == {"comments": "likes"}
    for bad, msg in ((dict(copy_from="nobody"), "must be 'best'"),
                     (dict(copy_from="best", copy_every=0), "copy_every=0"),
                     (dict(copy_from="best", trainable=False), "only a trainable cohort")):
        cfg = _config((dict(TWO[0], trainable=True), dict(TWO[1], **bad)))
        with pytest.raises(ValueError, match=msg):
            cohorts_lib.from_config(cfg)
