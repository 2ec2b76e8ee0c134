"""The math domain's composed word problems: varied, whole numbers, reproducible, never a benchmark's."""

from __future__ import annotations

import random
import re

from metasd.training import corpus, word_problems
from metasd.training.train_data import math_prompts


def _shape(text: str) -> str:
    """A problem with its names and numbers blanked: what stays is its wording."""
    text = re.sub(r"\$?\d+(\.\d+)?", "N", text)
    return re.sub(r"\b(" + "|".join(word_problems.NAMES) + r")\b", "X", text)


def test_every_kind_makes_whole_non_negative_multi_step_problems():
    rng = random.Random(0)
    for kind in word_problems.KINDS:
        for _ in range(200):
            text = kind(rng)
            assert text.rstrip().endswith("?"), (kind.__name__, text)
            assert "-" not in re.sub(r"\d+-minute", "", text), (kind.__name__, text)  # no negative amounts
            assert not re.search(r"\b1 \w+s\b(?! of)", text.replace("1 hour", "")), (kind.__name__, text)
            assert len(re.findall(r"[.?]( |$)", text)) >= 2, (kind.__name__, text)  # a setting, then a question


def test_inventory_steps_are_each_of_a_different_kind():
    """No problem doubles and then doubles again: each kind of step comes at most once."""
    for seed in range(300):
        text = word_problems.inventory(random.Random(seed))
        for step in ("every day for", "as many", "what it was", "more."):
            assert text.count(step) <= 1, text
        if m := re.search(r"shared equally among (\d+) friends", text):
            assert int(m.group(1)) >= 2, text


def test_math_prompts_are_varied_and_reproducible():
    a = math_prompts(random.Random("corpus:math:7"), 256)
    assert a == math_prompts(random.Random("corpus:math:7"), 256)
    shapes = {_shape(t) for t in a}
    # The twelve one-step templates of version 1 gave at most 12 x 5 shapes; composed problems give hundreds.
    assert len(shapes) > 150, len(shapes)
    composed = sum(any(k in t for k in ("every day for", "an hour", "as many", "come in a", "% more", "% less",
                                         "km per hour", "1/", "hour on", "hours on")) for t in a)
    assert composed > 256 // 2


def test_no_composed_problem_is_held_out():
    held = corpus.HeldOut.default()
    texts = [p.text for seed in range(6) for p in corpus.domain_prompts("math", seed, 64)]
    assert sum(held.hits(t) for t in texts) == 0
