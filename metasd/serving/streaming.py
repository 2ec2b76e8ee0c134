"""Run the engine at full speed in a worker thread and hand its events to a viewer in frames.

A page that re-renders after every round makes the engine wait for the renderer: on the offline
preset that cost ~40% of the engine's speed. Here the engine never waits. Its worker thread
pushes every event into a queue together with the engine's own clock; the viewer takes them in
batches, at most `max_fps` batches a second (fewer when rendering a frame is slow), so a fast
engine (a GPU, a few ms a round) yields many rounds per frame and a slow one a frame per round.
The last batch always carries the summary (or the worker's exception, re-raised in the viewer).

It is the page's one driver of an event stream: Generate draws its batches, Compare drains them
(`collect`), Replay feeds it a recorded run at its recorded pace; the target alone, timed through
transformers, runs under the same `ThreadPlan` in a thread of its own.

    stream = EngineStream(generate(bundle, prompt, stop=stop), stop)
    try:
        for batch, done in stream.batches():
            ...  # render the state after batch; done: the summary is in it
    finally:
        stream.close()  # Stop, a closed tab, or a failure: the worker ends within one round
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from metasd.core.events import Event, Summary

DEFAULT_MAX_FPS = 8.0
T = TypeVar("T")


@dataclass(frozen=True)
class Timed:
    """An engine event and when the engine produced it, in seconds since the worker started."""

    event: Event
    t: float


class _Done:
    pass


_DONE = _Done()


@dataclass(frozen=True)
class ThreadPlan:
    """torch's threads for one piece of model work, set in the thread that runs it (OpenMP keeps the setting
    per thread): `prefill` for the prompt's pass (one large batch), `rounds` after the first pass. None
    leaves torch's setting as it is."""

    prefill: int | None = None
    rounds: int | None = None

    def begin(self) -> None:
        if self.prefill:
            torch.set_num_threads(self.prefill)

    def first_pass_done(self) -> None:
        if self.rounds and self.rounds != self.prefill:
            torch.set_num_threads(self.rounds)


class FrameBudget:
    """The frames a second one server draws for all of its streams together, shared out evenly.

    A frame costs the server's event loop a few ms whatever it carries (gradio post-processes and diffs every
    output of the event). 64 streams at 8 frames a second each kept the event loop of a 2-core server busy
    with frames alone, and starved the engine it shares the interpreter with. Under the budget each of N open
    streams draws at most `fps`/N frames a second; the engine's work per stream is unchanged, it arrives in
    fewer, larger frames."""

    def __init__(self, fps: float):
        if fps <= 0:
            raise ValueError("fps must be positive")
        self.fps = fps
        self._open = 0
        self._lock = threading.Lock()

    @contextmanager
    def holding(self) -> Iterator[None]:
        """One open stream while the block runs."""
        with self._lock:
            self._open += 1
        try:
            yield
        finally:
            with self._lock:
                self._open -= 1

    @property
    def open(self) -> int:
        return self._open

    def interval(self) -> float:
        """The least time between two frames of one stream now."""
        return max(1, self._open) / self.fps


