"""Programming problems for the code-oriented society (configs/code.py), written for jaxsocial,
and the verifiable bonus: an agent's comment answering a problem earns `bonus` when its code
passes the problem's tests in `jaxsocial.eval.sandbox`.
"""

from __future__ import annotations

import re
from typing import List, Sequence

import numpy as np

PROBLEMS = (
    dict(text="Problem: write square(x) returning x times x.",
         tests="assert square(3) == 9\nassert square(-2) == 4"),
    dict(text="Problem: write add(a, b) returning the sum.",
         tests="assert add(2, 3) == 5\nassert add(-1, 1) == 0"),
    dict(text="Problem: write is_even(n) returning True for even n.",
         tests="assert is_even(4)\nassert not is_even(7)"),
    dict(text="Problem: write rev(s) returning the string reversed.",
         tests="assert rev('abc') == 'cba'\nassert rev('') == ''"),
    dict(text="Problem: write mx(xs) returning the largest item of a list.",
         tests="assert mx([1, 5, 2]) == 5\nassert mx([-3]) == -3"),
    dict(text="Problem: write count_a(s) counting the letter a in s.",
         tests="assert count_a('banana') == 3\nassert count_a('xyz') == 0"),
    dict(text="Problem: write fact(n) returning n factorial.",
         tests="assert fact(0) == 1\nassert fact(5) == 120"),
    dict(text="Problem: write first(xs) returning the first item or None.",
         tests="assert first([4, 5]) == 4\nassert first([]) is None"),
)

TEXTS = tuple(p["text"] for p in PROBLEMS)
_SENTINEL = "__jaxsocial_tests_passed__"


def extract_code(answer: str) -> str:
    """The code of an answer: a ```python fenced block if present, else the whole text."""
    m = re.search(r"```(?:python)?\n?(.*?)(?:```|$)", answer, re.S)
    return (m.group(1) if m else answer).strip()


def verify(answers: Sequence[str], problem_ids: Sequence[int], timeout_s: float = 5.0,
           memory_mb: int = 256) -> np.ndarray:
    """[M] bool: answer m passes the tests of problem problem_ids[m] in the sandbox.

    Passing needs exit 0 *and* a sentinel printed after the tests, so an answer that exits
    early (`os._exit(0)`) is not rewarded."""
    from jaxsocial.eval import sandbox
    programs = [extract_code(a) + "\n\n" + PROBLEMS[p]["tests"] + f"\nprint({_SENTINEL!r})\n"
                for a, p in zip(answers, problem_ids)]
    results = sandbox.run_many(programs, timeout_s=timeout_s, memory_mb=memory_mb)
    return np.asarray([r.status == "passed" and _SENTINEL in r.stdout for r in results], bool)
