"""The views one run draws, the same for a live run (Generate) and a recorded one (Replay): token view,
arm probabilities, regret, the numbers, the per-drafter table and the plain text, as one frame."""

from __future__ import annotations

import json
from collections import namedtuple
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import gradio as gr
from gradio.components.plot import PlotData

from metasd.core.events import RoundEvent, Summary
from metasd.decoding.lanes import live_cells
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
    drawn = f" The page drew {frames[0]} frames for {frames[1]} rounds." if frames else ""
    tree = viz.tree_budget_note(view.rounds)  # token-tree runs (metasd-tree): the budget of verified ids
    return viz.stats_html(view.stats(base["tokens_per_s"] if base else None),
                          (note or (base["note"] if base else SPEEDUP_HINT)) + drawn + (f" {tree}." if tree else ""))


SKIP: Any = gr.skip()  # an output left as it is


class Frame(NamedTuple):
    """One update of a run's views, the same for Generate and Replay: one field per output, by name (an event's
    output list is built from these names, `outputs`), gr.skip() where a view stays as it is. The order is the
    /generate API's (docs/DESIGN.md §5); Replay has no `record` output."""

    tokens: Any = SKIP  # the token view (HTML)
    arms: Any = SKIP  # arm probabilities (plotly)
    regret: Any = SKIP  # cumulative regret (plotly)
    stats: Any = SKIP  # the stat cards (HTML)
    table: Any = SKIP  # per drafter (pandas)
    text: Any = SKIP  # the plain-text answer
    record: Any = SKIP  # the finished run (session state: the downloads and the target-alone timing read it)
    lanes: Any = SKIP  # the drafter lanes (HTML)

    def for_replay(self) -> ReplayFrame:
        """The same views for Replay's outputs, which have no `record`."""
        return ReplayFrame(*(getattr(self, f) for f in REPLAY_FIELDS))


class Unchanged:
    """A stream's views sent again as they were, instead of gr.skip(), where a browser takes an equal value
    without redrawing: the numbers, the plain text, the lanes and the two figures.

    gradio turns every skipped output of every streamed frame into a new component and its config (pydantic's
    JSON schema of its API included): with three skipped outputs a frame cost the server's event loop 6 ms
    against 2 (a quarter of the server's Python while one answer streams). A value sent again diffs to nothing:
    no bytes go out. A figure's plotly JSON is a string, which the browser compares before it redraws (in
    Chromium, no mutation of the plot's DOM when it comes again); the table is an object it redraws on every
    frame (four times the mutations), so it stays skipped."""

    FIELDS = ("stats", "text", "lanes", "arms", "regret")

    def __init__(self) -> None:
        self.last: dict[str, Any] = {}

    def __call__(self, f: Frame) -> Frame:
        fill = {}
        for name in self.FIELDS:
            v = getattr(f, name)
            if not _skipped(v):
                self.last[name] = v
            elif name in self.last:  # any gr.skip(), not only this module's
                fill[name] = self.last[name]
        return f._replace(**fill) if fill else f


def _skipped(v: Any) -> bool:
    """Whether `v` is gr.skip() (an update of no property; each call makes a new one)."""
    return isinstance(v, dict) and v == SKIP


REPLAY_FIELDS = tuple(f for f in Frame._fields if f != "record")
ReplayFrame = namedtuple("ReplayFrame", REPLAY_FIELDS)  # Frame without `record`, still by name


def outputs(components: Mapping[str, Any], fields: Sequence[str] = Frame._fields) -> list[Any]:
    """An event's output components in the order of its frames' fields (a missing view fails at build time)."""
    return [components[f] for f in fields]


def frame(view: viz.LiveView, run: RunRecord, baselines: dict[str, Any] | None, status: str | None,
          note: str = "", **more: Any) -> Frame:
    """Every view of `run` at once: token view, the two figures, the numbers, the per-drafter table, the plain
    text; `more`: the other fields (record: the run handed to the session's state, lanes)."""
    return Frame(tokens=view.tokens_html(status), arms=plot(view.arm_json()), regret=plot(view.regret_json()),
                 stats=stats(view, run, baselines, note), table=view.table(), text=view.text(), **more)


UNREAD_WHY = "this page stopped reading its stream (a slow connection?); press Run to start again"
UNREAD = {"stopped_by": "unread"}  # put into a stopped run's summary config when nobody read its stream


STOP_WORDS = {"eos": "the answer's end (eos)", "max_new_tokens": "the token limit"}


def final_status(s: Summary) -> str:
    """The status line a run ends on (a replay ends on exactly the same one: why a run stopped is in its
    summary's config)."""
    if s.stop_reason == "stopped":
        unread = (s.config or {}).get("stopped_by") == UNREAD["stopped_by"]
        return f"stopped after {s.new_tokens} tokens ({s.target_calls} rounds): {UNREAD_WHY if unread else 'you pressed Stop'}"
    w = (s.config or {}).get("priors_weight", 0.0)
    start = f"; the bandit started from the preset's priors (worth {w:g} rounds a drafter)" if w else ""
    return (f"done: {s.new_tokens} tokens, {s.target_calls} target calls, {s.tokens_per_s:.1f} tokens/s "
            f"(engine clock: the page's drawing not counted), stopped by {STOP_WORDS.get(s.stop_reason, s.stop_reason)}"
            f"{start}")


# ---- drafter lanes (metasd/decoding/lanes.py) ------------------------------------------------------

def lanes_placeholder(text: str | None = None) -> str:
    """The lanes block before there are lanes: a one-line note, or (while an answer streams) nothing at all, so
    that the plots under the answer keep their place on a 1920x1080 screen until the lanes arrive."""
    return "" if text is None else viz.lanes_html([], {}, {}, empty=text)


def lanes_view(rounds: Sequence[RoundEvent], lanes: Mapping[str, Sequence[float]], colors: Mapping[str, str],
               empty: str = viz.LANES_EMPTY) -> str:
    """The lanes block under an answer (Generate's #lanes, Replay's #replay-lanes)."""
    return viz.lanes_html(rounds, lanes, colors, empty=empty)


def live_lanes(rounds: Sequence[RoundEvent], record: RunRecord, colors: Mapping[str, str]) -> Any:
    """While streaming with full-information feedback, the lanes as the engine scores them (a cell it has not
    scored yet shows empty until the end); otherwise nothing to update."""
    if not record.settings.get("full_info") or not rounds:
        return SKIP  # the constant, so that Unchanged sends the lanes' last text again (no component rebuilt)
    names = record.drafters or list(rounds[0].probabilities)
    cells = live_cells(rounds, names)
    return viz.lanes_html(rounds, {d: [x or 0.0 for x in lane] for d, lane in cells.items()}, colors)
