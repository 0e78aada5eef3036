"""tool_call mode: the JAX parser of OASIS-style function calls against the
json-based reference (`parse_tool_call_text`) on generated answers (the tolerances, each failure
kind, corrupted JSON), a mutated parser as the negative control, the token byte tables, and one
epoch of the loop in tool_call mode with failures counted by kind."""
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsocial.agents import tool_calls as aa
from jaxsocial.models.tokenizer import tiny_tokenizer
from jaxsocial.social.state import PAD_TOKEN

K, C, L = 3, 2, 16
OK, NO_JSON, UNKNOWN, BAD = (aa.FAIL_OK, aa.FAIL_NO_JSON, aa.FAIL_UNKNOWN_ACTION,
                             aa.FAIL_BAD_ARGUMENT)
WORDS = ("hello", "world", "soup", "rain", "open", "source", "match", "tonight", "cats")
ACTIONS = ("post", "comment", "quote", "like", "repost", "follow", "mute", "like_comment",
           "search_posts", "trend", "nothing")


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def parser(tok):
    tv = aa.ToolVocab.build(tok, ACTIONS, K, len(tok), feed_comments=C)
    return tv, jax.jit(aa.parse_tool_call, static_argnums=3)


def _run(tok, tv, fn, texts):
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    n = max(map(len, ids)) + 2
    toks = np.zeros((len(ids), n), np.int32)
    mask = np.zeros((len(ids), n), bool)
    for i, r in enumerate(ids):  # the answer, then the stop token (a special: no characters)
        toks[i, :len(r) + 1] = r + [5]
        mask[i, :len(r) + 1] = True
    parsed, fail = fn(tv, jnp.asarray(toks), jnp.asarray(mask), L)
    return jax.device_get(parsed), np.asarray(fail)


def _q(s, q):
    return q + s.replace("\\", "\\\\").replace(q, "\\" + q) + q


def _answer(rng):
    """A random answer: mostly well-formed calls in varied spellings, with wrong names,
    arguments and corruptions mixed in."""
    q = rng.choice(['"', "'"])
    sp = lambda: rng.choice(["", " ", " ", "\n", "  ", "\t"])  # noqa: E731
    kw = rng.choice(ACTIONS)
    name, iarg, targ = aa.TOOL_ARGS[kw]
    args = {}
    if iarg:
        lo, hi = (K + 1, K + K * C) if iarg == "comment_id" else (1, K)
        args[iarg] = rng.choice([rng.randint(lo, hi)] * 4 + [
            _q(str(rng.randint(lo, hi)), q), hi + 1, 0, -1, "1.0", "2e0", "true", "null",
            _q("two", q), "[1]", "1234567"])
        if rng.random() < 0.1:
            del args[iarg]
    if targ:
        words = " ".join(rng.sample(WORDS, rng.randint(1, 3)))
        args[targ] = rng.choice([_q(words, q)] * 5 + [_q("", q), "7", "{}"])
    if rng.random() < 0.2:
        args["extra"] = rng.choice(["[1, {\"a\": null}]", _q("x", q), "false", "-3.5e-2"])
    items = [(k, str(v)) for k, v in args.items()]
    rng.shuffle(items)
    argtxt = "{" + sp() + ("," + sp()).join(f"{_q(k, q)}:{sp()}{v}" for k, v in items) + sp() + "}"
    name_v = rng.choice([_q(name, q)] * 8 + [_q("fly", q), _q(name.upper(), q), "3",
                                            _q("like", q), "null"])
    fields = [("name", name_v)]
    r = rng.random()
    if r < 0.85:
        fields.append((rng.choice(["arguments"] * 4 + ["parameters"]), argtxt))
    elif r < 0.92:
        fields.append(("arguments", rng.choice(["[]", _q("post_id=1", q), "5"])))
    if rng.random() < 0.1:
        fields.append(("id", _q("call_1", q)))
    if rng.random() < 0.05:
        fields = fields[1:]  # no name
    rng.shuffle(fields)
    body = ("," + sp()).join(f"{_q(k, q)}{sp()}:{sp()}{v}" for k, v in fields)
    obj = "{" + sp() + body + sp() + "}"
    text = rng.choice(["", "", "Sure! ", "```json\n", "I like it: "]) + obj + rng.choice(
        ["", "", " done", "\n```", " {", " }"])
    r = rng.random()
    if r < 0.06:
        text = text[:rng.randint(0, len(text))]              # cut off (max_new_tokens)
    elif r < 0.12:
        i = rng.randrange(len(text))
        text = text[:i] + text[i + 1:]                       # a character dropped
    elif r < 0.15:
        text = text.replace("}", ",}", 1)                    # a trailing comma
    elif r < 0.17:
        text = text.replace(":", "=", 1)
    elif r < 0.19:
        text = f"{kw} 1"                                     # free-form answer, no JSON
    return text


