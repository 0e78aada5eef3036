"""LLM agents in the tournament: renderer and parser on their own, then an end-to-end run with
the tiny random Llama through the generation engine (grammar-constrained and free)."""
import jax
import numpy as np
import pytest

from jaxsocial.envs import llm_agent as la
from jaxsocial.envs import social_learning as sl


def _view(social=True, learned=""):
    return la.AgentView(agent=1, num_agents=3, num_arms=5, round=4, num_rounds=10, remaining=3000,
                        repertoire=((0, 1.25, 4, sl.ORIGIN_INNOVATED), (3, 2.5, 1, sl.ORIGIN_COPIED),
                                    (4, None, 0, sl.ORIGIN_REVISED)),
                        peers=((0, 3, 2.5), (2, None, None)), social=social, open_arms=False,
                        learned=learned)


def test_learn_prompt_shows_repertoire_estimates_peers_and_budget():
    text = la.render_learn_prompt(_view())
    for line in ["You are agent 1 of 3", "Round 5 of 10", "Tokens left this round: 3000",
                 "arm 0: 1.25 over 4 samples (found yourself)", "arm 3: 2.50 over 1 sample (copied)",
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
    return la.LLMAgent.load("tiny", la.LLMAgentConfig(max_learn_tokens=24, max_pull_tokens=12))


def test_tiny_llm_end_to_end_pays_real_tokens(tiny_agent):
    p = sl.EnvParams(num_agents=3, num_arms=5, num_rounds=2)
    keys = jax.random.split(jax.random.key(0), 1)
    run = tiny_agent.run(keys, p)
    assert run.malformed_learn == 0 and run.malformed_pull == 0  # grammar-constrained
    tok = tiny_agent.tokenizer
    n_tok = lambda text: len(tok.encode(text, add_special_tokens=False)) + 1  # + <|eot_id|>
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
            if run.traj.pulled[0, t, i] and not run.traj.forced[0, t, i]:
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


def test_tiny_llm_without_grammar_counts_malformed(tiny_agent):
    free = la.LLMAgent(tiny_agent.model, tiny_agent.tokenizer,
                       la.LLMAgentConfig(max_learn_tokens=24, max_pull_tokens=12, grammar=False))
    p = sl.EnvParams(num_agents=3, num_arms=5, num_rounds=1, social=False)
    run = free.run(jax.random.split(jax.random.key(1), 1), p)
    # a random model almost never writes the format: counted, played as skip / missed pull
    assert run.malformed_learn + run.malformed_pull > 0
    bad = ~np.array([la.parse_pull(t, 5)[1] for t in run.texts[0][1][0]])
    assert not np.asarray(run.traj.pulled)[0, 0][bad].any()
