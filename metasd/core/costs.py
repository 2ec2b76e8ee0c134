"""What a round costs and what it is worth: the verification cost model and the arm rewards.

docs/DESIGN.md §1 gives the formulas; §4 the CPU measurements that make a cost model necessary
(verifying gamma + 1 ids costs about one step on a GPU; on a CPU ~4% of a step more per id with the
packed linear layers of metasd/models/cpu_linear.py, ~15% with torch's default kernels).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from metasd.paths import COSTS_FILE

# Cost of one more verified id relative to a one-id step, used until two counts are measured.
# This CPU measures ~4% with the target's linear layers packed for oneDNN and ~15% with torch's
# default kernels (docs/DESIGN.md §4, scripts/measure_verify.py); a GPU measures ~0 within a few rounds.
EXTRA_ID_PRIOR = 0.15
EXTRA_ID_PRIOR_PACKED = 0.04


def expected_accepted(g: Sequence[float]) -> float:
    """E[accepted] = sum_i prod_{j<i} g_j: the chance that the first i positions all pass."""
    total, run = 0.0, 1.0
    for x in g:
        run *= x
        total += run
    return total


class VerifyCost:
    """Smoothed time (ms) of one verification by the number of ids fed (1 .. gamma + 1 and beyond).

    With `profile`, (ids, ms) pairs probed once for the model (metasd/decoding/probe.py), a count costs
    scale * profile(count), where `scale` follows every pass this request verifies, whatever its count
    (its context and company make every count dearer or cheaper together). The probe's shape is kept:
    it is the fastest of several interleaved sweeps, while a request's own reading of one count is a single
    pass whose moment (another process, a slow core) says nothing of that count. Costs kept per count
    made two traps: one slow three-id pass read early priced three ids for the rest of an answer (a tree
    planned plain steps for 120 rounds: no other count was fed again to correct it), and a count read in
    a slow minute looked dearer than its neighbours read in a fast one. Without a profile, the counts fed
    are kept, interpolated between and extrapolated beyond."""

    def __init__(self, gamma: int, extra_id: float = EXTRA_ID_PRIOR,
                 profile: Sequence[tuple[int, float]] = ()) -> None:
        self.ms = [0.0] * (gamma + 2)
        self.extra_id = extra_id
        self.profile = tuple(profile)
        self.scale = 0.0  # smoothed measured / profiled, over every pass
        # (requests, the others' ids) of the shared pass this request's last verification was part of; None: alone.
        # Set by the class's driver (metasd/serving/batch.py); read with a profile only.
        self.company: tuple[int, int] | None = None
        # Fixed prices (a sampled run, `Prices` below): plans read the stored profile alone, never the clock or the
        # company, so that a seed repeats; `measured` still follows the passes, for what the books report.
        self.fixed = False

    def add(self, fed: int, ms: float) -> None:
        if self.profile:  # the per-count averages below are read only without one
            # In company the request waited for the whole pass: profiled at every id the pass fed.
            whole = fed + self.company[1] if self.company else fed
            ratio = ms / max(profiled(self.profile, whole), 1e-6)
            self.scale = ratio if not self.scale else 0.8 * self.scale + 0.2 * ratio
            return
        if fed >= len(self.ms):  # a token tree may feed more ids than a chain's gamma + 1
            self.ms.extend([0.0] * (fed + 1 - len(self.ms)))
        old = self.ms[fed]
        self.ms[fed] = ms if old == 0 else 0.8 * old + 0.2 * ms

    def __call__(self, fed: int) -> float:
        if self.fixed:
            return profiled(self.profile, fed)
        if self.profile:
            return (self.scale or 1.0) * self.share(fed)
        if fed < len(self.ms) and self.ms[fed]:
            return self.ms[fed]
        seen = [(i, m) for i, m in enumerate(self.ms) if m]
        if not seen:
            return 1.0
        lo = [(i, m) for i, m in seen if i < fed]
        hi = [(i, m) for i, m in seen if i > fed]
        if lo and hi:  # between two measured counts: interpolate
            (i0, m0), (i1, m1) = lo[-1], hi[0]
            return m0 + (m1 - m0) * (fed - i0) / (i1 - i0)
        # Outside them: the slope of the two nearest, or the prior per extra id.
        near = (lo[-2:] if lo else hi[:2])
        (i0, m0) = near[-1] if lo else near[0]
        slope = ((near[1][1] - near[0][1]) / (near[1][0] - near[0][0]) if len(near) == 2
                 else self.extra_id * m0 / max(i0, 1))
        return max(m0 + max(slope, 0.0) * (fed - i0), 1e-3)

    def measured(self, fed: int) -> float:
        """What `fed` ids cost as measured (ms), whether or not plans read it: the books' yardstick."""
        if self.fixed:
            return (self.scale or 1.0) * self.share(fed)
        return self(fed)

    def share(self, fed: int) -> float:
        """A request's part of its pass (unscaled): alone, the probed profile's; in company, an equal part of what a
        pass costs whatever it feeds (one id's) plus what its own ids add to the others'. Alone the first 6-8 ids cost
        one step on this CPU; in a class's pass of 48 ids each id adds ~1.8 ms to a 157 ms pass, one ninth of a one-id
        share among 8 (docs/DESIGN.md §7). Priced so, every request's best plan is also the class's: the most tokens
        per second of the pass, summed over its requests (a plan priced by the solo curve feeds ids the class pays
        for)."""
        requests, others = self.company or (1, 0)
        if requests <= 1:
            return profiled(self.profile, fed)
        return (profiled(self.profile, 1) / requests + profiled(self.profile, others + fed)
                - profiled(self.profile, others))


