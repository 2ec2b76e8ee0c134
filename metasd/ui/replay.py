"""Replay tab handlers: a saved run (the CLI's --json, the page's JSON download, or the gallery in
assets/runs/) streamed like a live one (/replay), stepped through round by round, or opened by a link."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import gradio as gr

from metasd.core.events import RoundEvent
from metasd.core.runfile import Replay
from metasd.core.validation import REPLAY_MAX_S, RUN_MAX_BYTES, InvalidInput, number
from metasd.models.colors import canonical_names
from metasd.serving.streaming import EngineStream
from metasd.ui import viz
from metasd.ui.config import ASSETS, EXAMPLES, FRAME_FPS, task_title
from metasd.ui.errors import failure, refused
from metasd.ui.files import read_upload
from metasd.ui.frames import REPLAY_FIELDS, SKIP, STREAM_PLACEHOLDER, Frame, ReplayFrame, final_status, frame, lanes_view
from metasd.ui.server import Server
from metasd.ui.session import RunRecord, replay_key

RUNS_DIR = ASSETS / "runs"


def gallery() -> list[tuple[str, str]]:
    """(label, name) of every recorded run in assets/runs/, the examples' task first."""
    titles = {e["question_id"]: f"{task_title(e['category'])} \u00b7 {e['question_id']}" for e in EXAMPLES}
    return [(titles.get(p.stem, p.stem), p.stem) for p in sorted(RUNS_DIR.glob("*.json"))]


def _replay_source(server: Server, run_file: Any, name: Any) -> tuple[Replay, str]:
    """The run to replay: an uploaded run file, else a gallery entry by name (only names the gallery lists).
    An upload is known by its content (gradio may hand the same file over under another path)."""
    if run_file:
        data, file_name = read_upload(run_file, RUN_MAX_BYTES, "run file", "upload a run file (JSON)")
        return server.runs.get(("upload", hashlib.sha256(data).hexdigest()), lambda: data), file_name
    if not name:
        raise InvalidInput("choose a recorded run or upload a run file")
    if not isinstance(name, str) or name not in {n for _, n in gallery()}:
        raise InvalidInput(f"no recorded run named {str(name)[:64]!r}")
    return server.runs.get(("gallery", name), lambda: (RUNS_DIR / f"{name}.json").read_bytes()), name


def _replay_setup(run: Replay) -> tuple[viz.LiveView, RunRecord]:
    names = list(dict.fromkeys([*run.drafters, *(ev.drafter for ev in run.rounds)]))
    # A drafter's colour comes from its name, as in Generate and Compare; the file's own colours are
    # kept only for names no preset knows (a plugin's), where they differ from each other.
    colors = viz.drafter_colors(names)
    theirs = {n: c for n, c in (run.colors or {}).items() if n in colors and n not in canonical_names()}
    if theirs and len(set(theirs.values()) | {c for n, c in colors.items() if n not in theirs}) == len(colors):
        colors |= theirs
    view = viz.LiveView(colors, run.drafters, placeholder=STREAM_PLACEHOLDER)
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


def _pace(run: Replay, speed: float) -> float:
    """The speed actually used: the asked one, or faster so that the replay lasts at most REPLAY_MAX_S."""
    recorded = sum(_round_s(ev) for ev in run.rounds)
    return max(speed, recorded / REPLAY_MAX_S)


def replay_view(server: Server, run_file: Any = None, name: str = "", speed: float = 2.0, request: gr.Request = None):
    """Stream a saved run as /generate streams a live one, paced by its recorded round times / speed; at most
    REPLAY_MAX_S of wall time, and one replay per session at a time (a new one ends the session's previous one)."""
    try:
        speed = float(number("speed", speed, False, (0.25, 64.0)))
        run, label = _replay_source(server, run_file, name)
    except InvalidInput as e:
        raise refused(e) from None
    except Exception as e:  # never the bare "Error": the log keeps the traceback
        raise failure(e) from None
    stop = threading.Event()
    key = replay_key(request)
    if getattr(request, "session_hash", None):  # this session's previous replay ends: one slot per visitor
        server.stops.signal(key)
    server.stops.start(key, stop)
    pace = _pace(run, speed)
    view, record = _replay_setup(run)
    note = _replay_note(run, label) + (f" Played at {pace:.2g}\u00d7 (a replay lasts at most {REPLAY_MAX_S:.0f} s)."
                                        if pace > speed else "")
    try:
        yield frame(view, record, None, None, note, lanes=_lanes(run, view)).for_replay()
        yield from _replay_frames(run, view, pace, stop)
        if len(view.rounds) == len(run.rounds) and run.summary is not None:
            view.add(run.summary, run.summary.wall_s)
            status = final_status(run.summary)  # exactly the status line the live run ended on
        else:
            status = f"replay stopped at round {len(view.rounds)} of {len(run.rounds)}"
        yield frame(view, record, None, status, note, lanes=_lanes(run, view)).for_replay()
    finally:
        server.stops.end(key, stop)


