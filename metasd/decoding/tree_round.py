"""The engine's token-tree round (policy metasd-tree): plan, draft, fill the spare room, verify, walk, keep
the accepted path, score, learn and emit. The tree itself, its mask and its verification rules are in
metasd/decoding/tree.py; these steps read and update the engine's Request (metasd/decoding/engine.py): ids, caches,
drafters, statistics. The engine dispatches here when its policy plays trees (Policy.tree)."""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import torch

from metasd.core.costs import expected_accepted, reward, tree_budget
from metasd.core.events import RoundEvent
from metasd.core.passes import DraftPart, HeadPart, VerifyPart
from metasd.core.sampling import warp
from metasd.decoding import tree as T
from metasd.decoding.tree import (
    Branch,
    TokenTree,
    TreeVerdict,
    branch_betas,
    build_tree,
    credit,
    keep_rows,
    kept_branch,
    lead_arm,
    tree_mask,
    tree_positions,
    tree_shares,
    verify_greedy,
    verify_sampled,
)
from metasd.drafting.drafters import Verified


@dataclass
class TreeRound:
    """What one tree round did."""

    depths: tuple[int, ...]
    budget: int
    probabilities: list[float]
    branches: list[Branch] = field(default_factory=list)
    draft_ms: dict[int, float] = field(default_factory=dict)  # per arm
    tree: TokenTree = field(default_factory=TokenTree)
    start: int = 0
    logits: torch.Tensor | None = None
    verdict: TreeVerdict | None = None
    lead: int = 0
    kept: int | None = None  # index into branches of the chain the round reports (kept_branch)
    extra_ms: float = 0.0  # asking the arms for their other candidates
    extra_said: dict[tuple[int, ...], tuple[int, float]] = field(default_factory=dict)  # path -> (arm, raw chance)
    emitted: list[int] = field(default_factory=list)
    hit_eos: bool = False
    g: dict[int, list[float]] = field(default_factory=dict)  # per arm: its branch's pass chances
    own: dict[int, int] = field(default_factory=dict)  # per arm: accepted ids of its own branch
    rewards: list[float | None] = field(default_factory=list)
    best: list[int] | None = None  # greedy rounds: argmax p of every row of the pass, read by the walk and the books


def plan_tree(req, awake: list[bool] | None) -> TreeRound:
    """The policy's tree: which arms contribute and how deep, within the budget of verified ids."""
    k = len(req.arms)
    kmax = [min(req.length(i), len(req.pre[i].tokens)) if i in req.pre else req.length(i) for i in range(k)]
    budget = min(tree_budget(req.verify_cost, req.st.gamma), 1 + sum(kmax))
    ms = [req.price(i) for i in range(k)]
    choice = req.policy.decide_tree(awake, kmax, ms, req.verify_cost, max(budget, 1))
    return TreeRound(choice.depths or tuple([0] * k), budget, choice.probabilities, lead=choice.arm)


def draft_tree(req, t: TreeRound) -> Generator[DraftPart | HeadPart, Any, None]:
    """Every chosen arm drafts its branch (model-free ones drafted already while waking); a model drafter asks
    the driver for each forward (Drafter.propose_steps), so that a class's shared rounds run them together."""
    for i, depth in enumerate(t.depths):
        if depth <= 0:
            continue
        if i in req.pre:
            d, spent = req.pre[i], 0.0
        else:
            req.arms[i].attach(req.cache, req.ids)
            d, spent = yield from own_time(req.arms[i].propose_steps(req.ids, depth, req.s, req.g_draft))
        tokens = d.tokens[:depth]
        if tokens:
            q = d.q[: len(tokens)] if d.q is not None else None
            t.branches.append(Branch(i, list(tokens), q))
        t.draft_ms[i] = 1000 * spent
    # The deepest planned chain first, its proposals tried first at every node; an order fixed before anything
    # was drawn (drafted lengths are not: a sampled drafter stops early on its own draws), which sampled
    # verification needs to be exact (metasd/decoding/tree.py).
    t.branches.sort(key=lambda b: branch_order(t, b))
    t0 = time.perf_counter()
    t.branches.extend(extra_branches(req, t))
    t.extra_ms = 1000 * (time.perf_counter() - t0)
    t.tree = build_tree(t.branches)


