"""The chat domain's composed prompts (versions 2 and 3): well formed, of every kind, reproducible, held out."""

from __future__ import annotations

import random
from collections import Counter

from metasd.training import chat_tasks, corpus


def test_every_kind_makes_well_formed_prompts():
    rng = random.Random(0)
    for kind in chat_tasks.KINDS:
        for _ in range(300):
            text = kind(rng)
            assert "{" not in text and "}" not in text, (kind.__name__, text)  # every placeholder filled
            assert "  " not in text and ".." not in text and " ." not in text, (kind.__name__, text)
            assert text[0].isalpha() and text[-1] in ".?:" or kind is chat_tasks.short_question, text


def test_writing_pairs_each_form_with_subjects_it_suits():
    """A form is asked only about subjects of its kinds (no film review of a retiring colleague), and every form
    and every subject has a partner."""
    kinds = {k for _, _, ks in chat_tasks.FORMS for k in ks.split()}
    assert kinds == {kind for _, kind, _ in chat_tasks.SUBJECTS}
    by_kind = {k: {s for s, kind, _ in chat_tasks.SUBJECTS if kind == k} for k in kinds}
    rng = random.Random(1)
    seen_forms = Counter()
    for _ in range(2000):
        text = chat_tasks.writing(rng)
        form = next(f for f, _, _ in sorted(chat_tasks.FORMS, key=lambda f: -len(f[0])) if f" {f} " in text)
        fits = next(ks for f, _, ks in chat_tasks.FORMS if f == form).split()
        assert any(s in text for k in fits for s in by_kind[k]), text
        seen_forms[form] += 1
    assert len(seen_forms) == len(chat_tasks.FORMS)


def test_the_chat_domain_is_mostly_composed_and_reproducible():
    a = [p.text for p in corpus.domain_prompts("chat", 119, 64)]
    assert a == [p.text for p in corpus.domain_prompts("chat", 119, 64)]
    assert a != [p.text for p in corpus.domain_prompts("chat", 125, 64)]
    assert corpus.PROMPTS_VERSION["chat"] == chat_tasks.CHAT_PROMPTS_VERSION == 3
    rng = random.Random("corpus:chat:119")  # domain_prompts' own draw: its composed prompts come first
    composed = [chat_tasks.chat_task(rng) for _ in range(64 - 64 // 4)]
    assert sorted(composed) != sorted(a) and set(composed) <= set(a)  # three in four composed, then shuffled
    assert a[: len(composed)] != composed


def test_held_out_check_drops_a_chat_prompt_close_to_a_benchmark_one():
    """The corpus drops every prompt sharing 8 words with a benchmark prompt or page example (make_shard); a
    composed role-play that echoes one is caught, and nearly all chat prompts pass."""
    rng = random.Random(3)
    prompt = chat_tasks.roleplay(rng)
    echo = corpus.HeldOut(["Please " + " ".join(prompt.split()[:9]) + " and more words of the benchmark"])
    assert echo.hits(prompt)
    held = corpus.HeldOut.default()
    texts = [p.text for seed in range(119, 119 + 6 * 6, 6) for p in corpus.domain_prompts("chat", seed, 64)]
    assert sum(held.hits(t) for t in texts) <= 0.05 * len(texts)


def test_everyday_asks_for_explanations_and_advice_none_a_page_example():
    """Version 3's kind covers its five shapes, and none of its prompts is held out (the page's qa and chat
    examples are of these shapes, so the check would catch a copied one)."""
    rng = random.Random(4)
    texts = [chat_tasks.everyday(rng) for _ in range(600)]
    assert any(t.startswith("Why ") for t in texts)
    assert any(" work?" in t or "happens inside" in t for t in texts)
    assert any("difference between" in t or " tell " in t or "the same as" in t for t in texts)
    assert any(any(s[1:20] in t for s, _ in chat_tasks.ADVICE) for t in texts)  # first person, any greeting
    assert any("suggest" in t or "What are" in t for t in texts)
    held = corpus.HeldOut.default()
    assert not any(held.hits(t) for t in texts)
    assert len(set(texts)) > 300  # varied, not a handful of lines repeated
