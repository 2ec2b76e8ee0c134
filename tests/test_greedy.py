"""Greedy MetaSD output equals the target's own greedy `generate`, token for token."""

from __future__ import annotations

import random

import pytest
import torch

from metasd import run, target_greedy
from metasd.bandits.policies import POLICIES
from metasd.decoding.engine import encode_prompt
from metasd.models.presets import PRESETS
from tests.tiny import tiny_bundle

# Varied prompts: copying, translation, code, maths, chat, lists, odd Unicode.
PROMPTS = [
    ("Summarize in one sentence: The city council met on Tuesday to discuss the new park. "
     "Residents asked for more trees, a playground and benches. The council approved the plan.", True),
    ("Translate to French: The weather is nice today and the children are playing outside.", True),
    ("Write a Python function that returns the factorial of n.", True),
    ("What is 17 + 25? Explain step by step.", True),
    ("Tell me a short joke about computers.", True),
    ("Réponds en une phrase : quelle est la capitale de l'Italie ? 🇮🇹", True),
    ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", False),
    ("The quick brown fox jumps over the lazy dog. The quick brown fox", False),
    ("1, 2, 3, 4, 5, 6, 7,", False),
    ("Question: Who wrote Hamlet?\nAnswer:", False),
]
MAX_NEW = 24
# On the real model: every drafter whose losslessness is not checked there elsewhere (the trained drafters and
# heads are, in test_distilled.py and test_whitebox.py), and the page's policy, the paper's, the token tree and
# a randomised one. Every policy is checked on tiny models below, over many seeds.
TRAINED = {"distilled", "white-box"}
METHODS = [f"single:{d.name}" for d in PRESETS["offline"].drafters if d.kind not in TRAINED] + [
    "metasd-ucb-cost", "metasd-ucb", "metasd-tree", "exp3"]


@pytest.fixture(scope="module")
def references(offline, reference_model):
    refs = []
    for prompt, chat in PROMPTS:
        ids = encode_prompt(offline, prompt, chat)
        inp = torch.tensor([ids])
        out = reference_model.generate(inp, attention_mask=torch.ones_like(inp), do_sample=False,
                                       max_new_tokens=MAX_NEW, eos_token_id=sorted(offline.eos_ids),
                                       pad_token_id=sorted(offline.eos_ids)[0])
        refs.append(out[0, len(ids):].tolist())
    return refs


@pytest.mark.offline_model
@pytest.mark.parametrize("method", METHODS)
def test_offline_greedy_identical(offline, references, method):
    for (prompt, chat), ref in zip(PROMPTS, references, strict=True):
        _, summary = run(offline, prompt, policy=method, max_new_tokens=MAX_NEW, chat_template=chat)
        assert list(summary.token_ids) == ref, f"{method} differs from the target on {prompt[:40]!r}"


@pytest.mark.offline_model
def test_offline_greedy_full_info_and_rewards(offline, references):
    # Full-information scoring and every reward kind only change which drafter is chosen.
    for reward in ("bd", "be", "throughput"):
        for (prompt, chat), ref in list(zip(PROMPTS, references, strict=True))[:4]:
            rounds, s = run(offline, prompt, policy="metasd-ucb", reward=reward, full_info=True,
                            max_new_tokens=MAX_NEW, chat_template=chat)
            assert list(s.token_ids) == ref
            assert s.regret_measured and all(r.regret_measured for r in rounds)
            assert all(v is not None for r in rounds for v in r.rewards.values())


@pytest.mark.offline_model
def test_offline_target_untouched_by_self_drafter(offline):
    # The layer-skip drafter shares the target's weights; the target must keep all its layers.
    assert len(offline.target.model.layers) == offline.target.config.num_hidden_layers == 30
    assert len(offline.models["layer-skip"].model.layers) == 20


def test_tiny_greedy_many_seeds_and_switch_patterns():
    """Random switching between every drafter kind, many seeds, gammas and drafter qualities."""
    policies = [p for p in POLICIES if p != "metasd-tree"]  # the tree's own: tests/test_tree.py
    for seed in range(24):
        rng = random.Random(seed)
        bundle = tiny_bundle(vocab=24, seed=seed, noise=rng.choice([0.05, 0.3, 1.0]), scale=rng.choice([1.0, 6.0]))
        prompt = [rng.randrange(24) for _ in range(rng.randrange(1, 12))]
        prompt = prompt + prompt[: rng.randrange(len(prompt) + 1)]  # repeats give prompt lookup matches
        n = rng.randrange(1, 48)
        ref = target_greedy(bundle, prompt, n)
        for policy in policies:
            gamma = rng.randrange(1, 8)
            rounds, s = run(bundle, prompt, policy=policy, gamma=gamma, max_new_tokens=n, seed=seed,
                            full_info=rng.random() < 0.5, sleeping=rng.random() < 0.7)
            assert list(s.token_ids) == ref, (seed, policy, gamma)
            assert s.new_tokens == n == sum(len(r.emitted) for r in rounds)
            assert all(len(r.draft) <= gamma and r.accepted <= len(r.draft) for r in rounds)


def test_tiny_greedy_mismatched_vocab_sizes():
    """Drafters whose embedding tables are larger or smaller than the target's (shared tokenizer ids)."""
    for drafter_vocab in (48, 36):
        bundle = tiny_bundle(vocab=40, seed=3, noise=0.1, drafter_vocab=drafter_vocab, tokenizer_vocab=36)
        prompt = [1, 5, 9, 2, 5, 9]
        ref = target_greedy(bundle, prompt, 40)
        rounds, s = run(bundle, prompt, policy="single:tiny-lm", max_new_tokens=40)
        assert list(s.token_ids) == ref
        assert sum(r.accepted for r in rounds) > 0, "a close drafter should have some drafts accepted"
        assert all(t < 36 for r in rounds for t in r.draft), "drafters propose only the tokenizer's ids"


