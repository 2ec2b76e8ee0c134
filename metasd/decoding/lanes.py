"""Drafter lanes: for every drafter of a request, its acceptance probability at each emitted token.

A lane cell is what the drafter would have scored at that position given the true text before it
(teacher-forced): in greedy decoding 1 where its prediction is the target's token and 0 elsewhere; when
sampling, the probability that a token drawn from the drafter passes verification there (sum min(p, q),
or p(x) for a deterministic drafter's token x), the same per-position terms the block-divergence reward
and full-information feedback use.

Where the cells come from:
- live, from what the engine already computes (RoundEvent.scores): the pulled drafter's realised
  acceptance at each position it drafted, and every drafter the round scored on its chunk: with
  full-information feedback all of them, otherwise the model-free ones (free feedback, microseconds);
- after the answer ends, for the cells still empty (`fill`): one target pass over prompt + answer (its
  logits, cache and hidden states), then each drafter replayed round by round, teacher-forced: a model
  drafter's cache catches up by each round's tokens only (one incremental pass over the answer; a windowed
  drafter sees the same recent context as when scored live), a model-free drafter's table or index grows
  as it did live. Live generation never waits for it.

The pulled drafter's lane agrees with each round by construction on its drafted positions (1 on the
accepted ones and 0 on the first rejected one in greedy decoding), and, for a drafter whose `predict`
matches its `propose` on the true text, also where it is filled afterwards (tests/test_lanes.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from metasd.core.sampling import Sampling, warp
from metasd.decoding.prompts import encode_prompt, scaffold_positions

if TYPE_CHECKING:
    from metasd.core.events import RoundEvent
    from metasd.decoding.loading import Bundle
    from metasd.drafting.drafters import Drafter

Lanes = dict[str, list[float]]
Cells = dict[str, list[float | None]]


def round_scores(names: Sequence[str], r: Any) -> dict[str, tuple[float, ...]]:
    """A round's live lane cells, for its event: each scored arm's per-position terms on the emitted chunk,
    and the pulled arm's own realised ones on the positions it drafted (accepted, then the first rejected)."""
    v = r.verdict
    out = {names[i]: tuple(float(x) for x in g) for i, g in r.scores.items() if i != r.arm}
    drafted = min(v.accepted + 1, len(r.tokens), len(r.emitted))
    if drafted:
        out[names[r.arm]] = tuple(float(x) for x in v.beta[:drafted])
    return out


def live_cells(rounds: Sequence[RoundEvent], names: Sequence[str], greedy: bool = False) -> Cells:
    """The cells the events carry, one list per drafter over the emitted tokens; None where not scored live.
    Events without scores (read back from a run file) still give, in greedy decoding, the pulled drafter's
    outcome on the positions it drafted: 1 on the accepted ones, 0 on the first rejected one."""
    n = sum(len(ev.emitted) for ev in rounds)
    cells: Cells = {d: [None] * n for d in names}
    at = 0
    for ev in rounds:
        scores = dict(ev.scores)
        if not scores and greedy and ev.draft and not ev.draft_extra:
            scores[ev.drafter] = (1.0,) * ev.accepted + ((0.0,) if ev.accepted < len(ev.draft) else ())
        for d, g in scores.items():
            if d in cells:
                for j, x in enumerate(g[: len(ev.emitted)]):
                    cells[d][at + j] = x
        at += len(ev.emitted)
    return cells


def missing(cells: Cells) -> bool:
    return any(x is None for lane in cells.values() for x in lane)


# ---- after the answer: the target's pass, then the drafters -------------------------------------


class TargetPass:
    """One teacher-forced target pass over prompt + answer (all but the last id: the engine's cache
    invariant): the cache a self-drafter adopts, the hidden states white-box drafters read, the logits of
    the answer's positions and of the prompt rows the drafters seed from."""

    def __init__(self, bundle: Bundle, ids: list[int], n_prompt: int, seed_rows: int, hidden: bool) -> None:
        from metasd.core.kvcache import new_cache

        self.ids, self.n_prompt = ids, n_prompt
        self.cache = new_cache(bundle.target.config)
        # Rows kept: the answer's positions and up to seed_rows before them (row t predicts ids[t + 1]).
        self.keep = min(len(ids) - 1, len(ids) - n_prompt + seed_rows)
        out = bundle.target(input_ids=torch.tensor([ids[:-1]], device=bundle.device), past_key_values=self.cache,
                            use_cache=True, logits_to_keep=self.keep, output_hidden_states=hidden)
        self.logits = out.logits[0]
        self.hidden = out.hidden_states
        self.first = len(ids) - 1 - self.keep  # position of logits row 0

    def rows(self, lo: int, hi: int) -> torch.Tensor:
        """The target's logits after positions lo .. hi - 1."""
        return self.logits[lo - self.first : hi - self.first]

    def features(self, d: Drafter, lo: int, hi: int) -> None:
        """Hand a white-box drafter the target's hidden states at positions lo .. hi - 1, as the engine does
        after prefill and after each verification (a windowed drafter keeps only the recent ones)."""
        d.take_features(lo, tuple(h[:, lo:hi] for h in self.hidden), hi - lo)


