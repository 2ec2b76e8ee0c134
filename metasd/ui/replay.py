"""Replay tab handlers: a saved run (the CLI's --json, the page's JSON download, or the gallery in
assets/runs/) streamed like a live one (/replay), stepped through round by round, or opened by a link."""

from __future__ import annotations

import threading
import time
from typing import Any

import gradio as gr

from metasd.core.runfile import MAX_BYTES as RUN_MAX_BYTES
from metasd.core.runfile import Replay, parse_run
from metasd.core.validation import InvalidInput, number
from metasd.ui import viz
from metasd.ui.config import ASSETS, EXAMPLES, FRAME_FPS, task_title
from metasd.ui.errors import refused
from metasd.ui.files import read_upload
from metasd.ui.frames import STREAM_PLACEHOLDER, final_status, frame, lanes_view
from metasd.ui.session import STOPS, RunRecord, replay_key

RUNS_DIR = ASSETS / "runs"


def gallery() -> list[tuple[str, str]]:
    """(label, name) of every recorded run in assets/runs/, the examples' task first."""
    titles = {e["question_id"]: f"{task_title(e['category'])} \u00b7 {e['question_id']}" for e in EXAMPLES}
    return [(titles.get(p.stem, p.stem), p.stem) for p in sorted(RUNS_DIR.glob("*.json"))]


def _replay_source(run_file: Any, name: Any) -> tuple[Replay, str]:
    """The run to replay: an uploaded run file, else a gallery entry by name (only names the gallery lists)."""
    if run_file:
        data, file_name = read_upload(run_file, RUN_MAX_BYTES, "run file", "upload a run file (JSON)")
        return parse_run(data), file_name
    names = [n for _, n in gallery()]
    if not name:
        raise InvalidInput("choose a recorded run or upload a run file")
    if name not in names:
        raise InvalidInput(f"no recorded run named {name!r}")
    return parse_run((RUNS_DIR / f"{name}.json").read_bytes()), str(name)


def _replay_setup(run: Replay) -> tuple[viz.LiveView, RunRecord]:
    names = list(dict.fromkeys([*run.drafters, *(ev.drafter for ev in run.rounds)]))
    view = viz.LiveView(run.colors or viz.drafter_colors(names), run.drafters, placeholder=STREAM_PLACEHOLDER)
    return view, RunRecord(preset=run.preset, prompt=run.prompt)


def _replay_note(run: Replay, label: str) -> str:
    return (f"Replay of {label}: recorded on the {run.preset or 'unknown'} preset; the numbers are the recording's "
            f"(engine clock), not this machine's.")


NO_LANES = "This run file has no drafter lanes (recorded before run-file version 2)."


def _lanes(run: Replay, view: viz.LiveView) -> str:
    """The recorded lanes, up to the tokens the replay has shown."""
    return lanes_view(view.rounds, run.lanes, view.colors, empty=NO_LANES if not run.lanes else viz.LANES_EMPTY)


def _round_s(ev: Any) -> float:
    """How long a recorded round took on the engine's clock."""
    return (ev.draft_ms + ev.verify_ms + ev.overhead_ms) / 1000.0


def replay_view(run_file: Any = None, name: str = "", speed: float = 2.0, request: gr.Request = None):
    """Stream a saved run as /generate streams a live one, paced by its recorded round times / speed."""
    try:
        speed = float(number("speed", speed, False, (0.25, 64.0)))
        run, label = _replay_source(run_file, name)
    except InvalidInput as e:
        raise refused(e) from None
    stop = threading.Event()
    key = replay_key(request)
    STOPS.start(key, stop)
    view, record = _replay_setup(run)
    note = _replay_note(run, label)
    try:
        yield (*frame(view, record, None, None, note), _lanes(run, view))
        t0, clock, shown, laned = time.perf_counter(), 0.0, -1.0, time.perf_counter()
        for ev in run.rounds:
            if stop.is_set():
                break
            clock += _round_s(ev)
            wait = t0 + clock / speed - time.perf_counter()
            if wait > 0:
                stop.wait(wait)
            view.add(ev, clock)
            if time.perf_counter() - shown >= 1.0 / FRAME_FPS:
                shown = time.perf_counter()
                lanes = gr.skip()
                if shown - laned >= 1.0:  # the lanes (a larger block) once a second
                    lanes, laned = _lanes(run, view), shown
                yield (view.tokens_html(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), view.text(), lanes)
        if len(view.rounds) == len(run.rounds) and run.summary is not None:
            view.add(run.summary, run.summary.wall_s)
            status = final_status(run.summary)  # exactly the status line the live run ended on
        else:
            status = f"replay stopped at round {len(view.rounds)} of {len(run.rounds)}"
        yield (*frame(view, record, None, status, note), _lanes(run, view))
    finally:
        STOPS.end(key, stop)


def replay_at(run_file: Any, name: str, k: Any):
    """The replay's state after round k (the round slider): every view as it was then."""
    try:
        run, label = _replay_source(run_file, name)
        k = int(number("round", k, True, (0, len(run.rounds))))
    except InvalidInput as e:
        raise refused(e) from None
    view, record = _replay_setup(run)
    for ev in run.rounds[:k]:
        view.add(ev, view.engine_s + _round_s(ev))
    status = None
    if k == len(run.rounds) and run.summary is not None:
        view.add(run.summary, run.summary.wall_s)
        status = final_status(run.summary)
    return (*frame(view, record, None, status if status else f"round {k} of {len(run.rounds)}", _replay_note(run, label)),
            _lanes(run, view))


def replay_rounds(run_file: Any, name: str):
    """The round slider's range for the chosen run."""
    try:
        run, _ = _replay_source(run_file, name)
    except InvalidInput:
        return gr.update(maximum=1, value=0)
    return gr.update(maximum=len(run.rounds), value=len(run.rounds))


def stop_replay(request: gr.Request = None) -> None:
    STOPS.signal(replay_key(request))


def open_link(request: gr.Request):
    """`?run=<name>` opens the Replay tab on that recorded run (only names the gallery lists)."""
    name = (getattr(request, "query_params", None) or {}).get("run") if request else None
    if name and name in {n for _, n in gallery()}:
        return gr.Tabs(selected="replay"), gr.update(value=name)
    return gr.skip(), gr.skip()


def open_grid_run(runs: list[str], evt: gr.SelectData):
    """A click on Compare's lanes grid: the Replay tab on that prompt's run (saved by the prompt set), at its
    last round, lanes and all."""
    row = evt.index[0] if isinstance(evt.index, list | tuple) else evt.index
    if not isinstance(row, int) or not 0 <= row < len(runs or []):
        return (gr.skip(),) * 10
    path = runs[row]
    try:
        n = len(_replay_source(path, "")[0].rounds)
    except InvalidInput as e:
        raise refused(e) from None
    return (gr.Tabs(selected="replay"), gr.update(value=path), gr.update(maximum=n, value=n),
            *replay_at(path, "", n))