def test_eos_stops_like_generate():
    bundle = tiny_bundle(vocab=16, seed=5, scale=4.0)
    prompt = [3, 1, 4, 1, 5]
    free = target_greedy(bundle, prompt, 30)
    eos = free[7]  # a token the target emits: make it the end-of-sequence token
    bundle.target.generation_config.eos_token_id = eos
    ref = target_greedy(bundle, prompt, 30)
    for policy in ("single:tiny-lm", "single:prompt-lookup", "round-robin"):
        _, s = run(bundle, prompt, policy=policy, max_new_tokens=30)
        assert list(s.token_ids) == ref and s.token_ids[-1] == eos and s.stop_reason == "eos"


def test_sleeping_arms_pull_prompt_lookup_only_with_a_draft():
    """A model-free drafter with nothing to propose is asleep: the bandit pulls another arm."""
    bundle = tiny_bundle(vocab=24, seed=4, noise=0.3)
    prompt = [3, 9, 14, 2, 7, 3, 9, 20, 5]  # one repeat: prompt lookup matches only sometimes
    empty = {}
    for sleeping in (True, False):
        rounds, s = run(bundle, prompt, drafters=["prompt-lookup", "tiny-lm"], policy="metasd-ucb",
                        max_new_tokens=40, sleeping=sleeping)
        assert list(s.token_ids) == target_greedy(bundle, prompt, 40)
        assert s.config["sleeping_arms"] is sleeping
        empty[sleeping] = sum(1 for r in rounds if r.drafter == "prompt-lookup" and not r.draft)
    assert empty[True] == 0
    assert empty[False] > 0  # the check has power: without sleeping arms it does pull it empty


def test_default_arms_come_from_the_preset(offline):
    """With no drafters named, the bandit plays the preset's default arms; single:<d> adds its own."""
    assert "layer-skip" in offline.drafter_names and "layer-skip" not in offline.default_drafters
    _, s = run(offline, "Hi", max_new_tokens=2)
    assert s.config["drafters"] == offline.default_drafters
    _, s = run(offline, "Hi", max_new_tokens=2, policy="single:layer-skip")
    assert s.config["drafters"] == [*offline.default_drafters, "layer-skip"]


@pytest.mark.offline_model
def test_prompt_lookup_never_drafts_the_chat_templates_scaffolding(offline):
    """The template's system turn, role names and generation prompt are not the user's text: prompt lookup
    neither matches on them nor copies them (the first round used to draft "assistant" and be rejected)."""
    from metasd.core.sampling import Sampling
    from metasd.decoding.engine import scaffold_positions
    from metasd.drafting.drafters import PromptLookup

    prompt = "Summarize: the assistant named Ada repairs the old clock. The assistant works at night."
    ids = encode_prompt(offline, prompt, True)
    scaffold = scaffold_positions(offline, prompt, ids, True)
    tok = offline.tokenizer
    user = tok.decode([t for i, t in enumerate(ids) if i not in scaffold])
    assert user.strip() == prompt, user  # exactly the user's message is content
    assert "<|im_start|>" in tok.decode([ids[i] for i in sorted(scaffold)])
    pl = PromptLookup()
    pl.reset(ids)
    s = Sampling(0.0, 1.0, 0)
    # Without the mark, the generation prompt ("assistant" + newline) matches the system turn and gets drafted.
    assert pl.propose(ids, 8, s, None).tokens
    pl.mark_scaffold(scaffold)
    assert pl.propose(ids, 8, s, None).tokens == [], "the query is scaffolding: nothing to propose"
    # Once the answer has begun, copies come from the user's text and stop where it ends.
    answer = tok(" The assistant", add_special_tokens=False)["input_ids"]
    draft = pl.propose(ids + answer, 8, s, None).tokens
    assert draft and all(t not in tok.all_special_ids for t in draft)
    assert tok.decode(draft).strip() in prompt
    assert all(t >= -1 for t in pl.predict(ids + answer, len(ids), len(answer), s).tolist())


def test_adaptive_caps_only_when_asked():
    """Off by default, every round asks the arm for gamma ids (or the budget's rest); `adaptive=True` caps an
    arm's next draft at the accepted count + 1 after a rejection. Both give the target's own output."""
    bundle = tiny_bundle(vocab=24, seed=3)
    prompt = [3, 9, 14, 2, 7, 3, 9, 14, 2, 5]  # repeats: prompt lookup drafts whole copies, some of them wrong
    n, gamma = 60, 5
    ref = target_greedy(bundle, prompt, n)
    longest_after_a_miss = {}
    for adaptive in (False, True):
        kw = {"adaptive": True} if adaptive else {}
        rounds, s = run(bundle, prompt, policy="single:prompt-lookup", gamma=gamma, max_new_tokens=n, **kw)
        assert list(s.token_ids) == ref and s.config["adaptive_gamma"] is adaptive
        after = [(prev.accepted, len(r.draft)) for prev, r in zip(rounds, rounds[1:], strict=False)
                 if prev.accepted < len(prev.draft)]
        assert after, "the drafter must miss somewhere for this test to say anything"
        longest_after_a_miss[adaptive] = max(k - a for a, k in after)
    assert longest_after_a_miss[True] <= 1  # capped at accepted + 1
    assert longest_after_a_miss[False] > 1  # the default drafts past that cap: the check has power