def own_time(parts: Generator[Any, Any, Any]) -> Generator[Any, Any, tuple[Any, float]]:
    """yield from `parts`: (its value, the seconds it ran), counting each forward it asked for at that forward's
    own time (`spent_s`), not the time this request waited while a shared pass ran the others' parts."""
    spent, t0 = 0.0, time.perf_counter()
    try:
        x = next(parts)
        while True:
            spent += time.perf_counter() - t0
            answer = yield x
            spent += x.spent_s
            t0 = time.perf_counter()
            x = parts.send(answer)
    except StopIteration as end:
        return end.value, spent + time.perf_counter() - t0


def branch_order(t: TreeRound, b: Branch) -> tuple[int, int]:
    """Where an arm's chain stands among the round's: the deepest planned first, then by arm."""
    return -t.depths[b.arm], b.arm


def extra_branches(req, t: TreeRound) -> list[Branch]:
    """The room the chains leave in the budget, filled with the arms' other candidates (the model-free arms'
    second matches and the target's recorded runner-up successors; in a greedy round the runner-ups of each
    model drafter's chain): the most probable nodes first, each only while its chance of being accepted
    outweighs what one more verified id costs (docs/DESIGN.md §9).

    Which extras exist must not depend on a sampled chain's draws (sampled verification is exact only then):
    the room and the paths already held are those of the deterministic chains (functions of the context), each
    sampled chain counted at its planned depth, whatever it drew."""
    sampled = {i for i, depth in enumerate(t.depths) if depth > 0 and not req.s.greedy and not req.arms[i].model_free}
    fixed = [b for b in t.branches if b.arm not in sampled]
    reserved = sum(t.depths[i] for i in sampled)
    own = T.prefixes(fixed)
    room = t.budget - 1 - len(own) - reserved
    if room <= 0:
        return []
    depth = min(req.st.gamma, req.budget)  # never past the tokens left to generate
    cands = []
    for i, d in enumerate(req.arms):
        # Deterministic candidates only (each a one-hot proposal, lossless sampled too): the model-free arms',
        # and in a greedy round a model drafter's runner-ups along the chain it just drafted.
        if depth > 0 and (d.model_free or (req.s.greedy and t.depths[i] > 0)):
            scale = req.policy.extra_scale(i)  # what the arm's stated chances turned out to be worth so far
            for path, said in d.alternatives(req.ids, depth, 2 * room):
                cands.append((i, path, said * scale))
                t.extra_said.setdefault(path, (i, said))
    step = req.verify_cost(1)

    def worth(score: float, nodes: int) -> bool:
        nodes += reserved
        return score * step > req.verify_cost(nodes + 2) - req.verify_cost(nodes + 1)

    extra = T.grow(fixed, cands, room, worth)
    added = T.prefixes(extra) - own
    t.extra_said = {p: t.extra_said[p] for p in added}
    return extra


def calibrate_extras(req, t: TreeRound) -> None:
    """Each extra node's stated chance against what the target made of it (greedy: 1 when its whole path is
    the target's own continuation; sampled: the product of p along it), summed per arm for the policy."""
    if not t.extra_said:
        return
    tree = t.tree
    if req.s.greedy:
        best = t.best if t.best is not None else t.logits.argmax(-1).tolist()
        hit = [float(best[tree.parents[n] + 1] == tree.tokens[n]) for n in range(len(tree))]
    else:
        p = warp(t.logits, req.s)
        hit = [float(p[tree.parents[n] + 1, tree.tokens[n]]) for n in range(len(tree))]
    chance: list[float] = []
    for n in range(len(tree)):  # a parent is numbered before its children
        chance.append(hit[n] * (chance[tree.parents[n]] if tree.parents[n] >= 0 else 1.0))
    said: dict[int, float] = {}
    right: dict[int, float] = {}
    for path, (arm, s) in t.extra_said.items():
        said[arm] = said.get(arm, 0.0) + s
        right[arm] = right.get(arm, 0.0) + chance[tree.node_of(path)]
    req.policy.observe_extras(said, right)


