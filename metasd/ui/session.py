"""Per-session state: which runs a session has going (so Stop, Cancel and a closed tab can end them),
and the record of one run that the Generate tab keeps in its gr.State."""

from __future__ import annotations

import threading
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

    def signal(self, key: str) -> None:
        """Set the stop signal of every run registered under `key`."""
        with self.lock:
            runs = list(self.runs.get(key, ()))
        for ev in runs:
            ev.set()


STOPS = StopRegistry()


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
