"""Where two greedy outputs part, and whether the target was nearly tied there (docs/DESIGN.md §5).

In fp32 our engine's greedy output equals the target's own greedy decoding token for token. In bfloat16
(a GPU preset's default) it need not: verifying several tokens in one forward pass adds the same numbers in
another order than decoding one token at a time does, and bfloat16 keeps 8 significant bits, so two
candidates whose logits are nearly equal can swap places. `first_divergence` finds where two outputs part
and measures the target's margin there with one forward pass, so a difference can be told apart from a bug:
a near-tie is rounding, a wide margin is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from metasd.decoding.loading import Bundle

# The widest spread (best logit minus the lower of the two parting tokens' logits) at which a divergence
# still counts as rounding, per dtype. bfloat16's comes from scripts/measure_bf16.py on the offline preset
# (18 prompts x 64 tokens, 2026-12-01; docs/BENCHMARKS.md, bf16): over 1043 positions a bf16 forward pass put the top-two gap
# up to 0.46 logit away from fp32's (median 0.065, 99th percentile 0.33), and the spread this module
# measures carries one such error; every divergence found sat at a bf16 gap of at most 0.125 and an fp32 gap
# of at most 0.145, while the median fp32 gap over all positions is 1.68 and only 22% of positions are within
# 0.5. fp16 keeps 3 more bits than bf16 (errors about 8x smaller); in fp32 a divergence wider than 1e-3 is a bug.
NEAR_TIE: dict[torch.dtype, float] = {torch.bfloat16: 0.5, torch.float16: 0.0625, torch.float32: 1e-3}
DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


@dataclass(frozen=True)
class Divergence:
    """The first position where two generated id sequences differ, with the target's logits there."""

    position: int  # 0-based index into the generated ids (the page says "token position + 1")
    ours: int
    reference: int
    top_two: tuple[int, int]  # the target's two best ids at that position, best first
    gap: float  # logit(top_two[0]) - logit(top_two[1])
    top_logit: float
    ours_logit: float
    reference_logit: float
    dtype: torch.dtype

    @property
    def bound(self) -> float:
        return NEAR_TIE.get(self.dtype, NEAR_TIE[torch.float32])

    @property
    def spread(self) -> float:
        """How far the lower of the two tokens' logits sits below the target's best logit there."""
        return self.top_logit - min(self.ours_logit, self.reference_logit)

    @property
    def near_tie(self) -> bool:
        """Both tokens sit within rounding distance of the target's best logit there (NEAR_TIE)."""
        return self.spread <= self.bound

    def explain(self, tokenizer=None) -> str:
        """One plain-English sentence for the page."""
        name = DTYPE_NAMES.get(self.dtype, str(self.dtype).replace("torch.", ""))
        where = f"the outputs part at token {self.position + 1}"
        if tokenizer is not None:
            where += f" ({_show(tokenizer, self.ours)} here, {_show(tokenizer, self.reference)} in the target's own)"
        if self.near_tie:
            return (f"{where}: the target's top two candidates there differ by {self.gap:.2f} in logit, a near-tie "
                    f"that batched verification in {name} can round either way")
        return (f"{where}: the two tokens' logits there are {self.spread:.2f} apart at the top, more than "
                f"{name} rounding explains (a near-tie there is within {self.bound:g}); please report it")


def _show(tokenizer, token_id: int) -> str:
    return repr(tokenizer.decode([token_id]))


def _parting(ours: Sequence[int], reference: Sequence[int]) -> int | None:
    for i, (a, b) in enumerate(zip(ours, reference, strict=False)):
        if a != b:
            return i
    return None


@torch.inference_mode()
def first_divergence(bundle: Bundle, prompt_ids: Sequence[int], ours: Sequence[int],
                     reference: Sequence[int]) -> Divergence | None:
    """Where `ours` and `reference` (generated ids after `prompt_ids`) first differ, or None.

    Only their common length is compared: an output cut short (Stop, a smaller budget) that agrees so far
    has not parted. At the first difference, one forward pass of the bundle's target over the prompt and the
    shared prefix gives its logits there, in the bundle's own dtype.
    """
    pos = _parting(ours, reference)
    if pos is None:
        return None
    ids = torch.tensor([[*prompt_ids, *reference[:pos]]], device=bundle.device)
    logits = bundle.target(input_ids=ids, logits_to_keep=1).logits[0, -1].float()
    top = torch.topk(logits, 2)
    a, b = (int(i) for i in top.indices)
    return Divergence(position=pos, ours=int(ours[pos]), reference=int(reference[pos]), top_two=(a, b),
                      gap=float(top.values[0] - top.values[1]), top_logit=float(top.values[0]),
                      ours_logit=float(logits[int(ours[pos])]),
                      reference_logit=float(logits[int(reference[pos])]), dtype=bundle.target.dtype)
