"""Logit warping and the speculative verification step (docs/DESIGN.md §1, formulas 1 and 2).

The target's p and a drafter's q go through the *same* warping (temperature, top-k, top-p);
verification then keeps exactly the tokens the target would have produced itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def warp(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p, in float32. Rows are positions."""
    logits = logits.float() / s.temperature
    if s.top_k and s.top_k < logits.shape[-1]:
        kth = torch.topk(logits, s.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the mass before it already reaches top_p (the first one always stays).
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= s.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


@dataclass(frozen=True)
class Verdict:
    accepted: int  # n: the draft prefix the target keeps
    token: int  # the target's own token: correction at position n, or bonus if n == k
    p_draft: list[float]  # p(x_j) per drafted position
    q_draft: list[float]  # q(x_j) per drafted position (1.0 for a deterministic drafter)
    beta: list[float]  # 1 - TV(p_j, q_j) per drafted position: the BD reward's terms
    accept_prob: list[float]  # min(1, p(x_j) / q(x_j))


def verify(
    target_logits: torch.Tensor,
    draft: torch.Tensor,
    q: torch.Tensor | None,
    s: Sampling,
    generator: torch.Generator | None,
) -> Verdict:
    """Verify k drafted tokens against the target's k + 1 logit rows in one step.

    target_logits: [k + 1, V], row j is the target's prediction for position j (row k: bonus).
    draft: [k] drafted ids. q: [k, V] the drafter's warped probabilities, or None for a
    deterministic drafter (q = one-hot of the draft) and for greedy decoding.
    """
    k = draft.shape[0]
    rows = torch.arange(k, device=draft.device)
    if s.greedy:
        # Greedy is the limit T -> 0: p and q are one-hot, accept while the draft equals argmax p.
        best = target_logits.argmax(-1)
        match = (draft == best[:k]).float()
        n = int(match.cumprod(0).sum().item()) if k else 0
        m = match.tolist()
        return Verdict(n, int(best[n].item()), m, [1.0] * k, m, m)

    p = warp(target_logits, s)
    p_x = p[rows, draft]
    if q is None:
        q_x = torch.ones_like(p_x)
        beta = p_x  # sum_x min(p, one-hot(x_j)) = p(x_j)
    else:
        q_x = q[rows, draft]
        beta = torch.minimum(p[:k], q).sum(-1)
    # Accept x_j with probability min(1, p(x_j) / q(x_j)); q(x_j) > 0 since x_j was drawn from q.
    ratio = torch.where(q_x > 0, p_x / q_x.clamp_min(1e-30), torch.zeros_like(p_x)).clamp(max=1.0)
    u = torch.rand(k, generator=generator, device=draft.device)
    n = int((u < ratio).float().cumprod(0).sum().item()) if k else 0
    if n < k:
        # First rejection: sample from the residual norm(max(0, p - q)).
        q_n = q[n] if q is not None else torch.nn.functional.one_hot(draft[n], p.shape[-1]).float()
        residual = (p[n] - q_n).clamp_min(0.0)
        total = residual.sum()
        dist = residual / total if total > 0 else p[n]
    else:
        dist = p[k]  # every draft accepted: one bonus token from p
    token = int(torch.multinomial(dist, 1, generator=generator).item())
    return Verdict(n, token, p_x.tolist(), q_x.tolist(), beta.tolist(), ratio.tolist())


def sample_or_argmax(
    logits: torch.Tensor, s: Sampling, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Next token from one row of logits [V], and its warped distribution (None when greedy)."""
    if s.greedy:
        return logits.argmax(-1), None
    q = warp(logits, s)
    return torch.multinomial(q, 1, generator=generator).squeeze(-1), q