# A replay waits at most this long for any one round, whatever the file says it took: a run file whose one round
# claims 30 s (the most a recorded round may claim) kept a replay asleep on the server for that long.
REPLAY_ROUND_MAX_S = 2.0


def _paced(run: Replay, pace: float, stop: threading.Event) -> Iterator[RoundEvent]:
    """The recorded rounds at their recorded pace / `pace`, each round's wait at most REPLAY_ROUND_MAX_S (and the
    whole replay at most REPLAY_MAX_S, by `_pace`): the event stream a replay's driver draws, as the engine's is
    for a live run."""
    due = time.perf_counter()
    for ev in run.rounds:
        due += min(_round_s(ev) / pace, REPLAY_ROUND_MAX_S)
        wait = due - time.perf_counter()
        if (wait > 0 and stop.wait(wait)) or stop.is_set():
            return
        yield ev


def _replay_frames(run: Replay, view: viz.LiveView, pace: float, stop: threading.Event) -> Iterator[ReplayFrame]:
    """The paced rounds through the page's one stream driver (metasd.serving.streaming.EngineStream): frames at
    most FRAME_FPS a second, fewer when drawing is slow, as Generate's; the lanes once a second."""
    stream = EngineStream(_paced(run, pace, stop), stop, max_fps=FRAME_FPS)
    laned = time.perf_counter()
    try:
        for batch, _ in stream.batches():
            t_frame = time.perf_counter()
            for item in batch:
                view.add(item.event, view.engine_s + _round_s(item.event))
            lanes = SKIP
            if t_frame - laned >= 1.0:  # the lanes (a larger block) once a second
                lanes, laned = _lanes(run, view), t_frame
            yield Frame(tokens=view.tokens_html(), text=view.text(), lanes=lanes).for_replay()
            stream.frame_cost(time.perf_counter() - t_frame)
    finally:
        stream.close()


def replay_at(server: Server, run_file: Any, name: str, k: Any):
    """The replay's state after round k (the round slider): every view as it was then."""
    try:
        run, label = _replay_source(server, run_file, name)
        k = int(number("round", k, True, (0, len(run.rounds))))
    except InvalidInput as e:
        raise refused(e) from None
    except Exception as e:
        raise failure(e) from None
    view, record = _replay_setup(run)
    for ev in run.rounds[:k]:
        view.add(ev, view.engine_s + _round_s(ev))
    status = None
    if k == len(run.rounds) and run.summary is not None:
        view.add(run.summary, run.summary.wall_s)
        status = final_status(run.summary)
    return frame(view, record, None, status if status else f"round {k} of {len(run.rounds)}", _replay_note(run, label),
                 lanes=_lanes(run, view)).for_replay()


def replay_rounds(server: Server, run_file: Any, name: str):
    """The round slider's range for the chosen run. This event runs outside the queue, so it never parses a
    visitor's file: it reads the parse its replay (in the queue) has just made, by the file's content; an upload
    not replayed yet gets the default range."""
    try:
        if run_file:
            data, _ = read_upload(run_file, RUN_MAX_BYTES, "run file", "upload a run file (JSON)")
            run = server.runs.peek(("upload", hashlib.sha256(data).hexdigest()))
            if run is None:
                return gr.update(maximum=1, value=0)
        else:
            run, _ = _replay_source(server, None, name)  # a gallery run: the app's own small files
    except Exception:  # noqa: BLE001  (the replay itself said what was wrong)
        return gr.update(maximum=1, value=0)
    return gr.update(maximum=len(run.rounds), value=len(run.rounds))


def stop_replay(server: Server, request: gr.Request = None) -> None:
    server.stops.signal(replay_key(request))


def open_link(request: gr.Request):
    """`?run=<name>` opens the Replay tab on that recorded run (only names the gallery lists)."""
    name = (getattr(request, "query_params", None) or {}).get("run") if request else None
    if name and name in {n for _, n in gallery()}:
        return gr.Tabs(selected="replay"), gr.update(value=name)
    return gr.skip(), gr.skip()


def open_grid_run(server: Server, runs: list[str], evt: gr.SelectData):
    """A click on Compare's lanes grid: the Replay tab on that prompt's run (saved by the prompt set), at its
    last round, lanes and all."""
    row = evt.index[0] if isinstance(evt.index, list | tuple) else evt.index
    if not isinstance(row, int) or not 0 <= row < len(runs or []):
        return (SKIP,) * (3 + len(REPLAY_FIELDS))
    path = runs[row]
    try:
        n = len(_replay_source(server, path, "")[0].rounds)
    except InvalidInput as e:
        raise refused(e) from None
    return (gr.Tabs(selected="replay"), gr.update(value=path), gr.update(maximum=n, value=n),
            *replay_at(server, path, "", n))
