"""Per-session state: which runs a session has going (so Stop, Cancel and a closed tab can end them), whether
a session still reads its stream, and the record of one run that the Generate tab keeps in its gr.State."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from metasd.core.events import RoundEvent, Summary


class Cancelled(Exception):
    """The Compare run was cancelled (its Cancel button, or the tab closed)."""


class StopRegistry:
    """Run key -> the stop signals of its running runs (a session may run several through the API).

    A key is a session (Generate), or a session's Compare or Replay: each tab's Stop ends only its own.
    """

    def __init__(self) -> None:
        self.runs: dict[str, set[threading.Event]] = {}
        self.lock = threading.Lock()

    def start(self, key: str, stop: threading.Event) -> None:
        with self.lock:
            self.runs.setdefault(key, set()).add(stop)

    def end(self, key: str, stop: threading.Event) -> None:
        """The run is over: its signal is set (a worker still going stops) and the key goes when empty."""
        stop.set()
        with self.lock:
            runs = self.runs.get(key)
            if runs is not None:
                runs.discard(stop)
                if not runs:
                    del self.runs[key]

    def replace(self, key: str, stop: threading.Event) -> None:
        """Start `stop`'s run as the key's only one: the key's earlier runs are stopped (a new Run replaces
        the session's previous one, waiting or running)."""
        self.signal(key)
        self.start(key, stop)

    def signal(self, key: str) -> None:
        """Set the stop signal of every run registered under `key`."""
        with self.lock:
            runs = list(self.runs.get(key, ()))
        for ev in runs:
            ev.set()



def session_key(request: gr.Request | None) -> str:
    """The session's key; API calls without a session share one."""
    return getattr(request, "session_hash", None) or "api"


def compare_key(request: gr.Request | None) -> str:
    return f"{session_key(request)}#compare"


def replay_key(request: gr.Request | None) -> str:
    return f"{session_key(request)}#replay"


@dataclass
class RunRecord:
    """One run as the page keeps it: what was asked, and once it ended, its rounds and summary.

    Generate hands it (through gr.State) to the log downloads and the baseline measurement; a replay
    fills in only preset and prompt. Plain data, so gr.State can deep-copy it.
    """

    preset: str
    prompt: str
    settings: dict[str, Any] = field(default_factory=dict)
    all_drafters: list[str] = field(default_factory=list)  # the preset's, for the colours
    drafters: list[str] = field(default_factory=list)  # the ones this run used
    rounds: list[RoundEvent] = field(default_factory=list)
    summary: Summary | None = None
    frames: tuple[int, int] | None = None  # (frames drawn, rounds run) while streaming
    lanes: dict[str, list[float]] = field(default_factory=dict)  # the drafter lanes, once the run ended


class Streams:
    """How many of a session's stream messages wait unread in gradio's queue: app.launch points `unread` at the
    served page's queue (gradio_unread); None (handlers called directly, as tests do) means nobody can tell."""

    def __init__(self) -> None:
        self.unread: Callable[[str], int | None] = lambda key: None


# A waiting run's page hears from the line every second and a running one's up to 8 times a second: messages
# left unread this long mean nobody reads the stream.
READ_PATIENCE_S = 4.0


# gradio's queue looks for work to start every 1 ms while it has none (and for progress to send every 10 ms): on an
# idle 2-core server that polling alone took 9-10% of a core, and during a run it comes out of the rounds'
# processes, which run niced below the server. Every 10 ms (a run starts at most 10 ms later) the idle server takes 2.3%.
QUEUE_POLL_S = 0.01
PROGRESS_POLL_S = 0.05


def quiet_queue(demo: gr.Blocks) -> None:
    """Make `demo`'s queue (after demo.queue()) poll for work and progress less often (QUEUE_POLL_S)."""
    q = getattr(demo, "_queue", None)
    if q is not None and hasattr(q, "sleep_when_free"):
        q.sleep_when_free = max(q.sleep_when_free, QUEUE_POLL_S)
        q.progress_update_sleep_when_free = max(getattr(q, "progress_update_sleep_when_free", 0.0), PROGRESS_POLL_S)


def gradio_unread(demo: gr.Blocks) -> Callable[[str], int | None]:
    """The unread messages of a session's stream in `demo`'s queue (gradio keeps one message queue per
    session; its /queue/data stream empties it as the client reads)."""
    def unread(key: str) -> int | None:
        q = getattr(demo, "_queue", None)
        messages = q.pending_messages_per_session.get(key) if q is not None else None
        return messages.qsize() if messages is not None else None
    return unread


class SessionReader:
    """Whether a session still reads its stream: False once its backlog of unread messages has gone
    `patience_s` without shrinking (a client that joined the queue and never opened its stream, or stopped
    reading it). A backlog of one, or one that goes up and down, is a reader behind a busy server: with a class
    on two cores the server sent streams' messages late, and a rule of "anything unread for 4 s" stopped a
    student's run that was being read."""

    def __init__(self, key: str, streams: Streams, patience_s: float | None = None) -> None:
        self.key, self.streams = key, streams
        self.patience_s = READ_PATIENCE_S if patience_s is None else patience_s
        self.read_at = time.perf_counter()
        self.backlog = 0

    def __call__(self) -> bool:
        n = self.streams.unread(self.key)
        now = time.perf_counter()
        if n is None or n <= 1 or n < self.backlog:  # nothing (or one) unread, nobody can tell, or some was read
            self.read_at = now
        self.backlog = n or 0
        return now - self.read_at < self.patience_s