def _prepare(d: Drafter, tp: TargetPass, scaffold: frozenset[int]) -> None:
    """The drafter as the engine's prefill leaves it: reset, scaffold marked, seeded, given features."""
    prompt = tp.ids[: tp.n_prompt]
    d.reset(list(prompt))
    d.mark_scaffold(scaffold)
    if d.seed_rows:
        lo = max(tp.first, 0)
        rows = [t for t in range(lo, tp.n_prompt - 1) if t not in scaffold][-d.seed_rows:]
        if rows:
            d.seed([prompt[t] for t in rows], tp.logits[[t - tp.first for t in rows]])
    if d.feature_layers and tp.hidden is not None:
        tp.features(d, 0, tp.n_prompt - 1)


def _values(pred: torch.Tensor, truth: list[int], p_rows: torch.Tensor | None) -> list[float]:
    """Acceptance probabilities from a `predict` result: as Request._teacher_forced scores them."""
    pred = pred.cpu()
    if pred.dim() == 1 and p_rows is None:
        return (pred == torch.tensor(truth)).float().tolist()
    assert p_rows is not None
    p_rows = p_rows.cpu().float()
    if pred.dim() == 1:
        picked = p_rows[torch.arange(len(truth)), pred.clamp_min(0)]
        return torch.where(pred >= 0, picked, 0.0).tolist()
    return torch.minimum(p_rows, pred.float()).sum(-1).tolist()


def _chunks(rounds: Sequence[RoundEvent], d: Drafter) -> list[list[RoundEvent]]:
    """Consecutive rounds a drafter can predict in one call: a model-free drafter's state changes every round
    (one round each); a model drafter's prediction is a function of the context alone, so its rounds go
    together, at most `window` tokens at a time for a windowed one (a longer catch-up would restart it
    cold, which live scoring never does)."""
    if d.model_free:
        return [[ev] for ev in rounds]
    cap = getattr(d, "window", 0) or 1 << 30
    out: list[list[RoundEvent]] = []
    size = 0
    for ev in rounds:
        if len(out) > 1 and size + len(ev.emitted) <= cap:  # the first round alone: as it is first scored live
            out[-1].append(ev)
            size += len(ev.emitted)
        else:
            out.append([ev])
            size = len(ev.emitted)
    return out


def _replayed_lane(d: Drafter, tp: TargetPass, rounds: Sequence[RoundEvent], s: Sampling,
                   p_rows: torch.Tensor | None) -> list[float]:
    """A drafter replayed through the answer, as full-information scoring sees it: given the target's features
    of the kept positions, it predicts each chunk of rounds teacher-forced, then observes what the target
    kept in each round (the accepted draft's rows of the target pass). A model drafter's cache catches up by
    the new tokens only, so the whole answer is one incremental pass; a model-free drafter's table or index
    grows as it did live."""
    from metasd.drafting.drafters import Verified

    out: list[float] = []
    start = tp.n_prompt
    for chunk in _chunks(rounds, d):
        end = start + sum(len(ev.emitted) for ev in chunk)
        ids = tp.ids[:end]
        if d.feature_layers and tp.hidden is not None:
            tp.features(d, start - 1, end - 1)
        if not d.model_free:
            d.attach(tp.cache, ids)
        pred = d.predict(ids, start, end - start, s)
        rows = None if p_rows is None else p_rows[start - tp.n_prompt : end - tp.n_prompt]
        out.extend(_values(pred, tp.ids[start:end], rows))
        for ev in chunk:
            stop = start + len(ev.emitted)
            kept = tp.ids[start - 1 : stop - 1]  # the last id and the accepted draft: the rows the target computed
            d.observe(tp.ids[:stop], Verified(start, kept, tp.rows(start - 1, stop - 1), list(ev.emitted)))
            start = stop
    return out