class EngineStream:
    """One request's engine generator, driven by its own worker thread (nothing shared with others)."""

    def __init__(self, events: Iterator[Event], stop: threading.Event, max_fps: float = DEFAULT_MAX_FPS,
                 torch_threads: int | None = None, prefill_threads: int | None = None,
                 budget: FrameBudget | None = None):
        if max_fps <= 0:
            raise ValueError("max_fps must be positive")
        self._plan = ThreadPlan(prefill_threads or torch_threads, torch_threads)
        self._events = events
        self._stop = stop
        self._queue: queue.SimpleQueue[Timed | BaseException | _Done] = queue.SimpleQueue()
        self.min_interval = 1.0 / max_fps
        self.interval = self.min_interval  # grows when rendering is slow (see frame_cost)
        self.budget = budget  # the server's frames, shared by its open streams (None: this stream's own pace)
        self.frames = 0
        self.rounds = 0
        self._thread = threading.Thread(target=self._pump, name="metasd-engine", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        t0 = time.perf_counter()
        try:
            for ev in with_threads(self._events, self._plan.prefill, self._plan.rounds):
                self._queue.put(Timed(ev, time.perf_counter() - t0))
        except BaseException as e:  # noqa: BLE001  (handed to the viewer, re-raised there)
            self._queue.put(e)
        finally:
            # A generator is closed by the thread that runs it: this frees the request's KV caches.
            try:
                self._events.close()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001
                pass
            self._queue.put(_DONE)

    def frame_cost(self, seconds: float) -> None:
        """Tell the stream how long the last frame took to render: frames never take more than about a
        third of the time between them, so rendering cannot hold back a machine with few cores."""
        self.interval = max(self.min_interval, 3.0 * seconds)

    def batches(self) -> Iterator[tuple[list[Timed], bool]]:
        """Everything the engine produced since the last frame. The first round is handed over as soon as
        it exists (the first visible token), then at most one batch per `interval`; the final batch
        (done=True) holds the summary. Re-raises the engine's exception, if any, after its last rounds."""
        with self.budget.holding() if self.budget is not None else nullcontext():
            yield from self._batches()

    def _gap(self) -> float:
        """The time between frames now: this stream's own pace, or the server's share, whichever is longer."""
        return self.interval if self.budget is None else max(self.interval, self.budget.interval())

    def _batches(self) -> Iterator[tuple[list[Timed], bool]]:
        pending: list[Timed] = []
        last = -math.inf
        while True:
            item: Timed | BaseException | _Done | None
            if not pending:  # nothing to show: sleep until the engine has something
                item = self._queue.get()
            else:  # something to show: take more until the next frame is due
                wait = last + self._gap() - time.perf_counter()
                try:
                    item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    item = None
            if isinstance(item, _Done):
                self.frames += 1
                yield pending, True
                return
            if isinstance(item, BaseException):
                if pending:  # the rounds before the failure are shown first
                    self.frames += 1
                    yield pending, False
                raise item
            if item is not None:
                pending.append(item)
                if not isinstance(item.event, Summary):
                    self.rounds += 1
            if pending and time.perf_counter() - last >= self._gap() and not self._summary_pending(pending):
                self.frames += 1
                yield pending, False
                pending = []
                last = time.perf_counter()

    def collect(self) -> tuple[list[Event], Summary]:
        """Every event to the end, for a caller that draws nothing on the way (Compare): the rounds and the
        summary. The worker is closed however it ends."""
        try:
            events = [item.event for batch, _ in self.batches() for item in batch]
        finally:
            self.close()
        if not events or not isinstance(events[-1], Summary):
            raise RuntimeError("generation ended without a summary")
        return events[:-1], events[-1]

    @staticmethod
    def _summary_pending(pending: list[Timed]) -> bool:
        # The summary is the engine's last event: wait for the worker's end so that the final batch is one frame.
        return isinstance(pending[-1].event, Summary)

    def close(self, timeout: float = 10.0) -> None:
        """End the worker (it stops at the next round boundary) and wait, at most `timeout` s, for it to free its
        caches. On a thread running an asyncio event loop (a server cancelling a stream) it only signals: a wait
        there would stall every client; the caller hands the wait to a thread (metasd.ui.generate)."""
        self._stop.set()
        if threading.current_thread() is not self._thread and not on_event_loop():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def on_event_loop() -> bool:
    """Whether this thread is running an asyncio event loop (where nothing may block)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def with_threads(events: Iterator[Event], prefill: int | None, rounds: int | None) -> Iterator[Event]:
    """The engine's events under ThreadPlan(prefill, rounds), in the thread that consumes them: the first
    event comes after the prompt's pass and the first round."""
    plan = ThreadPlan(prefill, rounds)
    plan.begin()
    first = True
    for ev in events:
        yield ev
        if first:
            plan.first_pass_done()
        first = False


def in_fresh_thread(fn: Callable[[], T], threads: int | None = None, name: str = "metasd-model") -> T:
    """`fn()` run in a new thread (with `threads` torch threads, where given); its result, or its exception.

    On a CPU the server runs model work only in threads that end with it. OpenMP keeps a team of threads
    for every thread that ran a parallel region, and once more team threads exist than cores it stops
    spin-waiting between regions, so every one of the hundreds of regions in a forward pass waits to be
    woken. Measured on the offline preset (scripts/measure_threads.py): a generation with two torch
    threads in a worker ran at 26-28 tokens/s while the main thread's team from loading the model was
    alive, and at 32-36 without it.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        if threads:
            torch.set_num_threads(threads)
        try:
            box["out"] = fn()
        except BaseException as e:  # noqa: BLE001  (re-raised in the caller)
            box["err"] = e

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    t.join()
    if "err" in box:
        raise box["err"]
    return box["out"]


@dataclass(eq=False)
class Ticket:
    """One place in FairSlots' line: whose run (`key`), the run's stop signal, when it joined."""

    key: str = ""
    stop: threading.Event | None = None
    joined: float = field(default_factory=time.perf_counter)
    admitted_at: float | None = None
    left: str = ""  # why it left the line without a slot: "stopped" or "abandoned"


@dataclass(frozen=True)
class Place:
    """Where a waiting ticket stands: 1 = next; `eta_s`: the expected wait, from recent runs' lengths."""

    place: int
    running: int
    eta_s: float


class FairSlots:
    """At most `n` holders at once, served strictly first come, first served, with at most `max_waiting`
    in line (None: no bound).

    The model is one shared resource: a Generate request and a long Compare run take turns on it,
    the Compare run one step at a time, so a Generate request waits for at most one step and never
    for the whole prompt set. (A plain semaphore would let the Compare run re-take the slot it just
    released before the waiting request wakes up.) A page's run joins with a ticket (`join`), sees its
    place while it waits (`wait`), and leaves the line at once when its Stop is set or its reader is
    gone; a full line refuses at once, with `retry_after_s` to say when to come back.
    """

    def __init__(self, n: int = 1, max_waiting: int | None = None, service_s: float = 10.0):
        if n < 1:
            raise ValueError("n must be at least 1")
        self._n = n
        self.max_waiting = max_waiting
        self._busy = 0
        self._queue: deque[Ticket] = deque()
        self._cv = threading.Condition()
        self.service_s = service_s  # a page run's mean time on the model (moving average)

    @property
    def slots(self) -> int:
        return self._n

    def resize(self, n: int) -> None:
        """Hold at most `n` at once from now on (shared rounds measured at start-up: metasd.serving.batch)."""
        if n < 1:
            raise ValueError("n must be at least 1")
        with self._cv:
            self._n = n
            self._cv.notify_all()

    def acquire(self) -> None:
        me = Ticket()
        with self._cv:
            self._queue.append(me)
            while not self._admissible(me):
                self._cv.wait()
            self._admit(me)

    def _admissible(self, t: Ticket) -> bool:
        # In order: a ticket takes a slot when there is one for it and for everyone ahead of it. (Only the first
        # one would tell runs that join together their place for a moment, though a slot waits for each.)
        free = self._n - self._busy
        return free > 0 and t in self._queue and self._queue.index(t) < free

    def _admit(self, t: Ticket) -> None:
        self._queue.remove(t)
        self._busy += 1
        t.admitted_at = time.perf_counter()
        self._cv.notify_all()  # the next in line may take another free slot

    def try_acquire(self) -> bool:
        with self._cv:
            if self._queue or self._busy >= self._n:
                return False
            self._busy += 1
            return True

    def release(self, ticket: Ticket | None = None) -> None:
        with self._cv:
            if self._busy <= 0:
                raise RuntimeError("release without acquire")
            self._busy -= 1
            if ticket is not None and ticket.admitted_at is not None:  # a page run: learn how long runs hold it
                held = time.perf_counter() - ticket.admitted_at
                self.service_s = 0.7 * self.service_s + 0.3 * held
            self._cv.notify_all()

    @contextmanager
    def hold(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def join(self, key: str = "", stop: threading.Event | None = None) -> Ticket | None:
        """A place at the end of the line, or None when `max_waiting` runs already wait (the line is full)."""
        with self._cv:
            if self.max_waiting is not None and len(self._queue) >= self.max_waiting:
                return None
            t = Ticket(key, stop)
            self._queue.append(t)
            return t

    def wait(self, ticket: Ticket, poll: float = 0.25, reading: Callable[[], bool] = lambda: True) -> Iterator[Place]:
        """Wait for a slot, yielding the ticket's Place at least every `poll` seconds. Ends when the ticket
        holds a slot (ticket.admitted_at set; give it back with release(ticket)), or when it left the line:
        its stop was set (ticket.left = "stopped") or `reading()` said nobody reads its stream ("abandoned")."""
        while True:
            with self._cv:
                if self._admissible(ticket):
                    self._admit(ticket)
                    return
                gone = "stopped" if ticket.stop is not None and ticket.stop.is_set() else ""
                gone = gone or ("" if reading() else "abandoned")
                if gone:
                    self._remove(ticket, gone)
                    return
                place = self._place(ticket)
            yield place
            with self._cv:
                if not self._admissible(ticket):
                    self._cv.wait(poll)

    def _remove(self, ticket: Ticket, why: str) -> None:
        self._queue.remove(ticket)
        ticket.left = why
        self._cv.notify_all()  # the one behind may now be first

    def _place(self, ticket: Ticket) -> Place:
        place = self._queue.index(ticket) + 1
        # The runs ahead, plus half a run (on average) until a running one gives its slot back.
        ahead = (place - 1) + (0.5 * self._n if self._busy >= self._n else 0.0)
        return Place(place, self._busy, ahead * self.service_s / self._n)

    def retry_after_s(self) -> float:
        """When a refused run may come back: the time for a tenth of the line to drain (at least 10 s)."""
        with self._cv:
            return max(10.0, (len(self._queue) / 10) * self.service_s / self._n)

    def cancel(self, ticket: Ticket) -> None:
        """Take a waiting ticket out of the line (a no-op once it holds a slot or has left)."""
        with self._cv:
            if ticket in self._queue:
                self._remove(ticket, "stopped")

    @property
    def waiting(self) -> int:
        with self._cv:
            return len(self._queue)

    @property
    def running(self) -> int:
        with self._cv:
            return self._busy
