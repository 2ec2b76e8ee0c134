"""What a round asks of whoever runs its passes, and the pass it gets when it runs alone.

A request's round (metasd.decoding.engine.steps) does not run the target itself: it yields a VerifyPart (the ids to
verify, from a position, on its own KV cache) and receives the logits back, and its model drafters' forwards are
asked the same way (DraftPart). The engine answers them with a pass of the request's own (`forward_alone`, the
model's forward); the shared rounds (metasd.serving.batch) answer many requests' parts in one pass. Drafters,
the engine and the serving layer all import these types from here, below all of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache


@dataclass
class VerifyPart:
    """One request's share of a pass: the ids it feeds (its last id, then its draft), the position of the
    first of them, and its own KV cache (extended in place, as a solo pass would)."""

    ids: list[int] | torch.Tensor
    start: int
    cache: object
    keep: int = 0  # logits for the last `keep` rows only (0: every row), as transformers' logits_to_keep
    # Hidden states this part wants back (indices into transformers' `hidden_states`: 0 the embeddings, i the
    # output of layer i, L the final normed state): a white-box drafter's features. A shared pass fills
    # `states` with each wanted index's rows of this part ([1, len(ids), width], every row, whatever `keep`).
    features: tuple[int, ...] = ()
    states: dict[int, torch.Tensor] | None = None
    # A token tree's pass (metasd/decoding/tree.py): each id's own position (the root's, then each node's at its
    # depth) instead of start + i, and the additive 4D mask over the cached positions and these ids through
    # which a node sees only its ancestors. None: a chain's pass, causal from `start`.
    positions: list[int] | None = None
    mask: torch.Tensor | None = None

    def position_ids(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """[1, len(ids)]: the positions the pass gives these ids."""
        if self.positions is not None:
            return torch.tensor([self.positions], device=device)
        return torch.arange(self.start, self.start + len(self.ids), device=device).view(1, -1)


@dataclass
class DraftPart:
    """A model drafter's forward, asked of the driver instead of run on the spot: `part` through `model`
    (metasd.drafting.drafters.ModelDrafter.propose_steps). The shared rounds run every request's part for the
    same drafter model in one pass, as they verify; `spent_s` is then this part's share of that pass's time,
    which the request charges to its drafter (not the time it waited for the others)."""

    model: torch.nn.Module
    part: VerifyPart
    spent_s: float = 0.0


@dataclass
class HeadPart:
    """A white-box head's step over one request's rows (metasd.drafting.whitebox), asked of the driver as a
    DraftPart is: feature rows `g` ([T, width]: fused target features, or the head's own output state) with
    the tokens that follow them (`tokens`, [T]) at positions `pos` ([1, T]), after this request's cached keys
    and values `past`. Answered with (output states [1, T, width], the keys and values of past and these rows
    together (the request's cache after the step), the draft logits of the last row); the shared rounds run
    every request's part for the same head in one call (`WhiteBoxHead.run_together`)."""

    model: torch.nn.Module
    g: torch.Tensor
    tokens: torch.Tensor
    pos: torch.Tensor
    past: tuple[torch.Tensor, torch.Tensor] | None
    spent_s: float = 0.0


def head_alone(p: HeadPart) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A head part on a call of its own."""
    t = time.perf_counter()
    out = p.model.run_together([p])[0]
    p.spent_s = time.perf_counter() - t
    return out


def crop_to(cache: DynamicCache, length: int) -> None:
    """Roll a cache back to its first `length` tokens (transformers 5: crop(-n) drops the last n)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


@torch.no_grad()
def forward_alone(d: DraftPart) -> torch.Tensor:
    """A drafter part on a pass of its own (transformers' forward): its kept rows' logits."""
    p = d.part
    dev = next(d.model.parameters()).device
    ids = torch.as_tensor(p.ids, device=dev).view(1, -1)
    pos = torch.arange(p.start, p.start + ids.shape[1], device=dev).view(1, -1)
    t = time.perf_counter()
    out = d.model(input_ids=ids, position_ids=pos, past_key_values=p.cache, use_cache=True, logits_to_keep=p.keep)
    d.spent_s = time.perf_counter() - t
    return out.logits[0]


def solo(steps: Generator[Any, Any, Any], answer: Callable[[Any], Any]) -> Any:
    """Run a step generator to its end, answering each thing it asks with `answer(it)`: its return value."""
    try:
        x = next(steps)
        while True:
            x = steps.send(answer(x))
    except StopIteration as end:
        return end.value
