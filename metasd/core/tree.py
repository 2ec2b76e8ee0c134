"""A round as a token tree: several drafters' proposals verified in one target pass.

Each contributing arm drafts a chain (its branch). The branches merge into a prefix tree (a shared
prefix is one node, which remembers every arm that proposed it and that arm's q row). The target
reads the round's last id (the root) and every node at once: a tree attention mask lets each node see
the cache, its ancestors and itself, and each node sits at position start - 1 + depth. Verification
walks down from the root:

- greedy: follow the child whose token is argmax p; stop where no child is. The kept path is the
  target's own greedy continuation, so the output equals the target's greedy output.
- sampled: SpecInfer's multi-step speculative sampling. At a node, each proposal of a child (one per
  arm that proposed it, in the policy's order) is accepted with probability min(1, p(x) / q(x)) under
  the current p; a rejection replaces p by norm(max(0, p - q)). After every proposal is rejected,
  the token is drawn from what is left of p. Each proposal is a draw from its q independent of the
  others (for a deterministic drafter q is one-hot), so by the chain's argument applied once per
  proposal, the emitted token has distribution p; the proposals below an accepted child are draws
  conditioned on that child only, so the argument repeats at every depth.

Then the cache keeps only the root and the accepted nodes (their keys and values gathered into
place, the rest dropped): what a fresh prefill of the accepted text gives.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from metasd.core.costs import expected_accepted, reward, tree_budget
from metasd.core.events import RoundEvent
from metasd.core.sampling import Sampling, warp
from metasd.drafting.drafters import Verified, crop_to


@dataclass(frozen=True)
class Branch:
    """One arm's proposal for the round: a chain of ids and, when it sampled them, their q rows."""

    arm: int
    tokens: list[int]
    q: torch.Tensor | None = None  # [len(tokens), V]; None: deterministic (q is one-hot)
    # One of the arm's other candidates (Drafter.alternatives), not the chain it would draft alone: always
    # deterministic, never scored for the bandit (its learning is about the arm's own chain).
    extra: bool = False


