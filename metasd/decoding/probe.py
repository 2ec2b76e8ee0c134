"""What one target pass costs by the number of ids it is fed, measured once per loaded model.

The cost-aware policy and the token tree compare a round's expected tokens with its time, and a
request learns the verification time only for the id counts it feeds. Its first rounds feed gamma + 1
ids, so a plain step (1 id) was extrapolated from them, flat: on this CPU it is ~9% cheaper than
2 ids (docs/DESIGN.md §1), enough that a drafter accepting one id in fifteen looked worth its pass.
The probe gives every request the shape of the curve from its first round; the request's own
measurements then scale it to its context and company (metasd/core/costs.py).
"""

from __future__ import annotations

import time

import torch

from metasd.core.kvcache import new_cache
from metasd.core.passes import crop_to

# Id counts probed: every count of a default chain (gamma 4-5: up to 6 ids) and a tree's budget, then
# wider steps (the cost grows about linearly there); counts between are interpolated.
PROBE_IDS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16)
CONTEXT = 48  # ids already cached: a short prompt's, so the probe takes 2.5-3.5 s on a 2-core CPU


def verify_profile(model: torch.nn.Module, counts: tuple[int, ...] = PROBE_IDS, repeats: int = 3
                   ) -> tuple[tuple[int, float], ...]:
    """(ids fed, ms) of one cached forward pass for each count: the fastest of `repeats`, the counts
    interleaved so that a slow moment spreads over all of them, made non-decreasing (feeding more ids
    never costs less; a measured dip is noise)."""
    dev = next(model.parameters()).device
    vocab = int(model.get_output_embeddings().weight.shape[0])
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, CONTEXT + max(counts)), generator=g).to(dev)
    best = {n: float("inf") for n in counts}
    with torch.no_grad():
        cache = new_cache(model.config)
        model(input_ids=ids[:, :CONTEXT], past_key_values=cache, use_cache=True, logits_to_keep=1)
        for rep in range(repeats + 1):  # the first sweep warms the kernels for every shape: not kept
            for n in counts:
                t = time.perf_counter()
                model(input_ids=ids[:, CONTEXT:CONTEXT + n], past_key_values=cache, use_cache=True, logits_to_keep=n)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                ms = (time.perf_counter() - t) * 1000
                crop_to(cache, CONTEXT)
                if rep:
                    best[n] = min(best[n], ms)
    out, top = [], 0.0
    for n in sorted(counts):
        top = max(top, best[n])
        out.append((n, top))
    return tuple(out)
