"""configs/code.py's verifiable bonus: answers to the project's problems run in the sandbox and
the host decides, from the values they return, whether they earn it.

The reference solutions live here, not in the package: the sandbox could not read them anyway
(it sees no checkout), but the package should not ship answers to its own reward."""
import json
import os

import numpy as np
import pytest

from jaxsocial.eval import sandbox
from jaxsocial.train import code_problems

REFERENCE = {
    "square": "def square(x):\n    return x * x",
    "add": "def add(a, b):\n    return a + b",
    "is_even": "def is_even(n):\n    return n % 2 == 0",
    "rev": "def rev(s):\n    return s[::-1]",
    "mx": "def mx(xs):\n    return max(xs)",
    "count_a": "def count_a(s):\n    return s.count('a')",
    "fact": "import math\ndef fact(n):\n    return math.factorial(n)",
    "first": "def first(xs):\n    return xs[0] if xs else None",
}
# Plausible near misses: each is right on some cases of its problem and wrong on at least one.
WRONG = {
    "square": "def square(x):\n    return x * abs(x)",
    "add": "def add(a, b):\n    return abs(a + b)",
    "is_even": "def is_even(n):\n    return n % 4 == 0",
    "rev": "def rev(s):\n    return ''.join(sorted(s, reverse=True))",
    "mx": "def mx(xs):\n    return xs[-1]",
    "count_a": "def count_a(s):\n    return s.lower().count('a')",
    "fact": "def fact(n):\n    return n * (n - 1) if n > 1 else 1",
    "first": "def first(xs):\n    return xs[0] if len(xs) > 1 else None",
}
FORGED_SENTINEL = ("```python\nimport os\nprint('__jaxsocial_tests_passed__', flush=True)\n"
                   "os._exit(0)\n```")
CHECKOUT_FILE = os.path.abspath(code_problems.__file__)


def _ids(*names):
    by_name = [p["name"] for p in code_problems.PROBLEMS]
    return [by_name.index(n) for n in names]


def test_extract_code_prefers_a_fenced_block():
    assert code_problems.extract_code("Here:\n```python\ndef f():\n    return 1\n```\nbye") == \
        "def f():\n    return 1"
    assert code_problems.extract_code(" def g(): pass ") == "def g(): pass"


def test_problems_are_plain_json_cases():
    assert sorted(REFERENCE) == sorted(p["name"] for p in code_problems.PROBLEMS)
    for p in code_problems.PROBLEMS:
        assert p["text"].startswith("Problem:") and f"{p['name']}(" in p["text"]
        assert len(p["cases"]) >= 5
        for args, want in p["cases"]:
            assert type(args) is list
            assert code_problems.same(json.loads(json.dumps([args, want])), [args, want])
        # Only the inputs enter the sandbox.
        assert repr(json.dumps([a for a, _ in p["cases"]])) in code_problems.program("pass", p)
    for name, output in (("square", "1002001"), ("fact", "3628800"), ("rev", "dlrow olleh")):
        assert output not in code_problems.program("pass", code_problems.PROBLEMS[_ids(name)[0]])


def test_same_is_type_strict():
    same = code_problems.same
    assert same([1, "a", None, {"k": [True, 2.5]}], [1, "a", None, {"k": [True, 2.5]}])
    for a, b in [(True, 1), (1, True), (1.0, 1), (0, False), (None, 0), ([1], (1,)),
                 ({"k": 1}, {"k": 1, "j": 2}), ([1, 2], [1]), ("1", 1)]:
        assert not same(a, b) and not same(b, a), (a, b)


def test_decode_accepts_only_strict_json():
    assert code_problems.decode(b'[["ok", 1]]') == [["ok", 1]]
    for bad in (None, b"", b"[NaN]", b"[Infinity]", b"[1,", b"\xff\xfe", b"[" * 100_000):
        assert code_problems.decode(bad) is None, bad[:20]


def test_reference_solutions_pass_and_near_misses_fail():
    names = list(REFERENCE)
    answers = [f"```python\n{REFERENCE[n]}\n```" for n in names] + [WRONG[n] for n in names]
    got = code_problems.verify(answers, _ids(*names) * 2, timeout_s=3.0)
    np.testing.assert_array_equal(got, [True] * len(names) + [False] * len(names))