@dataclass
class TokenTree:
    """A prefix tree of branches; nodes are numbered so that a parent comes before its children.

    Row 0 of the target's pass is the root (the last id); node i is row i + 1.
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # -1: the root
    depths: list[int] = field(default_factory=list)  # 1 for the root's children
    proposers: list[dict[int, int]] = field(default_factory=list)  # per node: arm -> index in its branch
    children: dict[int, list[int]] = field(default_factory=dict)  # node (-1: root) -> child nodes in order
    paths: dict[int, list[int]] = field(default_factory=dict)  # arm -> its own chain's nodes (extras not)
    branch_nodes: list[list[int]] = field(default_factory=list)  # per branch, in order: its nodes

    def __len__(self) -> int:
        return len(self.tokens)

    def ancestors(self, i: int) -> list[int]:
        """Node i and its ancestors, root-most first (without the root itself)."""
        out = []
        while i >= 0:
            out.append(i)
            i = self.parents[i]
        return out[::-1]


def build_tree(branches: Sequence[Branch]) -> TokenTree:
    """Merge the branches into a prefix tree: ids on a shared prefix become one node."""
    t = TokenTree(children={-1: []})
    for b in branches:
        node, path = -1, []
        for j, tok in enumerate(b.tokens):
            child = next((c for c in t.children[node] if t.tokens[c] == tok), None)
            if child is None:
                child = len(t.tokens)
                t.tokens.append(tok)
                t.parents.append(node)
                t.depths.append(len(path) + 1)
                t.proposers.append({})
                t.children[node].append(child)
                t.children[child] = []
            t.proposers[child][b.arm] = j
            path.append(child)
            node = child
        if not b.extra:
            t.paths[b.arm] = path
        t.branch_nodes.append(path)
    return t


def grow(branches: Sequence[Branch], candidates: Sequence[tuple[int, tuple[int, ...], float]], room: int,
         worth: Callable[[float, int], bool] | None = None) -> list[Branch]:
    """Extra branches for a tree of `branches`: the arms' other candidates, most probable first.

    `candidates` are (arm, path from the root, estimated chance the whole path is the target's) and each
    arm's are prefix-closed (a path's prefixes are candidates of the same arm too). A node joins when its
    parent is in the tree already, while `room` lasts and `worth(score, nodes so far)` agrees (the
    caller weighs the expected accepted ids against the measured cost of one more verified id). In a
    greedy round the expected accepted ids of a tree are the sum of its nodes' path chances, so adding
    the most probable eligible node first is the best one-node step. Returns one branch per new leaf."""
    have = {tuple(b.tokens[:j]) for b in branches for j in range(1, len(b.tokens) + 1)}
    size = len(have)
    pool = sorted(candidates, key=lambda c: -c[2])
    chosen: dict[tuple[int, ...], int] = {}
    while room > 0:
        pick = next(((arm, path, score) for arm, path, score in pool
                     if path and path not in have and (len(path) == 1 or path[:-1] in have)), None)
        if pick is None or (worth is not None and not worth(pick[2], size)):
            break
        arm, path, _ = pick
        have.add(path)
        chosen[path] = arm
        size += 1
        room -= 1
    inner = {p[:j] for p in chosen for j in range(1, len(p))}
    return [Branch(arm, list(p), None, extra=True) for p, arm in chosen.items() if p not in inner]


def tree_positions(tree: TokenTree, start: int) -> torch.Tensor:
    """Position ids [1, n + 1]: the root at start - 1, a node at start - 1 + its depth."""
    return torch.tensor([[start - 1] + [start - 1 + d for d in tree.depths]], dtype=torch.long)


def tree_visibility(tree: TokenTree) -> torch.Tensor:
    """[n + 1, n + 1] bool: row a sees column b when b is a's ancestor or a itself (the root: everyone)."""
    n = len(tree)
    see = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    see[:, 0] = True
    for i in range(n):
        see[i + 1, [a + 1 for a in tree.ancestors(i)]] = True
    return see


def tree_mask(tree: TokenTree, past: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The additive 4D attention mask [1, 1, n + 1, past + n + 1]: 0 where a row may look (every cached
    position, its ancestors, itself), the dtype's minimum elsewhere. transformers passes a 4D mask
    through unchanged (masking_utils: "already prepared 4D mask"), to SDPA and eager attention alike."""
    see = torch.cat([torch.ones(len(tree) + 1, past, dtype=torch.bool), tree_visibility(tree)], dim=1)
    mask = torch.zeros(see.shape, dtype=dtype).masked_fill(~see, torch.finfo(dtype).min)
    return mask.view(1, 1, *see.shape)


def forward_tree(model: torch.nn.Module, cache: DynamicCache, last_id: int, tree: TokenTree, start: int,
                 hidden: bool = False) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """One target pass over the root and every node. The cache must hold start - 1 ids; afterwards it
    holds them plus every row (keep_rows trims it). Returns the logits [n + 1, V] and, when asked,
    the hidden states."""
    dev = next(model.parameters()).device
    past = cache.get_seq_length()
    assert past == start - 1, (past, start)
    dtype = next(model.parameters()).dtype
    out = model(input_ids=torch.tensor([[last_id] + tree.tokens], device=dev),
                position_ids=tree_positions(tree, start).to(dev),
                attention_mask=tree_mask(tree, past, dtype).to(dev), past_key_values=cache, use_cache=True,
                output_hidden_states=hidden)
    return out.logits[0], (out.hidden_states if hidden else None)


def keep_rows(cache: DynamicCache, past: int, rows: Sequence[int]) -> None:
    """Keep the cached positions before `past` and, after them, only the pass's `rows` (in order).
    New tensors are built (never written in place): a layer-skip drafter may hold the old ones. When the
    rows are the pass's first ones (the kept path is the lead's branch, numbered first) a crop does it."""
    if list(rows) == list(range(len(rows))):
        crop_to(cache, past + len(rows))
        return
    idx = torch.tensor([past + r for r in rows], dtype=torch.long)
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys is None or layer.keys.numel() == 0:
            continue
        i = idx.to(layer.keys.device)
        layer.keys = torch.cat([layer.keys[:, :, :past], layer.keys.index_select(2, i)], dim=2)
        layer.values = torch.cat([layer.values[:, :, :past], layer.values.index_select(2, i)], dim=2)


@dataclass(frozen=True)
class TreeVerdict:
    path: list[int]  # the accepted nodes, root-most first
    token: int  # the target's own token after the path: a correction, or a bonus at a leaf

    @property
    def accepted(self) -> int:
        return len(self.path)


def verify_greedy(logits: torch.Tensor, tree: TokenTree) -> TreeVerdict:
    """Follow argmax p down the tree: the longest path that is the target's own greedy continuation."""
    best = logits.argmax(-1).tolist()
    node, path = -1, []
    while True:
        want = best[node + 1]
        child = next((c for c in tree.children[node] if tree.tokens[c] == want), None)
        if child is None:
            return TreeVerdict(path, want)
        path.append(child)
        node = child


