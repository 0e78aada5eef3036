"""LLM agents in the tournament: renderer and parser on their own, then an end-to-end run with
the tiny random Llama through the generation engine (grammar-constrained and free)."""
import jax
import numpy as np
import pytest

from jaxsocial.envs import baselines as bl
from jaxsocial.envs import llm_agent as la
from jaxsocial.envs import social_learning as sl


def _view(social=True, learned=""):
    return la.AgentView(agent=1, num_agents=3, num_arms=5, round=4, num_rounds=10, remaining=3000,
                        repertoire=((0, 1.25, 4, sl.ORIGIN_INNOVATED),
                                    (3, 2.5, 1, sl.ORIGIN_COPIED),
                                    (4, None, 0, sl.ORIGIN_REVISED)),
                        peers=((0, 3, 2.5), (2, None, None)), social=social, open_arms=False,
                        learned=learned)


def test_learn_prompt_shows_repertoire_estimates_peers_and_budget():
    text = la.render_learn_prompt(_view())
    for line in ["You are agent 1 of 3", "Round 5 of 10", "Tokens left this round: 3000",
                 "arm 0: 1.25 over 4 samples (found yourself)",
                 "arm 3: 2.50 over 1 sample (copied)",
                 "arm 4: not tried yet (revised)", "agent 0: arm 3, reward 2.50",
                 "agent 2: has not pulled yet", "LEARN: observe <agent>"]:
        assert line in text, line
    solo = la.render_learn_prompt(_view(social=False))
    assert "observe" not in solo and "agent 0:" not in solo
    pull = la.render_pull_prompt(_view(learned=la.describe_learning(sl.OBSERVE, 3, 2.5, 0, False)))
    assert "You observed agent 0: arm 3 gave reward 2.50." in pull and "PULL: <arm>" in pull


def test_agent_view_from_env_state():
    p = sl.EnvParams(num_agents=3, num_arms=5)
    obs, s = sl.reset_jit(jax.random.key(0), p)
    la_ = sl.learn_action(np.array([sl.INNOVATE] * 3))
    obs, s, _ = sl.learn_jit(jax.random.key(1), s, la_, p)
    obs, s, r, _, _ = sl.exploit_jit(jax.random.key(2), s, sl.exploit_action(obs.acquired), p)
    v = la.agent_view(obs, s, 0, p, social=True)
    arm = int(s.last_arm[0])
    assert v.repertoire == ((arm, pytest.approx(float(r[0])), 1, sl.ORIGIN_INNOVATED),)
    assert [pe[0] for pe in v.peers] == [1, 2]
    assert v.peers[0][1] == int(s.last_arm[1]) and v.remaining == 4096 and v.round == 1


@pytest.mark.parametrize("text,expected", [
    ("LEARN: skip", (sl.SKIP, 0, True)),
    ("learn: Innovate", (sl.INNOVATE, 0, True)),
    ("LEARN: revise\n", (sl.REVISE, 0, True)),
    ("LEARN: observe 2", (sl.OBSERVE, 2, True)),
    ("I think agent 1 is best.\nLEARN: observe agent 1", (sl.OBSERVE, 1, True)),
    ("LEARN: skip ... actually LEARN: observe 0", (sl.OBSERVE, 0, True)),
    ("LEARN: observe 7", (sl.SKIP, 0, False)),  # no agent 7
    ("LEARN: observe", (sl.SKIP, 0, False)),
    ("observe 2", (sl.SKIP, 0, False)),
    ("", (sl.SKIP, 0, False)),
])
def test_parse_learn(text, expected):
    assert la.parse_learn(text, num_agents=3) == expected


@pytest.mark.parametrize("text,expected", [
    ("PULL: 4", (4, True)), ("pull: arm 0", (0, True)), ("reasoning...\nPULL: 2", (2, True)),
    ("PULL: 5", (sl.PULL_NONE, False)), ("PULL: x", (sl.PULL_NONE, False)),
    ("4", (sl.PULL_NONE, False)),
])
def test_parse_pull(text, expected):
    assert la.parse_pull(text, num_arms=5) == expected


@pytest.fixture(scope="module")
def tiny_agent():
    # one generation length for both phases: both share the compiled programs
    return la.LLMAgent.load("tiny", la.LLMAgentConfig(max_learn_tokens=16, max_pull_tokens=16))


def test_tiny_llm_end_to_end_pays_real_tokens(tiny_agent):
    p = sl.EnvParams(num_agents=3, num_arms=5, num_rounds=2)
    keys = jax.random.split(jax.random.key(0), 1)
    run = tiny_agent.run(keys, p)
    assert run.malformed_learn == 0 and run.malformed_pull == 0  # grammar-constrained
    tok = tiny_agent.tokenizer
    def n_tok(text):
        return len(tok.encode(text, add_special_tokens=False)) + 1  # + <|eot_id|>
    tokens = np.asarray(run.traj.tokens)
    for t, (learn_texts, pull_texts) in enumerate(run.texts):
        for i in range(p.num_agents):
            lt, pt = learn_texts[0][i], pull_texts[0][i]
            assert la.parse_pull(pt, 5)[1]
            expect = (n_tok(lt) if lt else 0) + n_tok(pt)
            assert tokens[0, t, i] == expect, (t, i, lt, pt)
            # the parsed decision is what the env was asked to do
            kind, target, ok = la.parse_learn(lt, 3) if lt else (sl.INNOVATE, 0, True)
            assert int(run.traj.requested[0, t, i]) == kind
            if run.traj.pulled[0, t, i] and not run.traj.forced_applied[0, t, i]:
                assert int(run.traj.arm[0, t, i]) == la.parse_pull(pt, 5)[0]
    assert np.asarray(run.traj.pulled).mean() > 0  # some pulls happened
    # a tight budget: learning is paid first, the pull only if its real tokens still fit
    budget = 14
    tight = tiny_agent.run(keys, p.replace(budget=budget))
    outcomes = set()
    for t, (learn_texts, pull_texts) in enumerate(tight.texts):
        for i in range(p.num_agents):
            lt, pt = learn_texts[0][i], pull_texts[0][i]
            learn_cost = min(n_tok(lt) if lt else 0, budget)
            left = budget - learn_cost
            fits = left > 0 and n_tok(pt) <= left
            assert bool(tight.traj.pulled[0, t, i]) == fits
            assert tight.traj.tokens[0, t, i] == learn_cost + min(n_tok(pt), left)
            outcomes.add(fits)
    assert (np.asarray(tight.traj.tokens) <= budget).all()
    # same key -> same run
    again = tiny_agent.run(keys, p)
    np.testing.assert_array_equal(again.traj.tokens, run.traj.tokens)


