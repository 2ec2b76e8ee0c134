"""One served page's state, in one object: app.build_demo makes a Server and binds it into every handler
(Server.bind), so that nothing a request changes lives in a module. Two servers in one process (a test's, a
script's) share nothing but the models' files on disk.

    presets     the loaded presets (bundles.Presets)       model       the fair slots requests take turns through
    shared      the shared rounds, where they run          frames      the frames a second every stream shares
    stops       each session's running runs (Stop)         streams     whether a session still reads its stream
    timings     the target alone, timed once per prompt    runs        parsed run files (Replay)
    simulator   the playground's worker process            opening     the playground's opening simulation
    files       the private temp dir (downloads)
"""

from __future__ import annotations

import functools
import inspect
import multiprocessing
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from metasd.core.runfile import Replay, parse_run
from metasd.core.validation import InvalidInput
from metasd.serving.remote import SharedRounds
from metasd.serving.streaming import FairSlots, FrameBudget
from metasd.ui.bundles import Presets
from metasd.ui.config import GEN_CONCURRENCY, MAX_WAITING, SERVER_FPS, on_gpu
from metasd.ui.files import AppFiles
from metasd.ui.session import StopRegistry, Streams


class Simulator:
    """Simulations in one process of their own at the lowest CPU priority, one at a time.

    A simulation is pure Python and numpy: in the server's process it held the interpreter lock the engine's
    round loop and the event loop need, and four of them (even one at a time) slowed a 0.7 s Generate beside
    them to 4.5 s on 2 cores. In a process of its own, niced, it takes only what the model leaves over; a queued
    simulation waits its turn in the pool, a generation never waits for one. Spawned, not forked: the server has
    torch's thread pools, which a fork would copy half-alive. The process starts with the first simulation.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_lowest_priority)
            pool = self._pool
        try:
            return pool.submit(fn, *args, **kwargs).result()
        except BrokenProcessPool:  # the process died (killed, out of memory): the next simulation starts a new one
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            raise

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def _lowest_priority() -> None:
    os.nice(19)


class Once:
    """A value made once, on first use, by whoever asks first (the others wait for it); a failure is not kept."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: Any = None
        self._made = False

    def get(self, make: Callable[[], Any]) -> Any:
        with self._lock:
            if not self._made:
                self._value, self._made = make(), True
            return self._value


K = TypeVar("K")
V = TypeVar("V")


class Bounded(Generic[K, V]):
    """At most `size` entries, shared by the handlers' threads: beyond it the oldest put (or touched) goes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, touch: bool = False) -> V | None:
        """The entry, or None; `touch` makes it the newest."""
        with self._lock:
            if touch and key in self._items:
                self._items.move_to_end(key)
            return self._items.get(key)

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


class Timings(Bounded[str, dict[str, Any]]):
    """The target alone timed on a prompt, shared by every session (a class running the same example times it
    once)."""

    def __init__(self, size: int = 256) -> None:
        super().__init__(size)


class ParsedRuns:
    """Parsed run files by file identity: the round slider and the slider's range (an event outside the queue)
    parse a file once, not on every move. Parsing itself is one at a time: json.loads holds the interpreter lock
    for its whole call."""

    PARSE_WAIT_S = 10.0

    def __init__(self, size: int = 4) -> None:
        self._parsed: Bounded[tuple[Any, ...], Replay] = Bounded(size)
        self._parsing = threading.Lock()

    def peek(self, key: tuple[Any, ...]) -> Replay | None:
        """The run parsed under `key` already, or None (never parses)."""
        return self._parsed.get(key)

    def get(self, key: tuple[Any, ...], read: Callable[[], bytes]) -> Replay:
        run = self._parsed.get(key, touch=True)
        if run is not None:
            return run
        if not self._parsing.acquire(timeout=self.PARSE_WAIT_S):
            raise InvalidInput("the server is busy reading other run files; try again in a moment")
        try:
            run = self._parsed.get(key)  # parsed meanwhile by a request that held the parse lock before this one
            if run is None:
                run = parse_run(read())
                self._parsed.put(key, run)
        finally:
            self._parsing.release()
        return run


@dataclass(eq=False)
class Server:
    """Everything one served page shares between its sessions (the module docstring lists it)."""

    presets: Presets = field(default_factory=Presets)
    # Generate holds the model for a whole answer, Compare one run at a time, first come first served, so nobody
    # waits for a whole prompt set; at most MAX_WAITING page runs in line (start_rounds resizes the slots).
    model: FairSlots = field(default_factory=lambda: FairSlots(GEN_CONCURRENCY, max_waiting=MAX_WAITING))
    shared: SharedRounds = field(default_factory=SharedRounds)
    frames: FrameBudget = field(default_factory=lambda: FrameBudget(SERVER_FPS))
    stops: StopRegistry = field(default_factory=StopRegistry)
    streams: Streams = field(default_factory=Streams)
    timings: Timings = field(default_factory=Timings)
    runs: ParsedRuns = field(default_factory=ParsedRuns)
    simulator: Simulator = field(default_factory=Simulator)
    opening: Once = field(default_factory=Once)
    files: AppFiles = field(default_factory=AppFiles)

    def bind(self, fn: Callable[..., Any], to: Any = None) -> Callable[..., Any]:
        """`fn(server, ...)` (or `fn(to, ...)`, a part of the server) as a gradio handler with the server bound in.
        A function, not a partial: gradio reads a handler's type hints to inject gr.Request and gr.SelectData, and
        its code flags to stream a generator; it sees fn's name (a page-only handler's name is its endpoint's name
        in the page config) and fn's signature without its first parameter. On ZeroGPU the handler holds the GPU
        fn's @gpu mark asks for (ZeroGPU pickles a call's arguments, never its function: the server stays here)."""
        state = self if to is None else to
        if inspect.isgeneratorfunction(fn):
            def handler(*args: Any, **kwargs: Any) -> Any:
                return (yield from fn(state, *args, **kwargs))
        else:
            def handler(*args: Any, **kwargs: Any) -> Any:
                return fn(state, *args, **kwargs)
        functools.update_wrapper(handler, fn)  # name, doc, type hints (resolved in fn's module, through __wrapped__)
        sig = inspect.signature(fn)
        handler.__signature__ = sig.replace(parameters=list(sig.parameters.values())[1:])  # type: ignore[attr-defined]
        return on_gpu(handler, getattr(fn, "gpu_sizing", None))

    def close(self) -> None:
        """The shared rounds' processes and the simulator's end (a test's or a script's server, done)."""
        self.shared.stop()
        self.simulator.close()
