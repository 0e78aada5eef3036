"""configs/code.py's verifiable bonus: answers to the project's problems run in the sandbox."""
import numpy as np

from jaxsocial.train import code_problems


def test_extract_code_prefers_a_fenced_block():
    assert code_problems.extract_code("Here:\n```python\ndef f():\n    return 1\n```\nbye") == \
        "def f():\n    return 1"
    assert code_problems.extract_code(" def g(): pass ") == "def g(): pass"


def test_correct_answers_pass_and_wrong_ones_fail():
    answers = ["def square(x):\n    return x * x",
               "def square(x):\n    return x + x",
               "```python\ndef rev(s):\n    return s[::-1]\n```",
               "import os\nos._exit(0)\ndef fact(n): return 0",  # exits 0 before the tests run
               "while True: pass"]
    problems = [0, 0, 3, 6, 1]
    got = code_problems.verify(answers, problems, timeout_s=2.0)
    # Exiting 0 before the tests run is not a pass (a reward hack the bonus must not pay).
    np.testing.assert_array_equal(got, [True, False, True, False, False])
    for p in code_problems.PROBLEMS:
        assert p["text"].startswith("Problem:") and "assert" in p["tests"]
