"""A round as a token tree: several drafters' proposals verified in one target pass.

Each contributing arm drafts a chain (its branch). The branches merge into a prefix tree (a shared
prefix is one node, which remembers every arm that proposed it and that arm's q row). The target
reads the round's last id (the root) and every node at once: a tree attention mask lets each node see
the cache, its ancestors and itself, and each node sits at position start - 1 + depth. Verification
walks down from the root:

- greedy: follow the child whose token is argmax p; stop where no child is. The kept path is the
  target's own greedy continuation, so the output equals the target's greedy output.
- sampled: SpecInfer's multi-step speculative sampling. At a node, each proposal of a child (one per
  arm that proposed it) is accepted with probability min(1, p(x) / q(x)) under the current p; a
  rejection replaces p by norm(max(0, p - q)). After every proposal is rejected, the token is drawn
  from what is left of p. Each proposal is a draw from its q independent of the others (for a
  deterministic drafter q is one-hot), so by the chain's argument applied once per proposal, the
  emitted token has distribution p; the proposals below an accepted child are draws conditioned on
  that child only, so the argument repeats at every depth. The argument needs the order in which a
  node's proposals are tried, and which proposals exist there, to be fixed before anything is drawn:
  an order by drafted length (a sampled drafter stops early on its own draws) or extras that exist
  only where no sampled chain went both bias the output (tests/test_tree.py enumerates it exactly).
  So the arms' own chains are tried in the order the policy planned them (planned depth, then arm),
  and the extra candidates after them, in the order they were added (`proposals`).

Then the cache keeps only the root and the accepted nodes (their keys and values gathered into
place, the rest dropped): what a fresh prefill of the accepted text gives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from metasd.core.kvcache import ReservedLayer
from metasd.core.passes import crop_to
from metasd.core.sampling import Sampling, warp


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

    def node_of(self, path: Sequence[int]) -> int:
        """The node reached from the root by these ids (each must be there)."""
        node = -1
        for tok in path:
            node = next(c for c in self.children[node] if self.tokens[c] == tok)
        return node

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


def prefixes(branches: Sequence[Branch]) -> set[tuple[int, ...]]:
    """Every path from the root the branches hold: one per node of the tree they make."""
    return {tuple(b.tokens[:j]) for b in branches for j in range(1, len(b.tokens) + 1)}


def grow(branches: Sequence[Branch], candidates: Sequence[tuple[int, tuple[int, ...], float]], room: int,
         worth: Callable[[float, int], bool] | None = None) -> list[Branch]:
    """Extra branches for a tree of `branches`: the arms' other candidates, most probable first.

    `candidates` are (arm, path from the root, estimated chance the whole path is the target's) and each
    arm's are prefix-closed (a path's prefixes are candidates of the same arm too). A node joins when its
    parent is in the tree already, while `room` lasts and `worth(score, nodes so far)` agrees (the
    caller weighs the expected accepted ids against the measured cost of one more verified id). In a
    greedy round the expected accepted ids of a tree are the sum of its nodes' path chances, so adding
    the most probable eligible node first is the best one-node step. Returns one branch per new leaf."""
    have = prefixes(branches)
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
    Our own layers (ReservedLayer) move the rows in place unless a layer-skip drafter holds those positions;
    others get new tensors (never written in place: such a drafter may hold the old ones). When the
    rows are the pass's first ones (the kept path is the lead's branch, numbered first) a crop does it."""
    if list(rows) == list(range(len(rows))):
        crop_to(cache, past + len(rows))
        return
    idx = torch.tensor([past + r for r in rows], dtype=torch.long)
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys is None or layer.keys.numel() == 0:
            continue
        i = idx.to(layer.keys.device)
        if isinstance(layer, ReservedLayer):  # in place where no copy reads those positions (metasd/core/kvcache.py)
            layer.keep_rows(past, i)
            continue
        layer.keys = torch.cat([layer.keys[:, :, :past], layer.keys.index_select(2, i)], dim=2)
        layer.values = torch.cat([layer.values[:, :, :past], layer.values.index_select(2, i)], dim=2)


@dataclass(frozen=True)
class TreeVerdict:
    path: list[int]  # the accepted nodes, root-most first
    token: int  # the target's own token after the path: a correction, or a bonus at a leaf

    @property
    def accepted(self) -> int:
        return len(self.path)


def verify_greedy(logits: torch.Tensor, tree: TokenTree, best: list[int] | None = None) -> TreeVerdict:
    """Follow argmax p down the tree: the longest path that is the target's own greedy continuation (`best`: the
    rows' argmax, where the caller has it)."""
    best = logits.argmax(-1).tolist() if best is None else best
    node, path = -1, []
    while True:
        want = best[node + 1]
        child = next((c for c in tree.children[node] if tree.tokens[c] == want), None)
        if child is None:
            return TreeVerdict(path, want)
        path.append(child)
        node = child


def proposals(tree: TokenTree, node: int, branches: Sequence[Branch]) -> list[tuple[int, int]]:
    """(child, arm) pairs below `node` in the order they are tried: one per branch that passes through it, in
    the branches' order (the arms' own chains as planned, then the extras as added), each arm once per child."""
    d = tree.depths[node] if node >= 0 else 0
    out: list[tuple[int, int]] = []
    for b, nodes in zip(branches, tree.branch_nodes, strict=True):
        if len(nodes) > d and (d == 0 or nodes[d - 1] == node) and (nodes[d], b.arm) not in out:
            out.append((nodes[d], b.arm))
    return out


def accepts(chance: float, generator: torch.Generator | None, device: torch.device | str = "cpu") -> bool:
    """One proposal's acceptance, a Bernoulli(chance) draw (one uniform consumed whatever the chance)."""
    return float(torch.rand(1, generator=generator, device=device)) < chance


def draw(p: torch.Tensor, generator: torch.Generator | None) -> int:
    """One id from p."""
    return int(torch.multinomial(p, 1, generator=generator).item())


def verify_sampled(logits: torch.Tensor, tree: TokenTree, branches: Sequence[Branch], s: Sampling,
                   generator: torch.Generator | None) -> TreeVerdict:
    """Multi-step speculative sampling (SpecInfer) over the tree: the emitted ids have the target's
    distribution whatever the drafters proposed."""
    q_of = {b.arm: b.q for b in branches if not b.extra}
    p_rows = warp(logits, s)
    node, path = -1, []
    while True:
        p = p_rows[node + 1]
        moved = False
        for child, arm in proposals(tree, node, branches):
            x = tree.tokens[child]
            q_arm = q_of.get(arm)  # an extra candidate (never sampled) proposes its id outright
            own = q_arm is not None and child in tree.paths.get(arm, ())
            q = q_arm[tree.proposers[child][arm]] if own else None
            qx = float(q[x]) if q is not None else 1.0
            if accepts(min(1.0, float(p[x]) / qx) if qx > 0 else 0.0, generator, p.device):
                path.append(child)
                node, moved = child, True
                break
            p = residual(p, q, x)
        if not moved:
            return TreeVerdict(path, draw(p, generator))


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


def branch_betas(logits: torch.Tensor, tree: TokenTree, branches: Sequence[Branch], s: Sampling,
                 best_rows: list[int] | None = None) -> dict[int, list[float]]:
    """Per arm, the chance each position of its branch passes chain verification, had it drafted alone:
    every node was verified, so row parent(node) is the target's p at the arm's own context. Greedy:
    1 where the id is argmax p, else 0; sampled: p(x) for a one-hot q, sum min(p, q) otherwise."""
    best = (best_rows if best_rows is not None else logits.argmax(-1).tolist()) if s.greedy else None
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
