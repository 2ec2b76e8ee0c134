"""What one target pass costs by the number of ids it is fed, measured once per loaded model.

The cost-aware policy and the token tree compare a round's expected tokens with its time, and a
request learns the verification time only for the id counts it feeds. Its first rounds feed gamma + 1
ids, so a plain step (1 id) was extrapolated from them, flat: on this CPU it is ~9% cheaper than
2 ids (docs/DESIGN.md §1), enough that a drafter accepting one id in fifteen looked worth its pass.
The probe gives every request the shape of the curve from its first round; the request's own
measurements then scale it to its context and company (metasd/core/costs.py).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from metasd.core.kvcache import new_cache
from metasd.core.passes import crop_to

# Id counts probed: every count of a default chain (gamma 4-5: up to 6 ids) and a tree's budget, then
# wider steps (the cost grows about linearly there); counts between are interpolated.
PROBE_IDS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16)
CONTEXT = 48  # ids already cached: a short prompt's, so the probe takes 2.5-3.5 s on a 2-core CPU
# A probe is disturbed when its sweeps disagree on the curve's shape: per count, the largest over the smallest
# of the sweeps' (count / one id) ratios, the median over counts. On the 2-core development CPU a quiet probe
# read 1.02-1.13 (one try in five 1.23); with a process beside it busy 40% of the time, 1.17-1.70, and its curve
# can come out steep enough that no draft looks worth verifying, or flat, for every request of the process
# (docs/BENCHMARKS.md, "A disturbed probe").
CALM_SPREAD = 1.2
ATTEMPTS = 3  # a disturbed probe is taken again (a start-up's burst passes in seconds); the calmest is kept

Sweep = dict[int, float]


def verify_profile(model: torch.nn.Module, counts: tuple[int, ...] = PROBE_IDS, repeats: int = 3,
                   attempts: int = ATTEMPTS) -> tuple[tuple[int, float], ...]:
    """(ids fed, ms) of one cached forward pass for each count, from `repeats` sweeps over the counts (see
    profile_of). A disturbed probe (`spread` above CALM_SPREAD) is taken again, up to `attempts` in all, and
    the calmest kept."""
    counts = tuple(sorted({1, *counts}))  # every count is read against one id's pass
    best: tuple[float, list[Sweep]] | None = None
    for _ in range(max(1, attempts)):
        sweeps = _sweeps(model, counts, repeats)
        got = spread(sweeps)
        if best is None or got < best[0]:
            best = (got, sweeps)
        if got <= CALM_SPREAD:
            break
    else:
        print(f"[metasd] the verification probe was disturbed in all {attempts} tries (spread {best[0]:.2f}); "
              "the calmest is kept", file=sys.stderr, flush=True)
    return profile_of(best[1])


def _ratios(sweeps: list[Sweep]) -> dict[int, list[float]]:
    """Each count's pass over the same sweep's one-id pass, sweep by sweep: a slow spell over a whole sweep cancels."""
    return {n: [s[n] / max(s[1], 1e-9) for s in sweeps] for n in sweeps[0]}


def spread(sweeps: list[Sweep]) -> float:
    """How much the sweeps disagree on the curve's shape: per count, the largest over the smallest of its ratios
    to one id; the median over counts (1.0: alike)."""
    ratios = [max(r) / max(min(r), 1e-9) for n, r in _ratios(sweeps).items() if n != 1]
    return statistics.median(ratios) if len(sweeps) > 1 and ratios else 1.0


def profile_of(sweeps: list[Sweep]) -> tuple[tuple[int, float], ...]:
    """The median one-id pass times each count's median ratio to it, made non-decreasing in the count (feeding
    more ids never costs less; a dip is noise). Ratios, not each count's fastest pass: the fastest one-id pass of
    a lucky moment made every count look dearer than the machine's curve (a plan's margin is a few percent)."""
    one = statistics.median(s[1] for s in sweeps)
    out, top = [], 0.0
    for n, r in sorted(_ratios(sweeps).items()):
        top = max(top, one * statistics.median(r))
        out.append((n, top))
    return tuple(out)


def _sweeps(model: torch.nn.Module, counts: tuple[int, ...], repeats: int) -> list[Sweep]:
    """`repeats` timed sweeps over every count, after one untimed sweep that warms the kernels for every shape."""
    dev = next(model.parameters()).device
    vocab = int(model.get_output_embeddings().weight.shape[0])
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, CONTEXT + max(counts)), generator=g).to(dev)
    sweeps: list[Sweep] = []
    with torch.no_grad():
        cache = new_cache(model.config)
        model(input_ids=ids[:, :CONTEXT], past_key_values=cache, use_cache=True, logits_to_keep=1)
        for rep in range(repeats + 1):
            sweep: Sweep = {}
            for n in counts:
                t = time.perf_counter()
                model(input_ids=ids[:, CONTEXT:CONTEXT + n], past_key_values=cache, use_cache=True, logits_to_keep=n)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                sweep[n] = (time.perf_counter() - t) * 1000
                crop_to(cache, CONTEXT)
            if rep:
                sweeps.append(sweep)
    return sweeps