def verify_part(req, t: TreeRound) -> VerifyPart:
    """The round's verification as asked of the driver: one target pass over the root (the last id) and every
    node of the tree, each node at its depth's position and seeing only its ancestors (tree.tree_mask)."""
    t.start = len(req.ids)
    past = t.start - 1
    assert req.cache.get_seq_length() == past, (req.cache.get_seq_length(), past)
    dtype = next(req.bundle.target.parameters()).dtype
    return VerifyPart([req.ids[-1]] + t.tree.tokens, past, req.cache, features=req.features,
                      positions=tree_positions(t.tree, t.start)[0].tolist(),
                      mask=tree_mask(t.tree, past, dtype).to(req.dev))


def walk(req, t: TreeRound) -> None:
    """The walk down the tree: greedy, or multi-step speculative sampling."""
    if req.s.greedy:
        # One argmax over the pass's rows (a vocabulary each) for the walk, the betas and the extras' calibration.
        t.best = t.logits.argmax(-1).tolist()
        t.verdict = verify_greedy(t.logits, t.tree, t.best)
    else:
        t.verdict = verify_sampled(t.logits, t.tree, t.branches, req.s, req.g_target)


def keep_path(req, t: TreeRound, hidden: Any) -> None:
    """The cache keeps the root and the accepted nodes only; white-box arms get their hidden states."""
    rows = [0] + [n + 1 for n in t.verdict.path]
    keep_rows(req.cache, t.start - 1, rows)
    if hidden is not None:
        # Only the layers the readers read (req.features), indexed alike in a pass of its own (every layer, a
        # tuple) and a shared pass (those layers, a dict).
        idx = torch.tensor(rows, device=req.dev)
        kept = {i: hidden[i].index_select(1, idx) for i in req.features}
        for d in req.readers:
            d.take_features(t.start - 1, kept, len(rows))


def accept_tree(req, t: TreeRound, verify_ms: float) -> None:
    """Append the accepted path and the target's token (up to an end-of-sequence id), measure the
    verification, adapt each arm's draft length from its own branch."""
    v = t.verdict
    order = list(dict.fromkeys(b.arm for b in t.branches))
    t.lead = lead_arm(t.tree, v.path, order) if order else t.lead
    t.kept = kept_branch(t.tree, t.branches, v.path, t.lead)
    emitted = [t.tree.tokens[n] for n in v.path] + [v.token]
    eos = next((i for i, x in enumerate(emitted) if x in req.bundle.eos_ids), None)
    t.emitted, t.hit_eos = (emitted[: eos + 1], True) if eos is not None else (emitted, False)
    req.ids.extend(t.emitted)
    req.ledger.count(t.emitted, v.accepted, len(t.tree) + 1)
    req.verify_cost.add(len(t.tree) + 1, verify_ms)
    on_path = set(v.path)
    for b in own_branches(t):
        own = 0
        while own < len(b.tokens) and t.tree.paths[b.arm][own] in on_path:
            own += 1
        t.own[b.arm] = own
        req.arms[b.arm].record_time(t.draft_ms.get(b.arm, 0.0) / 1000, len(b.tokens))
        if own == len(b.tokens) == t.depths[b.arm]:
            req.caps[b.arm] = min(req.st.gamma, req.caps[b.arm] + 1)
        elif own < len(b.tokens):
            req.caps[b.arm] = max(1, own + 1)


