"""Token-tree rounds (metasd/decoding/tree.py, policy metasd-tree): the tree, its mask and positions, one
pass that equals each branch's own chain pass, greedy identity, the target's distribution when
sampling (chi-square against exact probabilities), and caches equal to a fresh prefill."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import DynamicCache

from metasd import run, target_greedy
from metasd.bandits.policies import Choice, MetaSDTree
from metasd.core.passes import solo
from metasd.core.sampling import Sampling
from metasd.decoding import tree as T
from metasd.drafting.drafters import ModelDrafter
from tests.test_cache import assert_same_kv, fresh_kv
from tests.tiny import tiny_bundle, tiny_llama


def test_branches_merge_into_a_prefix_tree():
    t = T.build_tree([T.Branch(0, [5, 6, 7]), T.Branch(1, [5, 6, 9]), T.Branch(2, [8]), T.Branch(3, [5])])
    assert t.tokens == [5, 6, 7, 9, 8]
    assert t.parents == [-1, 0, 1, 1, -1]
    assert t.depths == [1, 2, 3, 3, 1]
    assert t.proposers[0] == {0: 0, 1: 0, 3: 0} and t.proposers[3] == {1: 2}
    assert t.paths == {0: [0, 1, 2], 1: [0, 1, 3], 2: [4], 3: [0]}
    assert t.children[-1] == [0, 4] and t.children[1] == [2, 3]
    assert T.tree_shares(t) == pytest.approx({0: (1 / 3 + 1 / 2 + 1) / 5, 1: (1 / 3 + 1 / 2 + 1) / 5, 2: 1 / 5,
                                              3: 1 / 3 / 5})
    assert T.credit(t, [0, 1, 3]) == pytest.approx({0: 1 / 3 + 1 / 2, 1: 1 / 3 + 1 / 2 + 1, 3: 1 / 3})
    assert T.lead_arm(t, [0, 1, 3], [0, 1, 2, 3]) == 1
    assert T.lead_arm(t, [0], [3, 0, 1, 2]) == 0  # the longest branch holding the deepest accepted node
    assert T.lead_arm(t, [], [2, 0]) == 2


def test_extra_candidates_fill_the_room_most_probable_first():
    lead = [T.Branch(0, [5, 6])]
    cands = [(1, (3, 4), 0.95), (1, (5,), 0.9), (1, (8,), 0.6), (1, (5, 7), 0.5), (2, (8, 9), 0.2)]
    extra = T.grow(lead, cands, room=2)
    # (3, 4) waits for (3,), (5,) is in the tree: then 8 and 5 -> 7, each a leaf of its own branch
    assert [(b.arm, b.tokens, b.extra, b.q) for b in extra] == [(1, [8], True, None), (1, [5, 7], True, None)]
    assert [b.tokens for b in T.grow(lead, cands, room=9)] == [[5, 7], [8, 9]]  # 8 -> 9 makes 8 inner
    assert [b.tokens for b in T.grow(lead, cands, room=9, worth=lambda p, n: p > 0.55)] == [[8]]
    assert [b.tokens for b in T.grow(lead, cands, room=9, worth=lambda p, n: n < 3)] == [[8]]  # 2 nodes + 1
    t = T.build_tree(lead + extra)
    assert t.paths == {0: [0, 1]} and t.branch_nodes == [[0, 1], [2], [0, 3]]  # extras: not the arm's chain
    assert t.proposers[0] == {0: 0, 1: 0}  # arm 1 proposed 5 too (its candidates are prefix-closed)
    assert T.lead_arm(t, [0, 3], [0, 1]) == 1 and T.kept_branch(t, lead + extra, [0, 3], 1) == 2
    assert T.lead_arm(t, [0], [0, 1]) == 0 and T.kept_branch(t, lead + extra, [0], 0) == 0


def test_mask_and_positions():
    t = T.build_tree([T.Branch(0, [5, 6, 7]), T.Branch(1, [5, 9]), T.Branch(2, [8])])
    # nodes: 0:5 (d1), 1:6 (d2), 2:7 (d3), 3:9 (d2), 4:8 (d1)
    assert T.tree_positions(t, 10).tolist() == [[9, 10, 11, 12, 11, 10]]
    see = T.tree_visibility(t).int().tolist()
    assert see == [[1, 0, 0, 0, 0, 0],
                   [1, 1, 0, 0, 0, 0],
                   [1, 1, 1, 0, 0, 0],
                   [1, 1, 1, 1, 0, 0],
                   [1, 1, 0, 0, 1, 0],
                   [1, 0, 0, 0, 0, 1]]
    m = T.tree_mask(t, past=3)
    assert m.shape == (1, 1, 6, 9)
    assert (m[0, 0, :, :3] == 0).all()  # every row sees the whole cache
    assert ((m[0, 0, :, 3:] == 0) == T.tree_visibility(t)).all()
    assert (m[m != 0] == torch.finfo(torch.float32).min).all()


def _prefill(model, ids):
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids[:-1]]), past_key_values=cache, use_cache=True)
    return cache


@pytest.mark.parametrize("seed", range(3))
def test_one_tree_pass_equals_each_branch_alone_and_the_cache_keeps_a_path(seed):
    rng = random.Random(seed)
    model = tiny_llama(vocab=24, layers=2, seed=seed)
    ids = [rng.randrange(24) for _ in range(9)]
    branches = [T.Branch(a, [rng.randrange(3) for _ in range(rng.randrange(1, 5))]) for a in range(4)]
    t = T.build_tree(branches)
    cache = _prefill(model, ids)
    with torch.inference_mode():
        logits, _ = T.forward_tree(model, cache, ids[-1], t, len(ids))
        for b in branches:
            chain = model(input_ids=torch.tensor([ids + b.tokens])).logits[0, len(ids) - 1:]
            rows = [0] + [n + 1 for n in t.paths[b.arm]]
            torch.testing.assert_close(logits[rows], chain, atol=1e-4, rtol=1e-4)
    kept = branches[seed % 2 - 1]  # the first branch (a crop does it) or the last (a gather)
    path = t.paths[kept.arm][: rng.randrange(0, len(kept.tokens) + 1)]
    T.keep_rows(cache, len(ids) - 1, [0] + [n + 1 for n in path])
    assert_same_kv(cache, fresh_kv(model, ids + [t.tokens[n] for n in path]), "tree cache after keep_rows")


def _full_trees(monkeypatch):
    """Make metasd-tree put every awake arm in at its full length: large trees, many branches."""

    def full(self, awake, kmax, ms, cost, budget):
        m = self._awake(awake)
        depths = tuple(int(k) if m[i] else 0 for i, k in enumerate(kmax))
        lead = int(np.argmax(depths))
        return Choice(lead, [d / max(sum(depths), 1) for d in depths], depths=depths)

    monkeypatch.setattr(MetaSDTree, "decide_tree", full)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("full", [False, True])
def test_greedy_equals_the_targets_own_greedy(seed, full, monkeypatch):
    if full:
        _full_trees(monkeypatch)
    rng = random.Random(seed)
    bundle = tiny_bundle(vocab=20, seed=seed, noise=rng.choice([0.1, 0.4]), layers=2)
    prompt = [rng.randrange(20) for _ in range(rng.randrange(4, 12))] * 2
    rounds, s = run(bundle, prompt, policy="metasd-tree", max_new_tokens=40, gamma=rng.randrange(2, 6), seed=seed)
    assert list(s.token_ids) == target_greedy(bundle, prompt, 40)
    assert s.ids_verified == sum(r.ids_verified for r in rounds)
    for r in rounds:  # the chain's fields describe the kept path
        assert list(r.emitted[: r.accepted]) == list(r.draft[: r.accepted])
        assert r.ids_verified <= max(r.tree_budget, 1) or full
        assert sum(r.credit.values()) == pytest.approx(r.accepted)
    if full:
        assert sum(len(r.branches) for r in rounds) > 0


@pytest.mark.parametrize("seed", range(3))
def test_caches_match_fresh_prefill_after_tree_rounds(seed, monkeypatch):
    _full_trees(monkeypatch)
    rng = random.Random(seed)
    bundle = tiny_bundle(vocab=20, seed=seed, noise=0.3, layers=3)
    prompt = [rng.randrange(20) for _ in range(10)] * 2
    seen = {"rounds": 0, "branches": 0}

    def inspect(cache, ids, drafters):
        seen["rounds"] += 1
        assert_same_kv(cache, fresh_kv(bundle.target, ids[:-1]), f"target after round {seen['rounds']}")
        for d in drafters:
            if isinstance(d, ModelDrafter) and d.cached:
                assert_same_kv(d.cache, fresh_kv(d.model, d.cached, d.offset), f"{d.name} after round {seen['rounds']}")

    for temperature in (0.0, 1.0):
        rounds, _ = run(bundle, prompt, policy="metasd-tree", max_new_tokens=30, temperature=temperature, seed=seed,
                        inspect=inspect)
        seen["branches"] += sum(len(r.branches) for r in rounds)
    assert seen["rounds"] > 5 and seen["branches"] > 0, seen


# ---- sampling: the emitted ids have the target's distribution ------------------------------------

V = 4


def _table(seed: int, zeros: bool) -> dict[tuple[int, ...], torch.Tensor]:
    """A random distribution over V ids for every context of up to 3 ids (some ids 0 when asked)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n in range(4):
        for ctx in itertools.product(range(V), repeat=n):
            w = torch.rand(V, generator=g) ** 2
            if zeros:
                w[torch.randperm(V, generator=g)[: V // 2]] = 0.0
            out[ctx] = w / w.sum()
    return out


def _draw(q: torch.Tensor, g: torch.Generator) -> int:
    return int(torch.multinomial(q, 1, generator=g).item())


def _one_sample(p_tab, q_tabs, det_tabs, s, g, alt_tabs=()) -> tuple[int, int]:
    """One tree round over the context (), then the target itself to make two ids."""
    branches = []
    for a, qt in enumerate(q_tabs):  # sampled drafters: a chain drawn from their own q
        toks, rows = [], []
        for _ in range(3):
            q = qt[tuple(toks)]
            rows.append(q)
            toks.append(_draw(q, g))
        branches.append(T.Branch(a, toks, torch.stack(rows)))
    for a, dt in enumerate(det_tabs, start=len(q_tabs)):  # deterministic: the table's argmax chain
        toks = []
        for _ in range(2):
            toks.append(int(dt[tuple(toks)].argmax()))
        branches.append(T.Branch(a, toks))
    for a, tabs in enumerate(alt_tabs, start=len(q_tabs)):  # the first deterministic arm's other candidates
        for rank in range(1, 3):  # its second and third choice at the root, each continued by its argmax
            first = int(tabs[()].argsort(descending=True)[rank])
            branches.append(T.Branch(a, [first, int(tabs[(first,)].argmax())], extra=True))
    t = T.build_tree(branches)
    ctxs = [()] + [tuple(t.tokens[m] for m in t.ancestors(n)) for n in range(len(t))]
    logits = torch.stack([p_tab[c].clamp_min(1e-12).log() for c in ctxs])  # warp at T=1 gives p back
    v = T.verify_sampled(logits, t, branches, s, g)
    out = [t.tokens[n] for n in v.path] + [v.token]
    while len(out) < 2:
        out.append(_draw(p_tab[tuple(out)], g))
    return out[0], out[1]


@pytest.mark.parametrize("case", ["sampled", "deterministic", "mixed_with_zeros", "same_drafter_twice",
                                  "extra_candidates"])
def test_tree_sampling_keeps_the_targets_distribution(case):
    s = Sampling(temperature=1.0)
    p_tab = _table(0, zeros=False)
    q_tabs = {"sampled": [_table(1, False), _table(2, False)], "deterministic": [],
              "mixed_with_zeros": [_table(3, True)], "same_drafter_twice": [_table(4, True), _table(4, True)],
              "extra_candidates": [_table(8, True)]}[case]
    det_tabs = {"sampled": [], "deterministic": [_table(5, False), _table(6, False), p_tab],
                "mixed_with_zeros": [_table(7, False)], "same_drafter_twice": [p_tab], "extra_candidates": [p_tab]}[case]
    alt_tabs = [p_tab] if case == "extra_candidates" else []  # the same arm's runner-ups: every root id tried
    g = torch.Generator().manual_seed(123)
    n = 6000
    counts: dict[tuple[int, int], int] = {}
    for _ in range(n):
        x = _one_sample(p_tab, q_tabs, det_tabs, s, g, alt_tabs)
        counts[x] = counts.get(x, 0) + 1
    exact = {(a, b): float(p_tab[()][a] * p_tab[(a,)][b]) for a in range(V) for b in range(V)}
    cells = [c for c in exact if exact[c] * n >= 5]
    obs = [counts.get(c, 0) for c in cells] + [n - sum(counts.get(c, 0) for c in cells)]
    exp = [exact[c] * n for c in cells] + [n - sum(exact[c] * n for c in cells)]
    if exp[-1] < 1e-9:
        obs, exp = obs[:-1], exp[:-1]
    assert chisquare(obs, np.array(exp) * sum(obs) / sum(exp)).pvalue > 1e-3, (counts, exact)


# ---- exact enumeration: every draw of a whole sampled tree round, summed --------------------------


class _Oracle:
    """Stands in for every random draw of one round (the drafters', each acceptance, the last id): the draws
    follow `script` (indices into each draw's outcomes), then the first possible outcome, noting the others so
    that `enumerate_rounds` runs each of them too. `weight`: the probability of the draws taken."""

    def __init__(self, script: list[int]):
        self.script, self.taken, self.branches, self.weight = script, [], [], 1.0

    def choose(self, probs: list[float]) -> int:
        j = len(self.taken)
        possible = [i for i, pr in enumerate(probs) if pr > 0]
        c = self.script[j] if j < len(self.script) else possible[0]
        if j >= len(self.script):
            self.branches += [self.taken + [alt] for alt in possible[1:]]
        self.taken.append(c)
        self.weight *= probs[c]
        return c


def enumerate_rounds(play) -> dict:
    """The exact distribution of `play(oracle)`'s outcome over every sequence of draws."""
    dist: dict = {}
    todo: list[list[int]] = [[]]
    while todo:
        o = _Oracle(todo.pop())
        out = play(o)
        dist[out] = dist.get(out, 0.0) + o.weight
        todo += o.branches
    return dist


class _ToyArm:
    """A drafter of the toy round: deterministic (model-free, a fixed chain and fixed other candidates), or
    sampled from its own table of q, stopping early on its own draws (`stop(token) -> bool`), as a model drafter
    stops when its confidence falls."""

    ms_per_token = 0.0

    def __init__(self, chain=(), q=None, stop=None, alternatives=()):
        self.chain, self.q, self.stop, self.alts = list(chain), q, stop, list(alternatives)
        self.model_free = q is None
        self.oracle: _Oracle | None = None

    def attach(self, cache, ids) -> None:
        pass

    def propose_steps(self, ids, k, s, generator):
        return self.propose(ids, k, s, generator)
        yield  # a generator that asks for nothing

    def propose(self, ids, k, s, generator):
        from metasd.drafting.drafters import Draft

        if self.q is None:
            return Draft(self.chain[:k], None)
        toks, rows = [], []
        while len(toks) < k:
            q = self.q[tuple(toks)]
            rows.append(q)
            toks.append(self.oracle.choose(q.tolist()))
            if self.stop(toks[-1]):
                break
        return Draft(toks, torch.stack(rows))

    def alternatives(self, ids, k, n):
        return self.alts[:n]


def _toy_round_distribution(p_tab: dict, arms: list[_ToyArm], depths: tuple[int, ...], budget: int) -> dict:
    """Exactly what the first two emitted ids of a sampled tree round are (the round as the engine plays it:
    tree_round.draft_tree with its extras, then tree.verify_sampled; the target itself supplies a second id
    where the round emitted one)."""
    from types import SimpleNamespace

    from metasd.decoding import tree_round

    s = Sampling(temperature=1.0)
    req = SimpleNamespace(arms=arms, pre={}, ids=[0], cache=None, s=s, g_draft=None, g_target=None,
                          st=SimpleNamespace(gamma=4), budget=8, verify_cost=lambda n: 1.0,
                          policy=SimpleNamespace(extra_scale=lambda i: 1.0))

    def play(o: _Oracle) -> tuple[int, int]:
        for a in arms:
            a.oracle = o
        t = tree_round.TreeRound(depths, budget, [1.0 / len(arms)] * len(arms))
        solo(tree_round.draft_tree(req, t), lambda part: None)  # toy arms ask for no forward
        tree = t.tree
        ctxs = [()] + [tuple(tree.tokens[m] for m in tree.ancestors(n)) for n in range(len(tree))]
        logits = torch.stack([p_tab[c].double().clamp_min(1e-300).log() for c in ctxs])
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(T, "accepts", lambda chance, g, device="cpu": o.choose([chance, 1.0 - chance]) == 0)
            mp.setattr(T, "draw", lambda p, g: o.choose(p.tolist()))
            mp.setattr(T, "warp", lambda lg, s: (lg.double() / s.temperature).softmax(-1))  # float64 throughout
            v = T.verify_sampled(logits, tree, t.branches, s, None)
        out = [tree.tokens[n] for n in v.path] + [v.token]
        if len(out) < 2:
            out.append(o.choose(p_tab[tuple(out)].double().tolist()))
        return out[0], out[1]

    return enumerate_rounds(play)


def _double(tab: dict) -> dict:
    """A table in float64, each row summing to 1 to the last bit float64 allows (exact to 1e-9 needs it)."""
    return {k: v.double() / v.double().sum() for k, v in tab.items()}


def _toy_case() -> tuple[dict, list[_ToyArm], tuple[int, ...], int]:
    """A deterministic arm proposing one id (planned first), with other candidates (extras at two depths); a sampled arm that
    stops after its first draw unless it drew 0 (so its drafted length depends on that draw); a sampled arm,
    with zeros in its q, that stops when it draws 2 (early stops at any depth). Tree budget: the deterministic
    chain, both sampled arms at their planned depths and room for three extra nodes."""
    p_tab = _double(_table(11, zeros=False))
    arms = [
        _ToyArm(chain=[1], alternatives=[((2,), 0.5), ((2, 0), 0.4), ((0,), 0.3), ((3,), 0.2)]),
        _ToyArm(q=_double(_table(12, zeros=False)), stop=lambda tok: tok != 0),
        _ToyArm(q=_double(_table(13, zeros=True)), stop=lambda tok: tok == 2),
    ]
    return p_tab, arms, (3, 2, 3), 1 + 1 + 2 + 3 + 3


def _assert_exact(dist: dict, p_tab: dict) -> None:
    assert abs(sum(dist.values()) - 1.0) < 1e-12
    for a, b in itertools.product(range(V), repeat=2):
        want = float(p_tab[()][a] * p_tab[(a,)][b])
        assert abs(dist.get((a, b), 0.0) - want) < 1e-9, ((a, b), dist.get((a, b), 0.0), want)


def test_a_sampled_tree_round_emits_exactly_the_targets_distribution():
    """Every draw of a whole tree round enumerated, its probability summed: drafters whose chains' lengths
    depend on their own draws, early stops, zeros in q, extra candidates at two depths, three depths of tree.
    The first two ids emitted have exactly the target's distribution (to 1e-9)."""
    p_tab, arms, depths, budget = _toy_case()
    dist = _toy_round_distribution(p_tab, arms, depths, budget)
    assert len(dist) > 8
    _assert_exact(dist, p_tab)


def test_the_exact_test_fails_with_chains_ordered_by_their_drafted_lengths(monkeypatch):
    """The test above can fail: ordering the chains by the ids each drafted (as draft_tree once did) makes the
    order at a node depend on a sampled arm's own draw, and the emitted distribution is no longer the target's."""
    from metasd.decoding import tree_round

    monkeypatch.setattr(tree_round, "branch_order", lambda t, b: -len(b.tokens))
    p_tab, arms, depths, budget = _toy_case()
    with pytest.raises(AssertionError):
        _assert_exact(_toy_round_distribution(p_tab, arms, depths, budget), p_tab)


def test_tree_sampling_would_fail_without_the_residual(monkeypatch):
    """The test above can fail: rejecting without moving p to the residual biases the output."""
    monkeypatch.setattr(T, "residual", lambda p, q, x: p)
    with pytest.raises(AssertionError):
        test_tree_sampling_keeps_the_targets_distribution("deterministic")


def test_engine_sampling_with_trees_matches_the_target(monkeypatch):
    """End to end through the engine: the first two ids of a tiny target, chi-square."""
    from tests.test_sampling import exact_joint

    _full_trees(monkeypatch)
    bundle = tiny_bundle(vocab=6, seed=3, noise=0.4, scale=2.0)
    prompt = [1, 2, 3, 1, 2]
    s = Sampling(temperature=1.0)
    exact = exact_joint(bundle.target, prompt, s, n=2)
    counts: dict[tuple[int, ...], int] = {}
    n = 500
    for seed in range(n):
        _, summary = run(bundle, prompt, policy="metasd-tree", max_new_tokens=2, temperature=1.0, seed=seed)
        counts[summary.token_ids] = counts.get(summary.token_ids, 0) + 1
    cells = [c for c in exact if exact[c] * n >= 5]
    obs = [counts.get(c, 0) for c in cells] + [n - sum(counts.get(c, 0) for c in cells)]
    exp = [exact[c] * n for c in cells] + [n - sum(exact[c] * n for c in cells)]
    assert all(c in exact and exact[c] > 0 for c in counts)
    assert chisquare(obs, np.array(exp) * sum(obs) / sum(exp)).pvalue > 1e-3, (counts, exact)


def test_policy_grows_the_tree_only_while_it_pays():
    pol = MetaSDTree(3, seed=0)
    flat = lambda n: 50.0  # noqa: E731 (verification costs the same for any count)
    c = pol.decide_tree(None, kmax=[4, 4, 4], ms=[0.0, 0.0, 0.0], cost=flat, budget=9)
    assert sum(c.depths) == 8  # unseen arms are optimistic: the budget fills
    c = pol.decide_tree(None, kmax=[4, 4, 4], ms=[0.0, 0.0, 0.0], cost=flat, budget=13)
    assert c.depths == (4, 4, 4)  # every arm never in a tree joins at its full length once
    for _ in range(30):  # arm 0 always fully right, arm 1 never, arm 2 half the time per id
        pol.observe_tree({0: [1.0] * 4, 1: [0.0] * 4, 2: [0.5] * 4})
        pol.update(0, [1.0, 0.0, None])
    steep = lambda n: 50.0 * (1 + 0.3 * (n - 1))  # noqa: E731 (every extra id costs 30% of a step)
    c = pol.decide_tree([True, True, False], kmax=[4, 4, 4], ms=[0.0, 0.0, 0.0], cost=steep, budget=9)
    assert c.depths[1] == 0 and c.depths[2] == 0 and c.depths[0] >= 1 and c.arm == 0
    assert c.probabilities == [1.0, 0.0, 0.0]
    c = pol.decide_tree(None, kmax=[4, 4, 4], ms=[0.0, 0.0, 500.0], cost=flat, budget=9)
    assert c.depths[2] == 0  # a drafter whose ids cost ten verifications is left out
    c = pol.decide_tree([False, True, True], kmax=[4, 4, 4], ms=[0.0, 0.0, 0.0], cost=steep, budget=9)
    assert c.depths[1] == 0 and c.depths[2] >= 1  # free and sometimes right: in; never right: out


def test_offline_model_greedy_identity_with_trees(offline, reference_model):
    from tests.tiny import independent_greedy

    for prompt in ("Repeat exactly: the cat sat on the mat. The cat sat on the mat.",
                   "Write a Python function that adds two numbers."):
        ids, ref = independent_greedy(reference_model, offline, prompt, 24)
        rounds, s = run(offline, prompt, policy="metasd-tree", max_new_tokens=24)
        assert list(s.token_ids) == ref, prompt
        assert s.ids_verified >= s.target_calls


def test_page_folds_other_branches_and_shows_tree_shares():
    from metasd.ui import viz
    from tests.test_viz import _event

    colors = viz.drafter_colors(["prompt-lookup", "token-recycling"])
    chain = _event()
    assert viz.tree_fold_spans(chain, colors) == [] and viz.arm_shares(chain) == chain.probabilities
    assert viz.tree_budget_note([chain]) == ""
    branch = {"drafter": "token-recycling", "drafters": ["token-recycling"], "from": 1, "tokens": [3, 4],
              "text": ["<i>", "x"], "accepted": 1}
    ev = _event(branches=(branch,), ids_verified=6, tree_budget=8,
                tree_share={"prompt-lookup": 0.6, "token-recycling": 0.4}, credit={"prompt-lookup": 1.0})
    fold = viz.tree_fold_spans(ev, colors)
    assert len(fold) == 1 and ">+2</sup>" in fold[0] and "<i>" not in fold[0] and "&lt;i&gt;" in fold[0]
    assert fold[0] in "".join(viz.round_spans(ev, colors))  # folded after the kept path's spans
    assert viz.arm_shares(ev) == {"prompt-lookup": 0.6, "token-recycling": 0.4}
    fig = viz.arm_probability_figure([ev], colors)
    assert [t.y[0] for t in fig.data[:2]] == [0.6, 0.4]
    assert "a budget of 8 ids a pass, 6.0 verified per call, 1 of 1 rounds" in viz.tree_budget_note([ev])


def test_a_tree_run_file_replays_its_branches(monkeypatch):
    """Run files keep a tree round's details: a replay folds the same branches and states the same budget."""
    import json

    from metasd.core.runfile import parse_run, run_document
    from metasd.ui import viz

    _full_trees(monkeypatch)
    bundle = tiny_bundle(vocab=20, seed=1, layers=2)
    rounds, s = run(bundle, [3, 7, 1, 4, 9, 3, 7, 1, 4, 9], policy="metasd-tree", max_new_tokens=30, gamma=3)
    assert any(r.branches for r in rounds)
    colors = viz.drafter_colors(bundle.drafter_names)
    doc = run_document("ids", rounds, s, preset="tiny", drafters=bundle.drafter_names, colors=colors,
                       settings=s.config)
    back = parse_run(json.dumps(doc))
    assert back.rounds == rounds and back.summary.ids_verified == s.ids_verified
    assert "".join(viz.round_spans(back.rounds[-1], colors)) == "".join(viz.round_spans(rounds[-1], colors))
    assert viz.tree_budget_note(back.rounds) == viz.tree_budget_note(rounds) != ""
    # a branch is checked like every other field
    bad = json.loads(json.dumps(doc))
    r = next(r for r in bad["rounds"] if r["branches"])
    r["branches"][0]["tokens"] = [1] * 65
    with pytest.raises(Exception, match="branch 1: tokens"):
        parse_run(json.dumps(bad))


def test_extra_candidates_join_engine_trees_and_greedy_stays_the_targets(monkeypatch):
    """Token recycling's runner-up successors fill the tree's spare room; output still the target's own."""
    grown: list[int] = []
    real = T.grow
    monkeypatch.setattr(T, "grow", lambda *a, **k: grown.append(len(out := real(*a, **k))) or out)
    for seed in range(3):
        bundle = tiny_bundle(vocab=20, seed=seed, noise=0.3, layers=2)
        prompt = [(7 * i + seed) % 20 for i in range(9)] * 2
        rounds, s = run(bundle, prompt, policy="metasd-tree", max_new_tokens=30, gamma=4, seed=seed)
        assert list(s.token_ids) == target_greedy(bundle, prompt, 30)
        assert s.new_tokens == 30 and all(r.ids_verified <= r.tree_budget for r in rounds)
    assert sum(grown) > 0, grown


def test_extra_chances_are_calibrated_against_the_target():
    """An arm whose extra candidates claim more than the target grants is trusted less next time."""
    from types import SimpleNamespace

    from metasd.decoding import tree_round as TR

    pol = MetaSDTree(2)
    assert pol.extra_scale(1) == 1.0
    lead = [T.Branch(0, [5, 6])]
    extra = T.grow(lead, [(1, (7,), 0.8), (1, (5, 8), 0.6), (1, (5, 8, 9), 0.5)], room=3)
    t = TR.TreeRound(depths=(2, 0), budget=6, probabilities=[1.0, 0.0], branches=lead + extra)
    t.tree = T.build_tree(t.branches)
    t.extra_said = {(7,): (1, 0.8), (5, 8): (1, 0.6), (5, 8, 9): (1, 0.5)}
    logits = torch.zeros(len(t.tree) + 1, 10)
    logits[0, 5] = logits[t.tree.node_of((5,)) + 1, 8] = logits[t.tree.node_of((5, 8)) + 1, 3] = 5.0
    t.logits = logits  # the target: 5, then 8, then 3 (so 7 and 5 -> 8 -> 9 are wrong, 5 -> 8 right)
    req = SimpleNamespace(s=Sampling(temperature=0.0), policy=pol)
    TR.calibrate_extras(req, t)
    assert pol.extra_said[1] == pytest.approx(1.9) and pol.extra_right[1] == pytest.approx(1.0)
    assert pol.extra_scale(1) == pytest.approx(2.0 / 2.9) and pol.extra_scale(0) == 1.0


def test_a_kept_extra_candidate_is_not_read_as_the_arms_own_draft(monkeypatch):
    """When the kept branch was an arm's extra candidate, the event says so; the lanes then do not hold the
    arm's teacher-forced predictions against it, and a run file keeps the flag."""
    import dataclasses
    import json

    from metasd.core.runfile import parse_run, run_document
    from metasd.decoding import lanes

    _full_trees(monkeypatch)
    bundle = tiny_bundle(vocab=20, seed=1, layers=2)
    rounds, s = run(bundle, [3, 7, 1, 4, 9, 3, 7, 1, 4, 9], policy="metasd-tree", max_new_tokens=30, gamma=3)
    i = next(i for i, r in enumerate(rounds) if r.accepted > 0 and not r.draft_extra)
    marked = [dataclasses.replace(r, draft_extra=r.draft_extra or j == i) for j, r in enumerate(rounds)]
    zeros = [0.0] * s.new_tokens  # a lane that predicted nothing right
    name = rounds[i].drafter
    assert any(f"round {rounds[i].round}:" in x for x in lanes.agrees_with_rounds(zeros, rounds, name))
    assert not any(f"round {rounds[i].round}:" in x for x in lanes.agrees_with_rounds(zeros, marked, name))
    greedy_cells = lanes.live_cells([dataclasses.replace(r, scores={}) for r in marked], [name], greedy=True)
    at = sum(len(r.emitted) for r in rounds[:i])
    assert greedy_cells[name][at] is None  # not taken as the arm's own outcome
    doc = run_document("ids", marked, s, preset="tiny", drafters=bundle.drafter_names, settings=s.config)
    assert parse_run(json.dumps(doc)).rounds[i].draft_extra is True


def test_one_slow_early_pass_does_not_lock_the_tree_into_plain_steps():
    """A page example on an AMD EPYC: the tree drafted in its first rounds, nothing passed, one three-id
    pass read 60.5 ms against ~40 for one id, and from then on every round was a plain step (no arm in the
    tree, so no survival is learned, and no count but one is fed, so the slow reading stood). With the
    probed profile flat (this CPU pads a lone row to three), the cost model must let that reading fade."""
    from metasd.core.costs import VerifyCost

    profile = ((1, 40.0), (2, 40.0), (3, 40.5), (4, 41.0), (6, 42.0), (8, 44.0), (10, 46.0))
    cost = VerifyCost(4, profile=profile)
    pol = MetaSDTree(2, seed=0)
    for _ in range(4):  # rounds of both arms, nothing accepted
        pol.observe_tree({0: [0.0] * 4, 1: [0.0] * 4})
        pol.update(0, [0.0, 0.0])
        cost.add(9, 45.0)
        cost.add(1, 40.0)  # and plain steps between them
    pol.observe_tree({0: [0.0, 0.0]})
    pol.update(0, [0.0, None])
    cost.add(3, 60.5)  # one slow pass
    drafted = []
    for _ in range(40):  # the target alone costs what the profile says; arm 0 now passes a third of the time
        c = pol.decide_tree(None, kmax=[4, 4], ms=[0.1, 0.1], cost=cost, budget=9)
        fed = 1 + sum(c.depths)
        drafted.append(fed > 1)
        if c.depths[0]:
            pol.observe_tree({0: [1 / 3] * c.depths[0]})
        pol.update(c.arm, [0.2 if c.depths[0] else 0.0, None])
        cost.add(fed, cost.profile[0][1] if fed == 1 else 40.0 + 0.5 * (fed - 2))
    assert cost(3) < 1.05 * 40.5  # the slow reading faded
    assert sum(drafted[-20:]) >= 10, drafted  # and arm 0 is back in the tree


def test_a_greedy_model_draft_offers_its_runner_ups_prefix_closed():
    """`sibling_paths`: at each position the drafter read, its next most probable ids besides the chain's,
    each with the drafter's chance of the whole path; the chain's prefixes with them; most probable first."""
    from metasd.drafting.drafters import sibling_paths

    def row(**p):  # logits whose softmax is the given probabilities over a 6-id vocabulary
        probs = torch.full((6,), 1e-9)
        for k, v in p.items():
            probs[int(k[1:])] = v
        return probs.log()

    # a chain of 2 and 5 that stopped at its third row (no id of it confident enough): all of that row's best
    rows = [row(t2=0.6, t4=0.3, t1=0.1), row(t5=0.5, t0=0.25, t3=0.25), row(t1=0.4, t2=0.3, t3=0.3)]
    got = dict(sibling_paths([2, 5], rows, k=3, n=100, width=2))
    want = {(4,): 0.3, (1,): 0.1, (2,): 0.6, (2, 0): 0.15, (2, 3): 0.15, (2, 5): 0.3,
            (2, 5, 1): 0.12, (2, 5, 2): 0.09, (2, 5, 3): 0.09}
    assert got.keys() == want.keys()
    for path, chance in want.items():
        assert got[path] == pytest.approx(chance, rel=1e-5), path
    for n in range(1, 10):  # any cut keeps every prefix of what it keeps
        kept = {p for p, _ in sibling_paths([2, 5], rows, k=3, n=n, width=2)}
        assert len(kept) == n and all(p[:j] in kept for p in kept for j in range(1, len(p)))
    assert {len(p) for p, _ in sibling_paths([2, 5], rows, k=1, n=100, width=2)} == {1}


def test_model_drafters_runner_ups_join_greedy_trees_and_never_sampled_ones(monkeypatch):
    """A greedy model draft is a function of the context, so its runner-ups are deterministic candidates for
    the spare room (output still the target's own); a sampled draft offers none (its rows follow its draws)."""
    from metasd.decoding import tree_round as TR
    from metasd.drafting.drafters import GreedySiblings

    _full_trees(monkeypatch)
    offered: list[tuple[bool, str]] = []
    real = TR.extra_branches

    def spy(req, t):
        out = real(req, t)
        offered.extend((req.s.greedy, req.names[b.arm]) for b in out)
        return out

    monkeypatch.setattr(TR, "extra_branches", spy)
    kept_rows: list[tuple[bool, bool]] = []  # (greedy run, the draft kept rows to offer)
    real_keep = GreedySiblings.keep_rows
    monkeypatch.setattr(GreedySiblings, "keep_rows", lambda self, ids, toks, rows: (
        kept_rows.append((greedy, bool(rows))), real_keep(self, ids, toks, rows)))
    for seed in range(3):
        greedy = True
        bundle = tiny_bundle(vocab=20, seed=seed, noise=0.3, layers=2, white_box=True)
        prompt = [(5 * i + seed) % 20 for i in range(7)]
        rounds, s = run(bundle, prompt, policy="metasd-tree", max_new_tokens=30, gamma=4, seed=seed)
        assert list(s.token_ids) == target_greedy(bundle, prompt, 30)
        greedy = False
        run(bundle, prompt, policy="metasd-tree", max_new_tokens=30, gamma=4, seed=seed, temperature=0.8)
    models = {"layer-skip", "tiny-lm", "tiny-eagle"}
    assert {name for g, name in offered if g} & models == models
    assert not {name for g, name in offered if not g} & models
    assert any(kept for g, kept in kept_rows if g)
    assert any(not g for g, _ in kept_rows) and not any(kept for g, kept in kept_rows if not g)