# Fixed prices where a preset has none stored: one target step of NOMINAL_STEP_MS, each verified id past the first
# `extra_id` of a step more (none on a GPU), and each drafted token a share of a step by the drafter's family.
NOMINAL_STEP_MS = 40.0
NOMINAL_C = {"model-free": 0.01, "self": 0.5, "model": 0.2, "distilled": 0.1, "white-box": 0.1}
NOMINAL_IDS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Prices:
    """What a sampled run's plans read instead of the clock: a verification profile (ids fed, ms) and each drafter's
    ms per drafted token, fixed before the run starts. Under sampling the emitted text depends on which drafts were
    verified, so plans priced from measured milliseconds (the cost-aware bandit, the token tree, the throughput
    reward) made a seed give other text on every run; priced so, it repeats (docs/DESIGN.md §1). `source` says
    where they came from: "stored" (assets/drafters/costs.json, `drafters --measure --save`) or "nominal"."""

    verify: tuple[tuple[int, float], ...]
    drafter_ms: Mapping[str, float] = field(default_factory=dict)
    source: str = "nominal"

    def drafter(self, name: str, family: str) -> float:
        """ms per drafted token: the stored figure, else the family's nominal share of the profile's one-id pass."""
        got = self.drafter_ms.get(name)
        if got is not None:
            return float(got)
        return NOMINAL_C.get(family, NOMINAL_C["model"]) * profiled(self.verify, 1)


def cost_entry(preset: str, threads: int | None = None) -> dict[str, Any]:
    """A preset's record in assets/drafters/costs.json (c, drafter_ms, target_step_ms, verify_ms, device, threads, how
    it was measured): {} where it has none or the file does not parse. With `threads`, the figures measured at that
    many torch threads (`by_threads`) replace the record's own where it has them: one thread's pass is not two
    threads' pass made slower, its shape by ids fed differs too. Read per sampled request, so that a `drafters
    --measure --save` is seen without a restart (it replaces the file whole: a reader never sees half of it)."""
    try:
        entry = json.loads(COSTS_FILE.read_text(encoding="utf-8")).get(preset, {})
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(entry, dict):
        return {}
    by = entry.get("by_threads")
    at = by.get(str(threads)) if threads is not None and isinstance(by, dict) else None
    # Whole or not at all: one count's drafter costs beside another count's curve would be neither's prices.
    return {**entry, **at, "threads": threads} if isinstance(at, dict) and "verify_ms" in at else entry