def score_tree(req, t: TreeRound) -> None:
    """Full information for every arm in the tree: its branch's pass chances, as if it had drafted alone
    (every node was verified), turn into its reward; the policy learns from all of them."""
    t.g = branch_betas(t.logits, t.tree, t.branches, req.s, t.best)
    t.rewards = [None] * len(req.arms)
    for b in own_branches(t):
        g, k = t.g[b.arm], len(b.tokens)
        drafted = req.drafted_ms(b.arm, k, t.draft_ms.get(b.arm, 0.0) / 1000)
        t.rewards[b.arm] = reward(req.st.reward, g, k, req.st.gamma, drafted, k + 1, req.verify_cost)
        req.ledger.arms[req.names[b.arm]].scored_tokens += 1 + expected_accepted(g)
    req.policy.update(t.lead, t.rewards)
    req.policy.observe_tree(t.g)
    calibrate_extras(req, t)
    # Regret against the best single arm in hindsight: its tokens per call had it drafted alone
    # (an arm left out of a round counts a plain step, 1 token), minus the tree's realised tokens.
    led = req.ledger
    led.chosen_scored += 1 + t.verdict.accepted
    if led.tree_single is None:
        led.tree_single = [0.0] * len(req.arms)
    for i in range(len(req.arms)):
        led.tree_single[i] += 1 + (expected_accepted(t.g[i]) if i in t.g else 0.0)
    led.regret = max(led.tree_single) - led.chosen_scored


def learn_tree(req, t: TreeRound, clock) -> None:
    """Every drafter sees what was accepted (those whose branch was left too); the arms' statistics grow.
    Drafters see the round as a chain: the lead's branch, fed after the last id, with its logits rows."""
    nodes = t.tree.branch_nodes[t.kept] if t.kept is not None else []
    rows = [0] + [n + 1 for n in nodes]
    inputs = [req.ids[t.start - 1]] + [t.tree.tokens[n] for n in nodes]
    verified = Verified(t.start, inputs, t.logits[rows], t.emitted,
                        tree_inputs=[req.ids[t.start - 1]] + t.tree.tokens, tree_logits=t.logits)
    for d in req.arms:
        d.observe(req.ids, verified)
    arms = req.ledger.arms
    for b in own_branches(t):  # full credit: what its branch would have had accepted alone
        arms[req.names[b.arm]].pulled(len(b.tokens), t.own[b.arm], t.rewards[b.arm], t.draft_ms.get(b.arm, 0.0) / 1000)
    if t.kept is None:  # a plain step: charged to the lead, as the chain engine does
        arms[req.names[t.lead]].pulls += 1
        arms[req.names[t.lead]].tokens_sum += 1
    arms[req.names[t.lead]].verify_s += clock["verify"]


def other_branches(req, t: TreeRound) -> tuple[dict, ...]:
    """The tree's nodes off the lead's branch, per arm in the policy's order, each node once: where the
    branch leaves the lead's (depth), its ids and text, the arms that proposed them, and how many of
    the arm's own ids were accepted."""
    lead_nodes = set(t.tree.branch_nodes[t.kept]) if t.kept is not None else set()
    shown: set[int] = set()
    out = []
    for j, b in enumerate(t.branches):
        nodes = [n for n in t.tree.branch_nodes[j] if n not in lead_nodes and n not in shown]
        if j == t.kept or not nodes:
            continue
        shown.update(nodes)
        toks = [t.tree.tokens[n] for n in nodes]
        arms = sorted({a for n in nodes for a in t.tree.proposers[n]})
        out.append({"drafter": req.names[b.arm], "drafters": [req.names[a] for a in arms],
                    "from": t.tree.depths[nodes[0]] - 1, "tokens": toks,
                    "text": [req.events.pieces.piece([x]) for x in toks], "accepted": t.own.get(b.arm, 0)})
    return tuple(out)


def own_branches(t: TreeRound) -> list[Branch]:
    """The arms' own chains (what each would have drafted alone), without the extra candidates."""
    return [b for b in t.branches if not b.extra]


