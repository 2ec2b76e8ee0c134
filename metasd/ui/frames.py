"""The views one run draws, the same for a live run (Generate) and a recorded one (Replay): token view,
arm probabilities, regret, the numbers, the per-drafter table and the plain text, as one frame."""

from __future__ import annotations

import json
from typing import Any

from gradio.components.plot import PlotData

from metasd.core.events import Summary
from metasd.ui import viz
from metasd.ui.session import RunRecord

STREAM_PLACEHOLDER = "prefill: reading the prompt ..."  # shared by live runs and replays: same final HTML
SPEEDUP_HINT = ("Speed-up needs the target alone on this prompt: press \u201cMeasure target alone\u201d "
                "or tick auto-measure.")


def plot(figure_json: str) -> PlotData:
    return PlotData(type="plotly", plot=figure_json)


def baseline_key(preset: str, prompt: str, n: int) -> str:
    """Where a session keeps the target-alone measurement of one prompt and token count."""
    return json.dumps([preset, prompt, n])


def stats(view: viz.LiveView, record: RunRecord, baselines: dict[str, Any] | None, note: str = "") -> str:
    """The stat cards: the engine's numbers, the speed-up against the target alone where measured, and
    how many frames the page drew for how many rounds."""
    base = (baselines or {}).get(baseline_key(record.preset, record.prompt, view.new_tokens)) if view.rounds else None
    frames = record.frames
    drawn = f" The page drew {frames[0]} frames for {frames[1]} rounds (several rounds per frame when the engine is fast)." \
        if frames else ""
    tree = viz.tree_budget_note(view.rounds)  # token-tree runs (metasd-tree): the budget of verified ids
    return viz.stats_html(view.stats(base["tokens_per_s"] if base else None),
                          (note or (base["note"] if base else SPEEDUP_HINT)) + drawn + (f" {tree}." if tree else ""))


def frame(view: viz.LiveView, record: RunRecord, baselines: dict[str, Any] | None, status: str | None,
          note: str = "") -> tuple:
    """Every view at once: token view, the two figures, the numbers, the per-drafter table, the plain text."""
    return (view.tokens_html(status), plot(view.arm_json()), plot(view.regret_json()),
            stats(view, record, baselines, note), view.table(), view.text())


def final_status(s: Summary) -> str:
    """The status line a run ends on (a replay ends on exactly the same one)."""
    if s.stop_reason == "stopped":
        return f"stopped after {s.new_tokens} tokens ({s.target_calls} rounds): you pressed Stop"
    w = (s.config or {}).get("priors_weight", 0.0)
    start = f"; the bandit started from the preset's priors ({w:g} pseudo-rounds per arm)" if w else ""
    return (f"done: {s.new_tokens} tokens, {s.target_calls} target calls, {s.tokens_per_s:.1f} tokens/s "
            f"(engine clock), stopped by {s.stop_reason}{start}")
