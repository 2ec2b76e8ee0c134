"""The code domain's composed tasks: varied, well formed, reproducible, never a benchmark's."""

from __future__ import annotations

import ast
import random
import re

from metasd.training import code_tasks, corpus
from metasd.training.train_data import code_prompts


def test_every_kind_makes_well_formed_tasks():
    rng = random.Random(0)
    for kind in code_tasks.KINDS:
        for _ in range(200):
            text = kind(rng)
            assert "{" not in text.split("```")[0], (kind.__name__, text)  # every placeholder filled
            assert "time time" not in text and "  " not in text.split("```")[0], (kind.__name__, text)
            assert text[0].isupper() and text.rstrip().endswith((".", "?", ":", "```")), (kind.__name__, text)


def test_review_functions_parse_and_every_bug_changes_them():
    """Each of our functions is valid Python; each bug is found in it and leaves code that still parses (a bug
    to find by reading, not a syntax error)."""
    for purpose, code, bugs in code_tasks.FUNCTIONS:
        ast.parse(code)
        assert bugs, purpose
        for good, bad in bugs:
            assert code.count(good) >= 1, (purpose, good)
            buggy = code.replace(good, bad, 1)
            assert buggy != code
            ast.parse(buggy)
    assert code_tasks._infinitive("returns the largest value") == "return the largest value"
    assert code_tasks._infinitive("checks whether") == "check whether"


def test_review_tasks_quote_the_code_with_a_bug_put_in_most_of_the_time():
    rng = random.Random(1)
    texts = [code_tasks.code_review(rng) for _ in range(300)]
    originals = {code for _, code, _ in code_tasks.FUNCTIONS}
    quoted = [re.search(r"```python\n(.*)\n```", t, re.S).group(1) for t in texts]
    buggy = sum(q not in originals for q in quoted)
    assert 0.45 < buggy / len(texts) < 0.75, buggy


def test_code_prompts_are_varied_and_reproducible():
    a = code_prompts(random.Random("corpus:code:7"), 120)
    assert a == code_prompts(random.Random("corpus:code:7"), 120)
    assert len(a) == 120 and len(set(a)) >= 110  # domain_prompts drops the rare repeat
    # Version 2: whole programs, algorithms with a complexity, reviews, web pages, classes and SQL, not only
    # one small function.
    marks = {"program": " program that ", "complexity": "complexity", "review": "```python", "web": "HTML",
             "class": " class", "sql": "SQL query"}
    for name, mark in marks.items():
        assert any(mark in t for t in a), name
    from metasd.training.train_data import SNIPPET_TEMPLATES

    heads = tuple(t.split("{code}")[0] for t in SNIPPET_TEMPLATES)
    assert sum(t.startswith(heads) for t in a) >= 120 // 6 - 2  # the standard-library snippets stay


def test_no_code_task_is_held_out():
    held = corpus.HeldOut.default()
    texts = [p.text for seed in range(6) for p in corpus.domain_prompts("code", seed, 64)]
    assert sum(held.hits(t) for t in texts) == 0