def lead_draft_probs(req, t: TreeRound) -> tuple[list[float], list[float], list[float]]:
    """p(x), q(x) and min(1, p/q) along the kept branch, as the chain's verdict reports them."""
    if t.kept is None:
        return [], [], []
    b, nodes = t.branches[t.kept], t.tree.branch_nodes[t.kept]
    rows = [t.tree.parents[n] + 1 for n in nodes]
    if req.s.greedy:
        best = [t.best[r] for r in rows] if t.best is not None else t.logits[rows].argmax(-1).tolist()
        g = [float(x == int(y)) for x, y in zip(b.tokens, best, strict=True)]
        return g, [1.0] * len(g), g
    p = warp(t.logits[rows], req.s)
    idx = torch.arange(len(rows))
    x = torch.tensor(b.tokens)
    px = p[idx, x]
    qx = b.q[idx, x] if b.q is not None else torch.ones_like(px)
    ratio = (px / qx.clamp_min(1e-30)).clamp(max=1.0)
    return px.tolist(), qx.tolist(), ratio.tolist()


def emit_tree(req, t: TreeRound, clock):
    """The round's event: the kept path in the chain's fields, the tree in the new ones."""
    text = req.events.pieces.push(t.emitted)
    b = t.branches[t.kept] if t.kept is not None else None
    draft = list(b.tokens) if b else []
    p_x, q_x, ratio = lead_draft_probs(req, t)
    others = other_branches(req, t)
    clock.lap("emit")
    drafted = clock["wake"] + clock["draft"]
    overhead = clock["pick"] + clock["walk"] + clock["accept"] + clock["score"] + clock["learn"] + clock["emit"]
    req.clock.charge(drafted, clock["verify"], overhead)
    names, led = req.names, req.ledger
    ideal = sum(t.draft_ms.get(i, 0.0) for i in ([t.lead] if b else [])) + req.verify_cost.measured(1 + len(draft))
    spent = sum(t.draft_ms.values()) + t.extra_ms + 1000 * clock["verify"]
    led.regret_tree_ms += max(spent - ideal, 0.0)
    return RoundEvent(
        round=led.rounds, drafter=names[t.lead], draft=tuple(draft), accepted=t.verdict.accepted,
        emitted=tuple(t.emitted), target_token=t.verdict.token, bonus=bool(draft) and t.verdict.accepted == len(draft),
        p_draft=tuple(p_x), q_draft=tuple(q_x), accept_prob=tuple(ratio),
        reward=t.rewards[t.lead] if t.rewards[t.lead] is not None else 0.0,
        rewards=dict(zip(names, t.rewards, strict=True)), probabilities=dict(zip(names, t.probabilities, strict=True)),
        regret=max(led.regret, 0.0), regret_measured=True, draft_ms=1000 * drafted, verify_ms=1000 * clock["verify"],
        overhead_ms=1000 * overhead, new_tokens=led.new_tokens, emitted_text=tuple(text),
        draft_text=tuple(req.events.pieces.piece([x]) for x in draft),
        ids_verified=len(t.tree) + 1, tree_budget=t.budget, branches=others,
        tree_share={names[a]: v for a, v in tree_shares(t.tree).items()},
        credit={names[a]: v for a, v in credit(t.tree, t.verdict.path).items()},
        split_ms={k: 1000 * v for k, v in clock.spans.items()}, regret_single=led.regret,
        regret_tree_ms=led.regret_tree_ms, draft_extra=bool(b and b.extra),
    )


def play_round(req, awake: list[bool] | None, clock, inspect=None
               ) -> Generator[VerifyPart | DraftPart | HeadPart, Any, tuple[RoundEvent, bool]]:
    """One tree round, its steps timed like the chain's: pick (the plan), draft, verify (the target's
    pass), accept (the walk's result, the cache trimmed), score, learn, emit. Its passes are asked of the
    driver as the chain's are (engine.steps): a pass of the request's own, or a share of a class's pass."""
    t = plan_tree(req, awake)
    clock.lap("pick")
    yield from draft_tree(req, t)
    clock.lap("draft")
    t.logits, hidden = yield verify_part(req, t)
    clock.lap("verify")
    walk(req, t)
    clock.lap("walk")
    keep_path(req, t, hidden)
    accept_tree(req, t, 1000 * clock["verify"])
    clock.lap("accept")
    score_tree(req, t)
    clock.lap("score")
    learn_tree(req, t, clock)
    if inspect is not None:
        inspect(req.cache, req.ids, req.arms)
    clock.lap("learn")
    return emit_tree(req, t, clock), t.hit_eos
