"""The retrieval drafter (metasd/drafting/retrieval.py): matching, draft length, scaffolding, incrementality, losslessness."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from metasd import run, target_greedy
from metasd.core.sampling import Sampling
from metasd.decoding.engine import encode_prompt, scaffold_positions
from metasd.drafting.registry import register_drafter, unregister_drafter
from metasd.drafting.retrieval import SEPARATOR, Datastore, RetrievalDrafter, datastore_for, load_datastore

GREEDY = Sampling(0.0, 1.0, 0)
LOOSE = dict(min_match=1, min_match_store=1, spec_factor=100.0, min_prob=0.0, prior=0.0)


def store(*docs: list[int], **meta) -> Datastore:
    flat = [t for d in docs for t in (*d, SEPARATOR)]
    return Datastore(flat, meta=meta)


# The settings these tests state their expectations in (not necessarily the drafter's defaults).
BASE = dict(min_match=2, min_match_store=3, max_match=32, spec_factor=1.0, min_prob=0.3, prior=0.5)


def drafter(ds: Datastore | None = None, scaffold=(), prompt=(), **params) -> RetrievalDrafter:
    d = RetrievalDrafter("retrieval", ds, **{**BASE, **params})
    d.reset(list(prompt))
    d.mark_scaffold(frozenset(scaffold))
    return d


def draft(d: RetrievalDrafter, ids: list[int], k: int = 8) -> list[int]:
    return d.propose(list(ids), k, GREEDY, None).tokens


# ---------------------------------------------------------------------------------------------
# A brute-force statement of the drafting rule, written independently of the implementation


def reference(ids, scaffold, docs, k, min_match=2, min_match_store=3, max_match=32, spec_factor=1.0,
              min_prob=0.3, prior=0.5):
    """What the drafter must propose for context `ids`: every occurrence found by direct comparison."""
    ctx = [-1 - i if i in scaffold else t for i, t in enumerate(ids)]
    n = len(ctx)
    tail = 0
    while tail < n and ctx[n - 1 - tail] >= 0:
        tail += 1

    def ctx_ends(m):
        return [e for e in range(m - 1, n - 1) if ctx[e - m + 1 : e + 1] == ctx[n - m :]]

    def cap(m):
        return min(k, int(np.ceil(spec_factor * m)))

    m = 0
    while m < min(max_match, tail) and ctx_ends(m + 1):
        m += 1
    if m >= min_match:
        ends, out, run_p = ctx_ends(m), [], 1.0
        for d in range(1, cap(m) + 1):
            seq = ctx + out
            nxt = [seq[e + d] for e in ends]
            ok = [t for t in set(nxt) if t >= 0]
            if not ok:
                break
            # most frequent; ties: the one that occurred latest
            best = max(ok, key=lambda t: (nxt.count(t), max(e for e, x in zip(ends, nxt, strict=True) if x == t)))
            run_p *= nxt.count(best) / (len(ends) + prior / m)
            if run_p < min_prob:
                break
            out.append(best)
            ends = [e for e, x in zip(ends, nxt, strict=True) if x == best]
        if out:
            return out, "context"
    if not docs or not tail:
        return [], ""
    suf = ctx[n - min(max_match, tail) :]

    def doc_ends(m):
        return [(i, e) for i, doc in enumerate(docs) for e in range(m - 1, len(doc)) if doc[e - m + 1 : e + 1] == suf[-m:]]

    m = 0
    while m < len(suf) and doc_ends(m + 1):
        m += 1
    if m < min_match_store:
        return [], ""
    occ, out, run_p = doc_ends(m), [], 1.0
    for d in range(1, cap(m) + 1):
        nxt = [docs[i][e + d] if e + d < len(docs[i]) else None for i, e in occ]
        ok = sorted({t for t in nxt if t is not None})
        if not ok:
            break
        best = max(ok, key=lambda t: (nxt.count(t), -t))  # ties: the smallest id
        run_p *= nxt.count(best) / (len(occ) + prior / m)
        if run_p < min_prob:
            break
        out.append(best)
        occ = [o for o, x in zip(occ, nxt, strict=True) if x == best]
    return out, "datastore" if out else ""


# ---------------------------------------------------------------------------------------------
# Matching and the draft-length rule


def test_matches_in_the_prompt_and_in_the_answer():
    prompt = [1, 2, 3, 4, 5, 6, 7, 9, 9]
    d = drafter(prompt=prompt, min_prob=0.0)
    assert draft(d, prompt + [3, 4, 5], 3) == [6, 7, 9]  # copied from the prompt, capped at k
    assert d.source == "context"
    answer = [20, 21, 22, 23, 24, 30, 31, 20, 21, 22]
    assert draft(d, prompt + answer) == [23, 24, 30]  # from the answer so far; spec_factor 1: 3 tokens for a 3-match
    assert draft(d, prompt + [40, 41]) == []  # nothing matches


def test_matches_in_the_datastore_and_the_context_is_preferred():
    ds = store([10, 11, 12, 13, 14, 15], [50, 51, 12, 13, 90, 91])
    d = drafter(ds, prompt=[7, 8], min_prob=0.1)
    assert draft(d, [7, 8, 10, 11, 12]) == [13, 14, 15] and d.source == "datastore"
    # The same suffix also occurs in the context, continued differently: the live text wins.
    ctx = [7, 8, 11, 12, 60, 61, 62, 3, 10, 11, 12]
    assert draft(drafter(ds, prompt=ctx), ctx) == [60, 61]  # a 2-token match drafts at most 2
    assert draft(drafter(ds, prompt=ctx, spec_factor=2.0, min_prob=0.1), ctx) == [60, 61, 62, 3]


def test_longest_then_most_frequent_continuation():
    ds = store([1, 2, 3, 40, 41], [1, 2, 3, 40, 42], [1, 2, 3, 50], [9, 2, 3, 60], [8, 2, 3, 60], [7, 2, 3, 60])
    d = drafter(ds, min_match_store=2, spec_factor=3.0, min_prob=0.0, prior=0.0)
    assert draft(d, [5, 1, 2, 3]) == [40, 41]  # the 3-token match [1 2 3] wins over the frequent [2 3] -> 60
    assert d.datastore.longest_match([5, 1, 2, 3], 32)[0] == 3
    # Only [2 3] matches: 3 of its 6 continuations are 60.
    assert draft(drafter(ds, min_match_store=2, spec_factor=3.0, min_prob=0.0, prior=0.0), [5, 5, 2, 3]) == [60]
    # The estimated probability of the path: 2/3 for 40, then 1/2 for 41 -> 1/3 in all.
    assert draft(drafter(ds, spec_factor=3.0, min_prob=0.34, prior=0.0), [5, 1, 2, 3]) == [40]
    assert draft(drafter(ds, spec_factor=3.0, min_prob=0.7, prior=0.0), [5, 1, 2, 3]) == []


def test_short_matches_propose_nothing():
    ds = store([1, 2, 3, 4, 5, 6])
    assert draft(drafter(ds), [9, 9, 2, 3]) == []  # a 2-token datastore match is below min_match_store = 3
    assert draft(drafter(ds), [9, 2, 3, 4]) == [5, 6]
    assert draft(drafter(ds, min_match_store=2), [9, 9, 2, 3]) == [4, 5]
    ctx = [5, 6, 7, 8, 5]
    assert draft(drafter(prompt=ctx), ctx) == []  # a 1-token context match is below min_match = 2
    assert draft(drafter(prompt=ctx, min_match=1, min_prob=0.0), ctx) == [6]  # and drafts ceil(1 x 1) token


def test_overlapping_repeats_continue_into_the_draft():
    ctx = [9, 1, 2, 1, 2, 1, 2]
    assert draft(drafter(prompt=ctx, spec_factor=3.0, min_prob=0.0), ctx, 6) == [1, 2, 1, 2, 1, 2]


def test_never_matches_or_copies_the_scaffold():
    # 100, 101: the template's tokens (scaffold) around the user's text [5, 6, 7].
    prompt = [100, 101, 5, 6, 7, 100, 101]
    scaffold = {0, 1, 5, 6}
    ds = store([100, 101, 102, 103], [6, 7, 100, 101])
    d = drafter(ds, scaffold=scaffold, prompt=prompt, **LOOSE)
    assert draft(d, prompt) == []  # the query is the generation prompt: scaffolding
    # The answer repeats the template's tokens: they are not the user's, so they match nothing in the prompt.
    assert draft(d, prompt + [100, 101]) == [102, 103] and d.source == "datastore"
    # The user's text ends where the scaffold begins: a copy stops there.
    out = draft(d, prompt + [5, 6, 7])
    assert out == [100, 101] and d.source == "datastore"  # from the datastore (an answer), never the prompt's 100
    d2 = drafter(None, scaffold=scaffold, prompt=prompt, **LOOSE)
    assert draft(d2, prompt + [5, 6, 7]) == []
    assert draft(d2, prompt + [4, 5, 6]) == [7]
    assert d2.predict(prompt + [4, 5, 6], len(prompt), 3, GREEDY).tolist() == [-1, -1, 6]


@pytest.mark.offline_model
def test_the_real_templates_scaffolding_is_never_drafted(offline):
    prompt = "Summarize: the assistant named Ada repairs the old clock. The assistant works at night."
    ids = encode_prompt(offline, prompt, True)
    scaffold = scaffold_positions(offline, prompt, ids, True)
    tok = offline.tokenizer
    gen_prompt = [ids[i] for i in range(len(ids)) if i in scaffold][-4:]
    ds = store(gen_prompt + gen_prompt, gen_prompt)  # a datastore that would continue the template
    d = drafter(ds, scaffold=scaffold, prompt=ids, **LOOSE)
    assert draft(d, ids) == []
    answer = tok(" The assistant", add_special_tokens=False)["input_ids"]
    out = draft(d, ids + answer)
    assert out and all(t not in tok.all_special_ids for t in out) and tok.decode(out).strip() in prompt


# ---------------------------------------------------------------------------------------------
# Incremental index and predict() against the brute-force rule


@pytest.mark.parametrize("seed", range(24))
def test_incremental_drafts_equal_the_brute_force_rule(seed):
    rng = random.Random(seed)
    alphabet = rng.randint(3, 6)
    docs = [[rng.randrange(alphabet) for _ in range(rng.randint(3, 30))] for _ in range(rng.randint(0, 8))]
    ds = store(*docs) if docs else None
    params = dict(min_match=rng.choice([1, 2]), min_match_store=rng.choice([1, 2, 3]), max_match=rng.choice([3, 32]),
                  spec_factor=rng.choice([0.5, 1.0, 3.0]), min_prob=rng.choice([0.0, 0.2, 0.5]),
                  prior=rng.choice([0.0, 0.5, 1.0]))
    prompt = [rng.randrange(alphabet) for _ in range(rng.randint(1, 25))]
    scaffold = {i for i in range(len(prompt)) if i < 3 or rng.random() < 0.15}
    d = drafter(ds, scaffold=scaffold, prompt=prompt, **params)
    ids = list(prompt)
    sources = set()
    for _ in range(60):
        k = rng.randint(1, 6)
        want, src = reference(ids, scaffold, docs, k, **params)
        assert draft(d, ids, k) == want, (ids, k)
        assert d.source == src
        sources.add(src)
        grow = [rng.randrange(alphabet) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.5:  # the engine's order: predict on the new chunk, then observe
            firsts = [reference(ids + grow[:j], scaffold, docs, 1, **params)[0] for j in range(len(grow))]
            got = d.predict(ids + grow, len(ids), len(grow), GREEDY).tolist()
            assert got == [f[0] if f else -1 for f in firsts]
        ids += grow
        if rng.random() < 0.5:
            d.observe(ids, None)
    assert "context" in sources


def test_predict_is_the_first_token_of_propose():
    rng = random.Random(7)
    docs = [[rng.randrange(5) for _ in range(20)] for _ in range(10)]
    ids = [rng.randrange(5) for _ in range(60)]
    d = drafter(store(*docs), prompt=ids[:10])
    pred = d.predict(ids, 10, 50, GREEDY).tolist()
    for j in range(10, 60):
        fresh = drafter(store(*docs), prompt=ids[:10])
        out = draft(fresh, ids[:j], 5)
        assert pred[j - 10] == (out[0] if out else -1)


def test_a_fresh_request_starts_afresh():
    d = drafter(prompt=[1, 2, 3, 1, 2])
    assert draft(d, [1, 2, 3, 1, 2]) == [3, 1]  # a 2-token match drafts at most 2
    d.reset([4, 5, 6, 4, 5])
    d.mark_scaffold(frozenset())
    assert draft(d, [4, 5, 6, 4, 5]) == [6, 4]
    assert draft(d, [7, 7, 7]) == [7, 7]  # not an extension of what was indexed: re-indexed from scratch


# ---------------------------------------------------------------------------------------------
# The datastore


def test_suffix_array_search_equals_brute_force():
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 4, rng.integers(1, 40)).tolist() for _ in range(30)]
    ds = store(*docs)
    flat = np.array([t for doc in docs for t in (*doc, SEPARATOR)])
    assert len(ds) == sum(map(len, docs)) and ds.documents == 30
    for _ in range(300):
        pat = rng.integers(0, 4, rng.integers(1, 7)).tolist()
        lo, hi = ds.find(pat)
        windows = np.lib.stride_tricks.sliding_window_view(flat, len(pat))
        assert hi - lo == int((windows == pat).all(1).sum())
        assert all(ds.values[ds.sa[i] : ds.sa[i] + len(pat)].tolist() == pat for i in range(lo, hi))
        m, lo, hi = ds.longest_match(pat, 32)
        assert m == max(j for j in range(len(pat) + 1) if j == 0 or ds.find(pat[-j:])[1] > ds.find(pat[-j:])[0])


def test_datastore_is_checked_against_the_bundle(tmp_path):
    np.save(tmp_path / "x.npy", np.array([1, 2, 3, SEPARATOR], dtype=np.uint16))
    (tmp_path / "x.json").write_text('{"target": "some/model", "target_vocab": 49152}')
    ds = load_datastore(tmp_path / "x.npy")
    assert ds is load_datastore(tmp_path / "x.npy") and len(ds) == 3  # built once per process

    class B:
        class preset:
            target = "some/model"
        target_vocab = 49152

    assert datastore_for(B, tmp_path / "x.npy") is ds
    B.target_vocab = 32
    assert datastore_for(B, tmp_path / "x.npy") is None  # made by another model: not used
    assert load_datastore(tmp_path / "missing.npy") is None
    with pytest.raises(ValueError):
        Datastore([1, -2, 3])


def test_datastore_prompts_leave_out_the_benchmark():
    from scripts.build_datastore import NearMatch, pick_prompts

    refs = ["Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences.",
            "Translate into French: The library opens at nine in the morning."]
    near = NearMatch(refs)
    assert near(refs[0]) and near("  compose an ENGAGING travel blog post about a recent trip to Hawaii, highlighting "
                                  "cultural experiences!")
    assert near("Please compose an engaging travel blog post about a recent trip to Hawaii, highlighting food.")
    assert not near("Write a Python function that counts the vowels in a string.")
    chosen, dropped = pick_prompts(30, 0, NearMatch(["Write a Python function that counts the vowels in a string."]))
    assert len(chosen) == 30 and {d for d, _ in chosen} == {"chat", "code", "math"}
    assert not any(near(p) for _, p in chosen)


# ---------------------------------------------------------------------------------------------
# Lossless in the engine (the real offline model)

LOSSLESS_PROMPTS = ["Summarize in one sentence: The city council met on Tuesday to discuss the new park. "
                    "Residents asked for more trees, a playground and benches. The council approved the plan.",
                    "Write a Python function that returns the factorial of n."]
MAX_NEW = 24


@pytest.mark.offline_model
@pytest.mark.usefixtures("one_torch_thread")  # short runs: a second thread only contends on a shared CPU
def test_greedy_output_is_the_targets_with_the_retrieval_drafter(offline):
    refs = [target_greedy(offline, encode_prompt(offline, p, True), MAX_NEW) for p in LOSSLESS_PROMPTS]
    # A datastore that knows these answers, each corrupted every 6th token: long drafts, and rejections.
    docs = [[t if i % 6 != 5 else (t + 1) % offline.target_vocab for i, t in enumerate(r)] for r in refs]
    ds = store(*docs)
    register_drafter("retrieval-test", lambda bundle: RetrievalDrafter("retrieval-test", ds), kind="model-free")
    try:
        for policy, drafters in (("single:retrieval-test", None),
                                 ("metasd-ucb", ["prompt-lookup", "token-recycling", "chat-drafter", "retrieval-test"])):
            drafted = accepted = 0
            for prompt, ref in zip(LOSSLESS_PROMPTS, refs, strict=True):
                rounds, s = run(offline, prompt, policy=policy, drafters=drafters, max_new_tokens=MAX_NEW)
                assert list(s.token_ids) == ref, policy
                mine = [r for r in rounds if r.drafter == "retrieval-test"]
                drafted += sum(len(r.draft) for r in mine)
                accepted += sum(r.accepted for r in mine)
            assert 0 < accepted < drafted, policy  # it drafted, was accepted, and was rejected too
    finally:
        unregister_drafter("retrieval-test")


@pytest.mark.offline_model
@pytest.mark.usefixtures("one_torch_thread")
def test_the_shipped_datastore_serves_the_offline_target(offline):
    ds = datastore_for(offline)
    assert ds is not None, "assets/datastore/offline.npy ships with the repository"
    assert ds.meta["target"] == offline.preset.target and len(ds) > 10_000
    assert int(ds.values[: ds.size][ds.values[: ds.size] != SEPARATOR].max()) < offline.target_vocab
    from metasd.drafting.retrieval import register

    register("retrieval")
    try:
        prompt = LOSSLESS_PROMPTS[1]
        ref = target_greedy(offline, encode_prompt(offline, prompt, True), MAX_NEW)
        _, s = run(offline, prompt, policy="single:retrieval", max_new_tokens=MAX_NEW)
        assert list(s.token_ids) == ref
        _, s = run(offline, prompt, policy="metasd-ucb", drafters=["prompt-lookup", "retrieval"],
                   max_new_tokens=12, temperature=0.8, seed=3)  # sampling runs too (deterministic drafter)
        assert s.new_tokens > 0
    finally:
        unregister_drafter("retrieval")


def test_drafts_are_plain_ids_and_q_is_none():
    d = drafter(prompt=[1, 2, 3, 1, 2])
    out = d.propose([1, 2, 3, 1, 2], 4, Sampling(0.7, 0.9, 0), torch.Generator().manual_seed(0))
    assert out.q is None and all(isinstance(t, int) for t in out.tokens)


def test_ids_a_datastore_cannot_hold_end_the_query():
    d = drafter(store([5, 6, 7, 8]), prompt=[1])
    assert draft(d, [1, 70_000, 5, 6, 7]) == [8]  # the query stops after the large id instead of failing
    assert draft(drafter(store([5, 6, 7, 8]), prompt=[1]), [1, 5, 6, 70_000]) == []


def _prefix_closed(cands) -> bool:
    paths = {p for p, _ in cands}
    return all(p[:-1] in paths for p in paths if len(p) > 1)


def test_alternatives_are_the_continuation_tree_best_first():
    # After [1 2] the context continued 3 twice and 4 once: the tree's first level is 3 (2 / 3.25), 4 (1 / 3.25).
    ctx = [1, 2, 3, 7, 1, 2, 3, 8, 1, 2, 4, 9, 5, 1, 2]
    d = drafter(prompt=ctx, min_match=1, spec_factor=4.0, min_prob=0.0)
    cands = d.alternatives(ctx, 3, 10)
    got = dict(cands)
    m = 2  # the longest match: [1 2] (the id before it differs each time)
    assert got[(3,)] == pytest.approx(2 / (3 + 0.5 / m)) and got[(4,)] == pytest.approx(1 / (3 + 0.5 / m))
    assert got[(3, 7)] == pytest.approx(got[(3,)] * 1 / (2 + 0.5 / m))
    assert [p for p, _ in cands[:2]] == [(3,), (4,)]  # best first
    assert list(cands[0][0]) == draft(d, ctx, 1)  # the chain propose gives is the tree's most probable path
    assert _prefix_closed(cands) and all(len(p) <= 3 for p, _ in cands)
    assert len(d.alternatives(ctx, 3, 2)) == 2
    ds = store([1, 2, 6, 40], [1, 2, 6, 41], [7, 2, 6, 50])
    from_store = dict(drafter(ds, min_prob=0.0, prior=0.0).alternatives([9, 1, 2, 6], 2, 10))
    assert from_store == {(40,): pytest.approx(0.5), (41,): pytest.approx(0.5)}  # the 3-token match [1 2 6]


def test_token_recycling_keeps_runner_up_successors():
    from metasd.drafting.drafters import TokenRecycling

    d = TokenRecycling(vocab_size=8)
    logits = torch.full((2, 8), -30.0)
    logits[0, [3, 4]] = torch.tensor([2.0, 1.0])  # after 1: 3 (0.73), 4 (0.27)
    logits[1, 5] = 5.0  # after 3: 5, nearly certain
    d.learn([1, 3], logits)
    assert d.propose([0, 1], 4, GREEDY, None).tokens == [3, 5]
    cands = d.alternatives([0, 1], 2, 4)
    assert [p for p, _ in cands[:3]] == [(3,), (3, 5), (4,)]
    assert dict(cands)[(3, 5)] == pytest.approx(dict(cands)[(3,)] * float(torch.softmax(logits[1], -1)[5]))
    assert _prefix_closed(cands)
    # A tree round shows it every node's row, then the kept chain's: for a token in both, the chain's row wins.
    from metasd.drafting.drafters import Verified

    rows = torch.full((3, 8), -30.0)
    rows[0, 6], rows[1, 2], rows[2, 7] = 5.0, 5.0, 5.0  # after 1: 6 (chain); after 4: 2; after 1 (a branch): 7
    d.observe([0, 1], Verified(2, [1], rows[:1], [6], tree_inputs=[1, 4, 1], tree_logits=rows))
    assert d.wide[4, 0] == 2 and d.wide[1, 0] == 6
    assert d.table[4] == -1 and d.table[1] == 6  # the chain's table: the chain's rows only (lanes replay it)