def _check(tok, parsed, fail, texts, actions=ACTIONS):
    bad = []
    for i, t in enumerate(texts):
        kind, kw, label, content = aa.parse_tool_call_text(t, actions, K, C)
        got = [int(fail[i])]
        want = [kind]
        if kind == OK:
            spec = aa.ACTIONS[kw]
            got += [int(parsed.type[i]), int(parsed.feed_pos[i]), bool(parsed.to_author[i]),
                    bool(parsed.to_comment[i])]
            want += [int(spec.type), -1 if label is None else label - 1,
                     spec.target == "author", spec.target == "comment"]
            c = parsed.content[i]
            text = tok.decode(c[c != PAD_TOKEN])
            # a token may start with the opening quote ("'hello"): the content keeps it. The
            # content is the tokens as written: compared where no escape can differ.
            if content is not None and not set(content) & set("\\'\""):
                got.append(text if text == content else text[1:])
                want.append(content)
        if got != want:
            bad.append((t, got, want))
    return bad


def test_parser_matches_the_json_reference_on_generated_answers(tok, parser):
    tv, fn = parser
    rng = random.Random(0)
    texts = [_answer(rng) for _ in range(600)]
    texts += ['{"name": "like_post", "arguments": {"post_id": 3}}',
              "{ 'arguments' : { 'post_id' : 2 } , 'name' : 'like_post' } thanks!",
              '{"name":"create_post","arguments":{"content":"it\'s \\"open\\" source"}}',
              "{'name': 'create_post', 'arguments': {'content': 'it\\'s \"cats\"'}}",
              '{"name": "create_comment", "parameters": {"content": "soup", "post_id": "1"}}',
              '{"name": "follow", "arguments": {"followee_id": 2}, "name": "mute"}',
              '{"name": "like_post", "arguments": {"post_id": 01}}',
              '{"name": "like_post", "arguments": {"post_id": 1}, "arguments": {}}',
              '{"name": "do_nothing"}', '{"name": "trend", "arguments": null}',
              '{"name": "like_post", "arguments": {"post_id": NaN}}',
              '{"name": "like_post", "arguments": {"post_id": tru}}',
              '{"name": "like_comment", "arguments": {"comment_id": 9}}']
    parsed, fail = _run(tok, tv, fn, texts)
    bad = _check(tok, parsed, fail, texts)
    assert not bad, bad[:5]
    kinds = np.bincount(fail, minlength=4)
    assert (kinds > 30).all(), kinds  # every kind is exercised
    # the hand-written cases: tolerances parse; the last "name" wins (mute wants mutee_id);
    # 01, NaN and tru are not JSON; an empty "arguments" replaces the first; null is not one
    assert fail[-13:].tolist() == [OK] * 5 + [BAD, NO_JSON, BAD, OK, BAD, NO_JSON, NO_JSON, OK]
    # the content is the model's own tokens between the quotes
    c = parsed.content[-11]
    assert tok.decode(c[c != PAD_TOKEN]) == 'it\'s \\"open\\" source'


def test_a_mutated_parser_disagrees_with_the_reference(tok, parser):
    """Negative control: a parser whose label range is off by one, or that maps the tool names
    to the wrong society actions, is caught by the same comparison."""
    tv, fn = parser
    rng = random.Random(1)
    texts = [_answer(rng) for _ in range(300)]
    for mutant in (tv.replace(hi=tv.hi - 1),
                   tv.replace(action_type=jnp.roll(tv.action_type, 1))):
        parsed, fail = _run(tok, mutant, fn, texts)
        assert len(_check(tok, parsed, fail, texts)) >= 3


def test_failure_kinds_and_label_targets(tok, parser):
    tv, fn = parser
    texts = ["nothing to see", '{"name": "like_post", "arguments": {"post_id": 3}',
             '{"name": "fly"}', '{"arguments": {}}',
             '{"name": "like_post", "arguments": {"post_id": 4}}',
             '{"name": "create_post", "arguments": {"content": ""}}',
             '{"name": "follow", "arguments": {"followee_id": 2}}',
             '{"name": "like_comment", "arguments": {"comment_id": 4}}']
    parsed, fail = _run(tok, tv, fn, texts)
    assert fail.tolist() == [NO_JSON, NO_JSON, UNKNOWN, UNKNOWN, BAD, BAD, OK, OK]
    assert not parsed.parsed[:6].any() and (parsed.type[:6] == int(aa.ActionType.MALFORMED)).all()
    assert parsed.feed_pos[6] == 1 and parsed.to_author[6] and not parsed.to_comment[6]
    assert parsed.feed_pos[7] == K and parsed.to_comment[7]  # first comment label = K + 1