@torch.inference_mode()
def fill(bundle: Bundle, prompt_ids: list[int], rounds: Sequence[RoundEvent], names: Sequence[str], s: Sampling,
         scaffold: frozenset[int] = frozenset(), cells: Cells | None = None) -> Lanes:
    """Every drafter's lane over the answer of `rounds`: the live cells where there are some, the rest
    computed now (a drafter whose lane is complete costs nothing)."""
    cells = live_cells(rounds, names) if cells is None else cells
    todo = [d for d in names if any(x is None for x in cells[d])]
    answer = [t for ev in rounds for t in ev.emitted]
    if todo and answer and prompt_ids:
        arms = bundle.make_drafters(list(todo))
        ids = list(prompt_ids) + answer
        want = max((a.seed_rows for a in arms), default=0)
        tp = TargetPass(bundle, ids, len(prompt_ids), want, any(a.feature_layers for a in arms))
        p_rows = None if s.greedy else warp(tp.rows(len(prompt_ids) - 1, len(ids) - 1), s)
        for name, d in zip(todo, arms, strict=True):
            _prepare(d, tp, scaffold)
            lane = _replayed_lane(d, tp, rounds, s, p_rows)
            cells[name] = [x if x is not None else lane[j] for j, x in enumerate(cells[name])]
    return {d: [_clip(x) for x in cells[d]] for d in names}


def _clip(x: float | None) -> float:
    if x is None or not math.isfinite(x):
        return 0.0
    return min(1.0, max(0.0, float(x)))


def lanes_for(bundle: Bundle, prompt: str | list[int], rounds: Sequence[RoundEvent], config: Mapping[str, Any],
              *, post: bool = True) -> tuple[Lanes, float]:
    """A finished (or stopped) run's lanes, from its events and its settings (`Summary.config`), and the
    seconds the after-the-answer part took. `post=False` keeps only the live cells (missing ones 0)."""
    t = time.perf_counter()
    names = list(config.get("drafters") or bundle.drafter_names)
    chat = bool(config.get("chat_template", True))
    s = Sampling(float(config.get("temperature", 0.0)), float(config.get("top_p", 1.0)), int(config.get("top_k", 0)))
    cells = live_cells(rounds, names, s.greedy)
    if not post or not missing(cells):
        return {d: [_clip(x) for x in cells[d]] for d in names}, 0.0
    ids = encode_prompt(bundle, prompt, chat)
    scaffold = scaffold_positions(bundle, prompt, ids, chat)
    lanes = fill(bundle, ids, rounds, names, s, scaffold, cells)
    return lanes, time.perf_counter() - t


# ---- reading lanes -----------------------------------------------------------------------------


def share(lane: Sequence[float]) -> float:
    """The share of the answer a drafter would have drafted: the mean of its lane."""
    return sum(lane) / len(lane) if lane else 0.0


def thirds(lane: Sequence[float]) -> tuple[float, float, float]:
    """Where in the answer: the lane's mean over its first, middle and last third."""
    n = len(lane)
    cut = [0, n // 3, 2 * n // 3, n]
    return tuple(share(lane[cut[i] : cut[i + 1]]) for i in range(3))  # type: ignore[return-value]


def agrees_with_rounds(lane: Sequence[float], rounds: Sequence[RoundEvent], drafter: str) -> list[str]:
    """Where `drafter`'s greedy lane disagrees with the rounds that pulled it: its accepted positions must
    be 1 and its first rejected position 0. Returns one line per disagreement (empty: consistent)."""
    bad, at = [], 0
    for ev in rounds:
        if ev.drafter == drafter and not ev.draft_extra:  # an extra candidate is not what it predicts
            for j in range(min(ev.accepted, len(ev.emitted))):
                if lane[at + j] != 1.0:
                    bad.append(f"round {ev.round}: accepted position {j + 1} has lane {lane[at + j]:g}")
            if ev.accepted < len(ev.draft) and lane[at + ev.accepted] != 0.0:
                bad.append(f"round {ev.round}: rejected position {ev.accepted + 1} has lane {lane[at + ev.accepted]:g}")
        at += len(ev.emitted)
    return bad