def test_answers_that_fail_or_misbehave_earn_nothing():
    cases = {
        # A forged result: a sentinel and an early exit, flushed and not.
        "sentinel, flushed": (FORGED_SENTINEL, "square"),
        "sentinel": (FORGED_SENTINEL.replace(", flush=True", ""), "square"),
        "exit before the function": ("import os\nos._exit(0)\ndef fact(n): return 1", "fact"),
        "exit inside the function": ("def square(x):\n    import os; os._exit(0)", "square"),
        # Fake results on stdout and wrong ones on the result channel itself.
        "printed results": ("import json\nprint(json.dumps([['ok', 9], ['ok', 4]]))", "square"),
        "forged channel": ("import os, json\nos.write(3, json.dumps([['ok', True]] * 7).encode())"
                           "\nos._exit(0)", "is_even"),
        # Objects that claim equality with anything, or the right value in the wrong type.
        "rigged __eq__": ("class A:\n    def __eq__(self, o): return True\n    __hash__ = None\n"
                          "def square(x): return A()", "square"),
        "rigged int": ("class I(int):\n    def __eq__(self, o): return True\n    __hash__ = None\n"
                       "def square(x): return I(0)", "square"),
        # The harness's own checks switched off or its encoder replaced: the host still sees
        # either nothing (a rigged object is not JSON-encodable) or wrong values.
        "patched harness": ("import sys\nsys.modules['__main__']._plain = lambda *a: True\n"
                            "class A:\n    def __eq__(self, o): return True\n"
                            "def square(x): return A()", "square"),
        "patched json": ("import json\njson.dumps = lambda *a, **k: '[' + ', '.join("
                         "['[\"ok\", true]'] * 7) + ']'\ndef is_even(n): return True", "is_even"),
        "tuple for list": ("def first(xs):\n    return tuple(xs[0]) if xs and type(xs[0]) is list"
                           " else (xs[0] if xs else None)", "first"),
        "int for bool": ("def is_even(n): return int(n % 2 == 0)", "is_even"),
        "float for int": ("import math\ndef fact(n): return float(math.factorial(n))", "fact"),
        "nan": ("def square(x): return float('nan')", "square"),
        "no function": ("def squared(x): return x * x", "square"),
        "raises": ("def add(a, b): raise ValueError(a)", "add"),
        "loops": ("def add(a, b):\n    while True: pass", "add"),
    }
    answers, names = zip(*cases.values())
    got = code_problems.verify(list(answers), _ids(*names), timeout_s=2.0)
    assert [k for k, ok in zip(cases, got) if ok] == []
    # Control: correct code around the same tricks still earns the bonus (the tricks, not the
    # harness, are what fails), and top-level code that exits after defining it is harmless.
    ok = ["def square(x): return x * x\nimport sys\nsys.exit(3)",
          "def square(x): return x * x\nprint(square('boom'))",
          "class I(int):\n    pass\ndef square(x): return int(I(x * x))"]
    assert list(code_problems.verify(ok, _ids("square") * 3, timeout_s=2.0)) == [True] * 3


def test_the_verdict_is_the_returned_values():
    # Writing the right values over the result channel is indistinguishable from computing them:
    # the outputs are the secret, which is why the sandbox must not see this package.
    want = [["ok", e] for _, e in code_problems.PROBLEMS[_ids("square")[0]]["cases"]]
    forged = f"import os\nos.write(3, {json.dumps(want).encode()!r})\nos._exit(0)"
    wrong = [["ok", e + 1] for _, e in code_problems.PROBLEMS[_ids("square")[0]]["cases"]]
    forged_wrong = f"import os\nos.write(3, {json.dumps(wrong).encode()!r})\nos._exit(0)"
    got = code_problems.verify([forged, forged_wrong], _ids("square", "square"), timeout_s=2.0)
    assert list(got) == [True, False]


def test_the_cases_cannot_be_read_from_inside():
    if sandbox.capabilities()["view"] is None:
        pytest.skip("no private filesystem view on this host")
    reads = (f"def square(x):\n    open({CHECKOUT_FILE!r}).read()\n    return x * x")
    control = "def square(x):\n    return x * x"
    got = code_problems.verify([reads, control], _ids("square", "square"), timeout_s=2.0)
    assert list(got) == [False, True]
    r = sandbox.run(f"print(open({CHECKOUT_FILE!r}).read())", timeout_s=3.0, memory_mb=256)
    assert r.status == "failed" and "FileNotFoundError" in r.stderr and r.stdout == ""


def test_bad_arguments():
    with pytest.raises(ValueError, match="problem id 8"):
        code_problems.verify(["x"], [len(code_problems.PROBLEMS)])
    with pytest.raises(ValueError, match="problem id -1"):
        code_problems.verify(["x"], [-1])
    with pytest.raises(ValueError, match="2 answers but 1 problem ids"):
        code_problems.verify(["x", "y"], [0])
    assert list(code_problems.verify([], [])) == []