def _proposals(tree: TokenTree, node: int, order: Sequence[int]) -> list[tuple[int, int]]:
    """(child, arm) pairs below `node`, one per arm that proposed the child, arms in `order`."""
    rank = {a: r for r, a in enumerate(order)}
    pairs = [(c, a) for c in tree.children[node] for a in tree.proposers[c]]
    return sorted(pairs, key=lambda ca: rank.get(ca[1], len(rank)))


def verify_sampled(logits: torch.Tensor, tree: TokenTree, branches: Sequence[Branch], s: Sampling,
                   generator: torch.Generator | None) -> TreeVerdict:
    """Multi-step speculative sampling (SpecInfer) over the tree: the emitted ids have the target's
    distribution whatever the drafters proposed."""
    q_of = {b.arm: b.q for b in branches if not b.extra}
    order = list(dict.fromkeys(b.arm for b in branches))
    p_rows = warp(logits, s)
    node, path = -1, []
    while True:
        p = p_rows[node + 1]
        moved = False
        for child, arm in _proposals(tree, node, order):
            x = tree.tokens[child]
            q_arm = q_of.get(arm)  # an extra candidate (never sampled) proposes its id outright
            own = q_arm is not None and child in tree.paths.get(arm, ())
            q = q_arm[tree.proposers[child][arm]] if own else None
            qx = float(q[x]) if q is not None else 1.0
            u = float(torch.rand(1, generator=generator, device=p.device))
            if qx > 0 and u < min(1.0, float(p[x]) / qx):
                path.append(child)
                node, moved = child, True
                break
            p = residual(p, q, x)
        if not moved:
            token = int(torch.multinomial(p, 1, generator=generator).item())
            return TreeVerdict(path, token)


def residual(p: torch.Tensor, q: torch.Tensor | None, x: int) -> torch.Tensor:
    """norm(max(0, p - q)) after a rejected proposal x ~ q (q None: one-hot of x). Where nothing is
    left (p <= q everywhere, so p == q: a rejection had probability 0 but float rounding allowed it),
    p stays."""
    if q is None:
        r = p.clone()
        r[x] = 0.0
    else:
        r = (p - q).clamp_min(0.0)
    total = r.sum()
    return r / total if total > 0 else p


def branch_betas(logits: torch.Tensor, tree: TokenTree, branches: Sequence[Branch], s: Sampling) -> dict[int, list[float]]:
    """Per arm, the chance each position of its branch passes chain verification, had it drafted alone:
    every node was verified, so row parent(node) is the target's p at the arm's own context. Greedy:
    1 where the id is argmax p, else 0; sampled: p(x) for a one-hot q, sum min(p, q) otherwise."""
    best = logits.argmax(-1) if s.greedy else None
    p_rows = None if s.greedy else warp(logits, s)
    out: dict[int, list[float]] = {}
    for b in branches:
        if b.extra:
            continue
        g = []
        for j, node in enumerate(tree.paths.get(b.arm, [])):
            row = tree.parents[node] + 1
            x = tree.tokens[node]
            if best is not None:
                g.append(float(best[row] == x))
            elif b.q is None:
                g.append(float(p_rows[row, x]))
            else:
                g.append(float(torch.minimum(p_rows[row], b.q[j]).sum()))
        out[b.arm] = g
    return out


