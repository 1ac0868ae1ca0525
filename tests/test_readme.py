"""The README's example calls (the `>>>` lines) run and print what the README says, on
the CPU."""
import doctest
import re
from pathlib import Path

import torch

import dsa_ext

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_examples():
    # code fences are markdown, not expected output
    text = re.sub(r"^[ \t]*```.*$", "", README.read_text(), flags=re.M)
    test = doctest.DocTestParser().get_doctest(
        text, {"torch": torch, "dsa_ext": dsa_ext}, "README.md", str(README), 0)
    assert len(test.examples) >= 20, "the README lost its example calls"
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test, out=print)
    assert runner.failures == 0, f"{runner.failures} README example(s) differ (printed above)"