def fixed_prices(stored: Mapping | None, extra_id: float, device: str = "cpu") -> Prices:
    """A preset's fixed prices: its stored profile and drafter costs where `drafters --measure --save` recorded them on
    this kind of `device` (`stored`: its entry of costs.json; a CPU's prices would starve a GPU's trees), else a
    nominal line (`extra_id` of a step per id past the first; flat on a GPU, which verifies a few more ids for
    about nothing)."""
    if stored and stored.get("device", "cpu") != device:
        stored = None
    if device == "cuda":
        extra_id = 0.0
    try:  # a hand-edited record that does not read as (ids, ms) pairs and {name: ms}: no stored prices
        profile = tuple((int(n), float(ms)) for n, ms in (stored or {}).get("verify_ms", ()))
        drafter_ms = {str(k): float(v) for k, v in (stored or {}).get("drafter_ms", {}).items()}
        step = float((stored or {}).get("target_step_ms", 0.0))
    except (TypeError, ValueError, AttributeError):
        stored, profile, drafter_ms, step = None, (), {}, 0.0
    if profile:
        return Prices(profile, drafter_ms, "stored")
    # A stored step keeps stored drafter costs in proportion; without one, nominal all through.
    step = step if step > 0 else NOMINAL_STEP_MS
    line = tuple((n, step * (1.0 + extra_id * (n - 1))) for n in NOMINAL_IDS)
    return Prices(line, drafter_ms if stored and "target_step_ms" in stored else {}, "nominal")


def profiled(profile: Sequence[tuple[int, float]], fed: int) -> float:
    """A probed profile's ms at `fed` ids: interpolated between probed counts, the last slope past them."""
    pts = sorted(profile)
    if fed <= pts[0][0]:
        return max(pts[0][1], 1e-3)
    for (i0, m0), (i1, m1) in zip(pts, pts[1:], strict=False):
        if fed <= i1:
            return m0 + (m1 - m0) * (fed - i0) / (i1 - i0)
    (i0, m0), (i1, m1) = (pts[-2], pts[-1]) if len(pts) > 1 else (pts[0], pts[0])
    slope = (m1 - m0) / (i1 - i0) if i1 > i0 else 0.0
    return m1 + max(slope, 0.0) * (fed - i1)


def reward(kind: str, g: Sequence[float], k: int, gamma: int, drafted_ms: float, fed: int,
           cost: Callable[[int], float]) -> float:
    """An arm's reward in [0, 1] from per-position acceptance probabilities g (docs/DESIGN.md §1, formula 5).

    k is the draft length asked for this round (gamma, or less where the length adapts).
    bd: block divergence, mean of 1 - TV(p_j, q_j) over the k positions (0 where nothing was drafted).
    be: block efficiency, expected accepted / k.
    throughput: expected tokens per second of the round, relative to the best a round can do
    (gamma + 1 tokens from a free drafter); so a cheap drafter that accepts a little less can
    beat a costly one, and a drafter that proposes nothing is charged one plain step.
    """
    if kind == "bd":
        return sum(g) / max(k, 1)
    e = expected_accepted(g)
    if kind == "be":
        return e / max(k, 1)
    best = (gamma + 1) / cost(gamma + 1)
    return min(1.0, (1 + e) / (drafted_ms + cost(fed)) / best)


def best_length(alpha: float, kmax: int, ms_per_token: float, cost: Callable[[int], float]) -> tuple[float, int]:
    """Expected tokens per ms of a round whose drafted positions each pass with probability alpha,
    and the draft length 0..kmax that maximises it (0: a plain target step)."""
    best_v, best_k = 1.0 / cost(1), 0
    for kk in range(1, kmax + 1):
        v = (1.0 + expected_accepted([alpha] * kk)) / (kk * ms_per_token + cost(kk + 1))
        if v > best_v:
            best_v, best_k = v, kk
    return best_v, best_k


def tree_budget(cost: Callable[[int], float], gamma: int, tolerance: float = 0.15, most: int = 0) -> int:
    """The most ids one tree round may verify: the largest count (up to `most`, default 2 * gamma + 2)
    whose measured cost stays within `tolerance` of a full chain's (gamma + 1 ids), never fewer than
    gamma + 1. On this CPU 1-6 ids cost one step and 7-9 about 25% more (docs/DESIGN.md §4), so the
    budget settles where verification stops being free; on a GPU it grows to `most`."""
    most = most or 2 * gamma + 2
    base = cost(gamma + 1)
    n = gamma + 1
    while n < most and cost(n + 1) <= base * (1.0 + tolerance):
        n += 1
    return n