def credit(tree: TokenTree, path: Sequence[int]) -> dict[int, float]:
    """Accepted ids per arm, each accepted node split equally among the arms that proposed it."""
    out: dict[int, float] = {}
    for node in path:
        share = 1.0 / len(tree.proposers[node])
        for a in tree.proposers[node]:
            out[a] = out.get(a, 0.0) + share
    return out


def tree_shares(tree: TokenTree) -> dict[int, float]:
    """Each arm's share of the tree's nodes (a shared node split equally); sums to 1 (empty tree: {})."""
    out: dict[int, float] = {}
    for props in tree.proposers:
        for a in props:
            out[a] = out.get(a, 0.0) + 1.0 / len(props) / len(tree)
    return out


def lead_arm(tree: TokenTree, path: Sequence[int], order: Sequence[int]) -> int:
    """The arm credited most: one whose branch holds the deepest accepted node (so every accepted
    node); among several, the longest branch, then the policy's order. No accepted node: the first arm."""
    if not path:
        return order[0]
    holders = [a for a in order if a in tree.proposers[path[-1]]]
    return max(holders, key=lambda a: (path[-1] in tree.paths.get(a, ()), len(tree.paths.get(a, ())), -order.index(a)))


def kept_branch(tree: TokenTree, branches: Sequence[Branch], path: Sequence[int], lead: int) -> int | None:
    """The branch the round reads as its chain: the lead's own one if it holds the deepest accepted node,
    else the first branch that does (an extra candidate); no accepted node: the lead's own. None: a plain
    step (no branch at all)."""
    own = next((j for j, b in enumerate(branches) if b.arm == lead and not b.extra), None)
    if not path or (own is not None and path[-1] in tree.branch_nodes[own]):
        return own if own is not None else (0 if branches else None)
    return next(j for j, nodes in enumerate(tree.branch_nodes) if path[-1] in nodes)


# ---- the engine's tree round ------------------------------------------------------------------
# These steps read and update the engine's Request (metasd/core/engine.py): ids, caches, drafters,
# statistics. The engine dispatches here when its policy plays trees (Policy.tree).


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
    emitted: list[int] = field(default_factory=list)
    hit_eos: bool = False
    g: dict[int, list[float]] = field(default_factory=dict)  # per arm: its branch's pass chances
    own: dict[int, int] = field(default_factory=dict)  # per arm: accepted ids of its own branch
    rewards: list[float | None] = field(default_factory=list)


def plan_tree(req, awake: list[bool] | None) -> TreeRound:
    """The policy's tree: which arms contribute and how deep, within the budget of verified ids."""
    k = len(req.arms)
    kmax = [min(req.length(i), len(req.pre[i].tokens)) if i in req.pre else req.length(i) for i in range(k)]
    budget = min(tree_budget(req.verify_cost, req.st.gamma), 1 + sum(kmax))
    ms = [d.ms_per_token for d in req.arms]
    choice = req.policy.decide_tree(awake, kmax, ms, req.verify_cost, max(budget, 1))
    return TreeRound(choice.depths or tuple([0] * k), budget, choice.probabilities, lead=choice.arm)


def draft_tree(req, t: TreeRound) -> None:
    """Every chosen arm drafts its branch (model-free ones drafted already while waking)."""
    for i, depth in enumerate(t.depths):
        if depth <= 0:
            continue
        t0 = time.perf_counter()
        if i in req.pre:
            d = req.pre[i]
        else:
            req.arms[i].attach(req.cache, req.ids)
            d = req.arms[i].propose(req.ids, depth, req.s, req.g_draft)
        tokens = d.tokens[:depth]
        if tokens:
            q = d.q[: len(tokens)] if d.q is not None else None
            t.branches.append(Branch(i, list(tokens), q))
        t.draft_ms[i] = 1000 * (time.perf_counter() - t0)
    # The lead (most ids) first: its proposals are tried first at every node.
    t.branches.sort(key=lambda b: -len(b.tokens))
    t0 = time.perf_counter()
    t.branches.extend(extra_branches(req, t))
    t.extra_ms = 1000 * (time.perf_counter() - t0)
    t.tree = build_tree(t.branches)


