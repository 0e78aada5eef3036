"""Programming problems for the code-oriented society (configs/code.py), written for jaxsocial,
and the verifiable bonus: an agent's comment answering a problem earns `bonus` when its function
returns the expected output on every one of the problem's input/output cases.

The verdict is decided on the host, outside the candidate's reach. The candidate's code runs in
`jaxsocial.eval.sandbox` together with a small harness that calls the function on each case's
inputs (only the inputs enter the sandbox, never the expected outputs) and writes the returned
values as JSON to the sandbox's result channel (fd 3). The host decodes that JSON and compares it
with the expected outputs itself, type-strictly (`same`): True is not 1, 1.0 is not 1, a tuple is
not a list. No exit status, printed marker or in-process assert decides anything, so

- exiting early (``os._exit(0)``) leaves no results: no bonus;
- printing or writing forged results only pays if they are the correct outputs;
- an object with a rigged ``__eq__`` cannot cross the boundary: only JSON values do;
- the sandbox's filesystem holds no copy of this file (see `sandbox.capabilities()["view"]`),
  so the expected outputs cannot be read from inside.
"""

from __future__ import annotations

import json
import re
from typing import List, Sequence

import numpy as np

from jaxsocial.eval import sandbox

# Each problem: the post text, the function's name, and (args, expected) cases as JSON values.
PROBLEMS = (
    dict(text="Problem: write square(x) returning x times x.", name="square",
         cases=(([3], 9), ([-2], 4), ([0], 0), ([12], 144), ([-7], 49), ([1001], 1002001))),
    dict(text="Problem: write add(a, b) returning the sum.", name="add",
         cases=(([2, 3], 5), ([-1, 1], 0), ([0, 0], 0), ([100, -250], -150), ([7, 7], 14))),
    dict(text="Problem: write is_even(n) returning True for even n.", name="is_even",
         cases=(([4], True), ([7], False), ([0], True), ([-3], False), ([6], True),
                ([1000000], True), ([-8], True))),
    dict(text="Problem: write rev(s) returning the string reversed.", name="rev",
         cases=((["abc"], "cba"), ([""], ""), (["a"], "a"), (["racecar"], "racecar"),
                (["hello world"], "dlrow olleh"))),
    dict(text="Problem: write mx(xs) returning the largest item of a list.", name="mx",
         cases=(([[1, 5, 2]], 5), ([[-3]], -3), ([[-1, -7, -2]], -1), ([[4, 4, 1]], 4),
                ([[0, 9, 3, 9]], 9))),
    dict(text="Problem: write count_a(s) counting the letter a in s.", name="count_a",
         cases=((["banana"], 3), (["xyz"], 0), ([""], 0), (["aAaA"], 2), (["aaaaa"], 5))),
    dict(text="Problem: write fact(n) returning n factorial.", name="fact",
         cases=(([0], 1), ([5], 120), ([1], 1), ([3], 6), ([10], 3628800))),
    dict(text="Problem: write first(xs) returning the first item or None.", name="first",
         cases=(([[4, 5]], 4), ([[]], None), ([["x"]], "x"), ([[None, 1]], None),
                ([[[1], [2]]], [1]))),
)

TEXTS = tuple(p["text"] for p in PROBLEMS)

# Runs in the sandbox: executes the candidate's source in a namespace of its own, calls the
# function on each case's arguments and writes [["ok", value] | ["error", why], ...] as JSON to
# fd 3, then exits at once (no atexit handler or lingering thread of the candidate's runs after).
# Nothing here is trusted: the host re-checks every value it reads back.
_HARNESS = r'''
import json, os
_CASES = json.loads(%(cases)r)
_SOURCE = %(source)r
_NAME = %(name)r


def _plain(v, depth=0):
    t = type(v)
    if v is None or t is bool or t is int or t is str:
        return True
    if t is float:
        return v == v and v not in (float("inf"), float("-inf"))
    if depth > 50:
        return False
    if t is list:
        return all(_plain(x, depth + 1) for x in v)
    if t is dict:
        return all(type(k) is str and _plain(x, depth + 1) for k, x in v.items())
    return False


def _results():
    ns = {"__name__": "solution"}
    try:  # top-level code may fail after defining the function (e.g. an example call)
        exec(compile(_SOURCE, "solution.py", "exec"), ns)
    except BaseException:
        pass
    fn = ns.get(_NAME)
    if not callable(fn):
        return [["error", "no function " + _NAME]] * len(_CASES)
    out = []
    for args in _CASES:
        try:
            v = fn(*args)
            out.append(["ok", v] if _plain(v) else ["error", "not a JSON value"])
        except BaseException as e:
            out.append(["error", type(e).__name__])
    return out


_data = json.dumps(_results(), allow_nan=False).encode()
while _data:
    _data = _data[os.write(3, _data):]
os._exit(0)
'''


def extract_code(answer: str) -> str:
    """The code of an answer: a ```python fenced block if present, else the whole text."""
    m = re.search(r"```(?:python)?\n?(.*?)(?:```|$)", answer, re.S)
    return (m.group(1) if m else answer).strip()


def program(code: str, problem: dict) -> str:
    """The sandboxed program for candidate `code` on `problem`: the harness around the code,
    holding the cases' arguments but not their expected outputs."""
    args = json.dumps([list(a) for a, _ in problem["cases"]])
    return _HARNESS % dict(cases=args, source=code, name=problem["name"])


def same(a, b) -> bool:
    """Type-strict equality of JSON values: bool, int, float, str, None, list and dict must
    match in type as well as value (so True != 1 and 1.0 != 1, unlike ==)."""
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def _reject_constant(name):
    raise ValueError(f"{name} is not a JSON value")


def decode(channel: bytes | None):
    """The JSON the harness wrote back, or None when it is missing or not strict JSON."""
    if not channel:
        return None
    try:
        return json.loads(channel.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError included
        return None


def passed(channel: bytes | None, problem: dict) -> bool:
    """Host-side verdict: the results read back from the sandbox are exactly one
    ["ok", expected] per case of `problem`, compared with `same`."""
    got = decode(channel)
    want = [["ok", expected] for _, expected in problem["cases"]]
    return same(got, want)


def verify(answers: Sequence[str], problem_ids: Sequence[int], timeout_s: float = 5.0,
           memory_mb: int = 256) -> np.ndarray:
    """[M] bool: answer m's function returns the expected output on every case of problem
    problem_ids[m], judged on the host from the values read back over the sandbox's result
    channel (a timed-out or over-long run earns nothing)."""

    answers, problem_ids = list(answers), list(problem_ids)
    if len(answers) != len(problem_ids):
        raise ValueError(f"{len(answers)} answers but {len(problem_ids)} problem ids")
    for p in problem_ids:
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) \
                or not 0 <= p < len(PROBLEMS):
            raise ValueError(f"problem id {p!r} is not in [0, {len(PROBLEMS)})")
    problems: List[dict] = [PROBLEMS[int(p)] for p in problem_ids]
    programs = [program(extract_code(a), pr) for a, pr in zip(answers, problems)]
    results = sandbox.run_many(programs, timeout_s=timeout_s, memory_mb=memory_mb,
                               result_channel=True)
    return np.asarray([r.status != "timeout" and not r.truncated and passed(r.channel, pr)
                       for r, pr in zip(results, problems)], bool)