class _Scripted(la.LLMAgent):
    """An LLM agent whose completions are scripted (no model): drives `run`'s bookkeeping."""

    def __init__(self, tokenizer, learn, pull):
        self.tokenizer, self._grammars = tokenizer, {}
        self.config = la.LLMAgentConfig(grammar=False)
        self.eot, self.pad, self.script = 5, 0, {"learn": learn, "pull": pull}

    def complete(self, user_messages, key, max_new_tokens, grammar=None):
        phase = "learn" if "LEARN:" in user_messages[0] else "pull"
        texts = [self.script[phase][i % len(self.script[phase])] for i in range(len(user_messages))]
        lengths = np.array([len(t) for t in texts], np.int32)  # 1 token per character
        return texts, lengths, lengths >= max_new_tokens


def test_malformed_completions_are_counted_not_fatal():
    agent = _Scripted(None, learn=["LEARN: innovate", "hmm", "LEARN: observe 9"],
                      pull=["PULL: 1", "PULL: 1", "no idea"])
    p = sl.EnvParams(num_agents=3, num_arms=5, num_rounds=2, open_arms=True)
    run = agent.run(jax.random.split(jax.random.key(1), 1), p)
    forced = np.asarray(run.traj.forced_applied)
    assert run.malformed_learn == 2 * 2 - forced[0, :, 1:].sum()  # agents 1, 2 each round
    assert run.malformed_pull == 2  # agent 2, both rounds
    assert run.asked_learn == 3 * 2 - forced[0].sum()  # forced rounds ask no learning decision
    pulled = np.asarray(run.traj.pulled)[0]
    # malformed pull = missed pull (unless forced search imposed the pull)
    assert pulled[:, :2].all()
    np.testing.assert_array_equal(pulled[:, 2], forced[0, :, 2])
    kinds = np.asarray(run.traj.requested)[0]
    assert (kinds[:, 1][~forced[0, :, 1]] == sl.SKIP).all()  # malformed learning = skip
    # tokens charged: scripted lengths (also for malformed ones), 0 for the learning decision
    # of forced agents (not asked)
    tokens = np.asarray(run.traj.tokens)[0]
    lens_learn = np.array([15, 3, 16])
    lens_pull = np.array([7, 7, 7])
    np.testing.assert_array_equal(tokens, np.where(forced[0], 0, lens_learn) + lens_pull)


def test_launcher_plays_the_baselines_seeds_and_reports_the_mix(monkeypatch, tmp_path):
    """run_llm's populations are the baselines' first llm.num_seeds seeds (same arm means);
    its rows carry the malformed rate and the learning-action mix."""
    from conftest import load_config_file, load_launcher

    mod = load_launcher("launch/tournament.py")
    cfg = load_config_file("configs/social_learning.py", "small")
    with cfg.unlocked():
        cfg.llm.enabled, cfg.llm.checkpoint, cfg.llm.num_seeds = True, "scripted", 2
    agent = _Scripted(None, learn=["LEARN: innovate", "hmm", "LEARN: skip"],
                      pull=["PULL: 1", "PULL: 2", "PULL: 3", "nope"])
    runs = []

    def run(keys, params, record=4):
        runs.append(la.LLMAgent.run(agent, keys, params, record))
        return runs[-1]

    agent.run = run
    monkeypatch.setattr(la.LLMAgent, "load", classmethod(lambda cls, ckpt, config: agent))
    rows = mod.run_llm(cfg)
    base_keys = jax.random.split(jax.random.key(cfg.seed), cfg.num_seeds)[:2]
    params = mod.env_params(cfg.env)
    _, base = sl.rollout_batch(base_keys, bl.solo_ucb, params.replace(social=False))
    np.testing.assert_allclose(runs[0].traj.mu[:, 0], base.mu[:, 0], rtol=1e-6)  # same worlds
    for name in ("llm_social", "llm_solo"):
        r = rows[name]
        mix = r["skip_rate"] + r["innovate_rate"] + r["revise_rate"] + r["observe_rate"]
        assert mix == pytest.approx(1.0)
        assert r["innovate_rate"] > 0 and r["skip_rate"] > 0
        asked = r["asked_learn"] + r["asked_pull"]
        assert r["malformed_rate"] == pytest.approx(
            (r["malformed_learn"] + r["malformed_pull"]) / asked) and r["malformed_pull"] > 0
    with cfg.unlocked():
        cfg.llm.num_seeds = cfg.num_seeds + 1
    with pytest.raises(ValueError, match="llm.num_seeds"):
        mod.run_llm(cfg)