def extra_branches(req, t: TreeRound) -> list[Branch]:
    """The room the chains leave in the budget, filled with the model-free arms' other candidates (their
    second matches, the target's recorded runner-up successors): the most probable nodes first, each only
    while its chance of being accepted outweighs what one more verified id costs (docs/DESIGN.md §9)."""
    room = t.budget - 1 - len(build_tree(t.branches))
    if room <= 0:
        return []
    depth = min(req.st.gamma, req.budget)  # never past the tokens left to generate
    cands = []
    for i, d in enumerate(req.arms):
        if d.model_free and depth > 0:  # deterministic: each candidate is a one-hot proposal, lossless sampled
            cands += [(i, path, score) for path, score in d.alternatives(req.ids, depth, 2 * room)]
    step = req.verify_cost(1)

    def worth(score: float, nodes: int) -> bool:
        return score * step > req.verify_cost(nodes + 2) - req.verify_cost(nodes + 1)

    return grow(t.branches, cands, room, worth)


def verify_round(req, t: TreeRound) -> tuple[torch.Tensor, ...] | None:
    """One target pass over the root and every node of the tree."""
    t.start = len(req.ids)
    t.logits, hidden = forward_tree(req.bundle.target, req.cache, req.ids[-1], t.tree, t.start, bool(req.readers))
    return hidden


def walk(req, t: TreeRound) -> None:
    """The walk down the tree: greedy, or multi-step speculative sampling."""
    if req.s.greedy:
        t.verdict = verify_greedy(t.logits, t.tree)
    else:
        t.verdict = verify_sampled(t.logits, t.tree, t.branches, req.s, req.g_target)


def keep_path(req, t: TreeRound, hidden: tuple[torch.Tensor, ...] | None) -> None:
    """The cache keeps the root and the accepted nodes only; white-box arms get their hidden states."""
    rows = [0] + [n + 1 for n in t.verdict.path]
    keep_rows(req.cache, t.start - 1, rows)
    if hidden is not None:
        idx = torch.tensor(rows, device=hidden[0].device)
        kept = tuple(h.index_select(1, idx) for h in hidden)
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
    t.g = branch_betas(t.logits, t.tree, t.branches, req.s)
    t.rewards = [None] * len(req.arms)
    for b in own_branches(t):
        g, k = t.g[b.arm], len(b.tokens)
        t.rewards[b.arm] = reward(req.st.reward, g, k, req.st.gamma, t.draft_ms.get(b.arm, 0.0), k + 1,
                                  req.verify_cost)
        req.ledger.arms[req.names[b.arm]].scored_tokens += 1 + expected_accepted(g)
    req.policy.update(t.lead, t.rewards)
    req.policy.observe_tree(t.g)
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
        best = t.logits[rows].argmax(-1)
        g = [float(x == int(y)) for x, y in zip(b.tokens, best.tolist(), strict=True)]
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
    ideal = sum(t.draft_ms.get(i, 0.0) for i in ([t.lead] if b else [])) + req.verify_cost(1 + len(draft))
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
        regret_tree_ms=led.regret_tree_ms,
    )


def play_round(req, awake: list[bool] | None, clock, inspect=None):
    """One tree round, its steps timed like the chain's: pick (the plan), draft, verify (the target's
    pass), accept (the walk's result, the cache trimmed), score, learn, emit."""
    t = plan_tree(req, awake)
    clock.lap("pick")
    draft_tree(req, t)
    clock.lap("draft")
    hidden = verify_round(req, t)
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