def test_token_bytes_rebuild_the_decoded_text(tok):
    chars, length = aa.token_bytes(tok, len(tok) + 8)
    text = '{"name": "create_post", "arguments": {"content": "Hello, wörld!\\n"}}'
    ids = tok.encode(text, add_special_tokens=False)
    got = b"".join(bytes(chars[i, :length[i]]) for i in ids)
    assert got.decode("utf-8") == text
    assert length[len(tok):].sum() == 0 and length[5] == 0  # unused ids, a special token


def test_tool_instruction_lists_the_configured_tools():
    text = aa.tool_instruction(("post", "like", "follow", "nothing"), 4)
    assert "- create_post(content: string)" in text and "- like_post(post_id: int)" in text
    assert "- follow(followee_id: int)" in text and "- do_nothing()" in text
    assert "repost" not in text and "[1] to [4]" in text


def test_tool_instruction_ends_with_one_example_call_that_parses():
    acts = ("post", "like", "follow", "nothing")
    text = aa.tool_instruction(acts, 4)
    last = text.splitlines()[-1]
    assert text.splitlines()[-2] == "Example answer:" and last == aa.example_call(acts)
    assert aa.parse_tool_call_text(last, acts, 4)[:2] == (aa.FAIL_OK, "post")
    assert aa.parse_tool_call_text(aa.example_call(("like", "nothing")), ("like", "nothing"),
                                   4)[:3] == (aa.FAIL_OK, "like", 1)
    assert "Example answer" not in aa.tool_instruction(acts, 4, example=False)  # control


def test_tool_call_mode_prompt_and_temperature_from_the_config():
    from jaxsocial.train import checks
    from jaxsocial.train import config as run_config
    c = run_config.base_config()
    listing = lambda: "TOOLS"  # noqa: E731
    c.rollout.tool_call_temperature = 0.3
    assert run_config.prompt_text(c, listing) == (c.agents.instruction, c.agents.footer)
    assert run_config.temperature(c) == c.rollout.temperature  # not in tool_call mode
    c.agents.action_mode = "tool_call"
    assert run_config.prompt_text(c, listing) == ("TOOLS", aa.TOOL_FOOTER)
    assert run_config.temperature(c) == 0.3
    c.rollout.tool_call_temperature = None
    assert run_config.temperature(c) == c.rollout.temperature
    c.rollout.tool_call_temperature = -0.5
    with pytest.raises(ValueError, match=r"rollout.tool_call_temperature=-0.5"):
        checks.check(c)


def test_tool_call_rollout_counts_failures_by_kind(monkeypatch):
    """The loop in tool_call mode: the prompt lists the tools, the rollout records each
    answer's failure kind, and the epoch's metrics count them."""
    from conftest import load_config_file

    from jaxsocial.train import host, sharding
    from jaxsocial.train import run as run_lib

    c = load_config_file("configs/demo.py", "smoke")
    c.agents.action_mode = "tool_call"
    c.rollout.ticks_per_epoch = 1
    with pytest.raises(ValueError, match=r"rollout.max_new_tokens=8 is too few .* >= 30"):
        run_lib.build_run(c)  # the smoke's 8 new tokens hold no comment call
    # What follows is about counting failures, not about room: the random model writes no JSON
    # at any length, so the check is set aside to keep the smoke's short (cheap) decode.
    monkeypatch.setattr(aa, "check_tool_call_room", lambda *a, **k: None)
    run = run_lib.build_run(c, mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    assert "like_post(post_id: int)" in run.setup.tokenizer.decode(run.setup.template.middle)
    state = run.init_state()
    _, ro = run.rollout(state.train.params, state.train.ref_params, state.society,
                         jax.random.key(0))
    failure = np.asarray(ro.failure)
    # a random tiny model writes byte noise: no JSON; nothing parses
    assert failure.shape == (1, c.agents.num_agents) and (failure == NO_JSON).all()
    assert not np.asarray(ro.parsed).any()
    t, b = failure.shape
    view = run.fns.view(ro, jnp.zeros((t, b)), jnp.zeros((t, b, 3)), jnp.zeros(()))
    view = view.replace(failure=jnp.asarray([[NO_JSON, UNKNOWN, BAD, BAD] + [OK] * (b - 4)]),
                        parsed=jnp.asarray([[False] * 4 + [True] * (b - 4)]))
    m = host.epoch_metrics(run.setup, run.text, view, {}, 1.0, 1.0)
    assert m["parse_failures"] == 4
    assert m["parse_failures_by_kind"] == {"no_json": 1, "unknown_action": 1, "bad_argument": 2}
