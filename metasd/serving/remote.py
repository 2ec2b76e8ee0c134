"""The shared rounds (metasd.serving.batch.Rounds) in a process of their own, beside the server's.

Why a process: torch gives the interpreter lock back at every call, and the shared rounds make thousands of
calls a second (attention per request and layer). In the server's process each of them waited to take the lock
back from the event loop and the frame-building threads: with 32 streams the rounds' thread waited about half
its time. The same Python work in another process costs the rounds nothing measurable with one torch thread
(docs/BENCHMARKS.md, *What the server's own work costs the engine*), so on a CPU the server forks the rounds
off at start-up, after its models are loaded: the child shares their weights (copy-on-write, never written) and
owns every request's KV caches, drafters and bandit; the server keeps the page, the line and the frames.

What crosses the pipes: a page run's job (the request the server checked: its cleaned prompt, its prompt ids and
its settings, defaults filled in; the child starts it as it is), a Stop, and back each request's events (pickled
dataclasses), its error and its end, with how many requests the latest pass verified together.

Why one process per core (RoundsPool): a class's pass is compute-bound on one core (the linear layers over
every row, then attention request by request, in one thread), and a second torch thread in the same process
gained nothing; two processes, each with half the class on a core of its own, served 1.5-1.8x the tokens on the
engine alone and about 1.2x through the server, whose own work now comes out of their cores (docs/BENCHMARKS.md).
They tell each other how many requests they hold (shared memory), so that one takes every core only while the
other is idle, and they run niced below the server (NICE).
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import os
import pickle
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from metasd import settings
from metasd.decoding.engine import Prepared, Request, prepare, steps
from metasd.serving.batch import END, Rounds, _End, drain

log = logging.getLogger(__name__)
STOP_POLL_S = 0.1  # a Stop reaches the rounds within this, then the request ends at its next round
# The rounds' processes yield the cores to the server's: its event loop takes a class's 32 Runs, validates them and
# streams the frames, in a fraction of a core, but only if it gets that fraction when it asks. At the same priority
# two busy rounds' processes kept 28 of 32 Runs from reaching them for 7 s and left students' streams silent long
# enough for their clients to give up (read time-outs); niced, they still take every cycle the server leaves
# ($METASD_ROUNDS_NICE: 0 for the server's priority).
NICE = settings.value("METASD_ROUNDS_NICE")


@dataclass(frozen=True)
class Job:
    """A run for the rounds' process: a request the server checked already (`prepared`, what the page sends: the
    child starts it as it is), or the raw pieces for the child to check itself (metasd.decoding.engine.prepare)."""

    prompt: str | list[int] = ""  # the text, or ids as they are (without `prepared`)
    drafters: list[str] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    max_new_tokens_limit: int | None = None
    timed: bool = False  # timed against the target alone (Compare): reads its own prompt, never a kept pass
    prepared: Prepared | None = None

    @classmethod
    def of(cls, prepared: Prepared, timed: bool = False) -> Job:
        return cls(timed=timed, prepared=prepared)


class EngineGone(RuntimeError):
    """The rounds' process ended: the runs it held end with this error, and later runs are refused."""


class RoundsProcess:
    """A server's handle on shared rounds running in a forked process: `submit(job, stop)` streams one run's
    events as Rounds.submit does in-process. The child is forked here, so create it before the server starts
    its threads (app.main does, before launch): only the forking thread lives on in the child."""

    def __init__(self, bundle: Any, rounds: Rounds, load: Any = None, slot: int = 0,
                 siblings: Sequence[RoundsProcess] = (), read: bool = True):
        """`load` (a shared int array, one per process of a pool) and `slot` (this one's place in it): how many
        requests each holds. `siblings`: the pool's processes forked before this one, whose server ends the
        child closes (else a killed server's earlier children would never see their pipes close). Without
        `read`, the thread reading the child's events starts later (`start_reading`: after a pool's forks)."""
        self.model = bundle.target  # the server's handle on the same weights: `bundle.target is ROUNDS.model`
        self.block = rounds.block  # rows per row-wise call of every pass (0: any)
        self.together = self.most = 0
        ctx = mp.get_context("fork")
        cmd_recv, self._cmds = ctx.Pipe(duplex=False)
        self._events, ev_send = ctx.Pipe(duplex=False)
        ends = [self._cmds, self._events] + [e for s in siblings for e in (s._cmds, s._events)]
        self._proc = ctx.Process(target=_serve, args=(bundle, rounds, cmd_recv, ev_send, ends, load, slot),
                                 name=f"metasd-rounds-{slot}", daemon=True)
        self._proc.start()
        cmd_recv.close()
        ev_send.close()
        self._queues: dict[int, queue.SimpleQueue] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.gone = ""  # why the child ended, once it has
        self._closing = False
        self._reader = threading.Thread(target=self._read, name="metasd-rounds-reader", daemon=True)
        if read:
            self.start_reading()

    def start_reading(self) -> None:
        if self._reader.ident is None:
            self._reader.start()

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def submit(self, job: Job, stop: threading.Event) -> Iterator[Any]:
        """The run's events, in order, ending with its summary (or re-raising its error). Setting `stop`, or
        closing the iterator, ends the run in the child at its next round."""
        if self.gone:
            raise EngineGone(self.gone)
        rid = next(self._ids)
        box: queue.SimpleQueue = queue.SimpleQueue()
        self._queues[rid] = box
        ended = told = False

        def tell() -> None:
            nonlocal told
            if stop.is_set() and not told:
                self._send(("stop", rid, None))
                told = True

        try:
            self._send(("join", rid, job))
            yield from drain(box, STOP_POLL_S, tell)
            ended = True
        except Exception:  # the run's own error (or the process gone): it has ended there
            ended = True
            raise
        finally:
            self._queues.pop(rid, None)
            if not ended and not told and not self.gone:  # closed early (a cancelled stream): free its caches there
                self._send(("stop", rid, None))

    def _send(self, msg: tuple) -> None:
        try:
            with self._lock:
                self._cmds.send(msg)
        except (OSError, ValueError) as e:
            raise EngineGone(self.gone or f"the shared rounds' process is gone ({e})") from None

    def _read(self) -> None:
        while True:
            try:
                rid, together = self._events.recv()  # two ints: always readable
            except (EOFError, OSError):
                break
            except Exception:  # noqa: BLE001  (not our header: the pipe can no longer be read in step)
                log.exception("shared rounds: an unreadable message from the rounds' process; it is restarted")
                self._proc.kill()
                break
            try:
                item = self._events.recv()  # the run's item, a message of its own
            except (EOFError, OSError):
                break
            except Exception as e:  # noqa: BLE001  (one run's message that does not unpickle ends that run only)
                log.warning("shared rounds: run %d's message could not be read (%s: %s); that run ends", rid,
                            type(e).__name__, e)
                item = RuntimeError(f"a message of this run could not be read ({type(e).__name__})")
                box = self._queues.pop(rid, None)
                if box is not None:
                    box.put(item)
                continue
            self.together = together
            self.most = max(self.most, together)
            box = self._queues.get(rid)
            if box is not None:
                box.put(item)
        self._proc.join(5)
        if self._closing:
            self.gone = "the shared rounds were closed"
        else:
            self.gone = (f"the shared rounds' process ended (exit code {self._proc.exitcode}) and was restarted; "
                         "press Run again")
            log.error(self.gone)
        for box in list(self._queues.values()):
            box.put(EngineGone(self.gone))

    def close(self, timeout: float = 10.0) -> None:
        """End the child: it finishes nothing more (running requests end with an error) and exits."""
        self._closing = True
        try:
            self._send(("close", 0, None))
        except EngineGone:
            pass
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout)
        self._cmds.close()


class RoundsPool:
    """Shared rounds in `n` forked processes (one per core): each run goes to the process holding the fewest, and
    runs there with those; the server's handle looks like one RoundsProcess (`submit`, `together`, `close`)."""

    def __init__(self, bundle: Any, rounds: Rounds, n: int):
        self.model = bundle.target
        self.block = rounds.block
        self._bundle, self._rounds = bundle, rounds  # kept to fork a replacement for a process that died
        self._load = load = mp.get_context("fork").Array("i", n, lock=False)
        self.processes: list[RoundsProcess] = []
        for slot in range(n):  # every fork first, then the readers: each child begins with the forking thread alone
            self.processes.append(RoundsProcess(bundle, rounds, load, slot, self.processes, read=False))
        for p in self.processes:
            p.start_reading()
        self._running = [0] * n
        self.restarts = 0
        self._lock = threading.Lock()

    @property
    def most(self) -> int:
        """The most requests one pass has verified, in any of the processes."""
        return max(p.most for p in self.processes)

    @property
    def pids(self) -> list[int | None]:
        return [p.pid for p in self.processes]

    @property
    def gone(self) -> str:
        """Why the shared rounds ended, once every process has."""
        return self.processes[0].gone if all(p.gone for p in self.processes) else ""

    @property
    def together(self) -> int:
        """Requests the latest passes verified together, over the processes serving someone now."""
        with self._lock:
            busy = [p for p, n in zip(self.processes, self._running, strict=True) if n]
        return sum(p.together for p in busy)

    def submit(self, job: Job, stop: threading.Event) -> Iterator[Any]:
        """As RoundsProcess.submit, in the process holding the fewest runs. A process that died (its runs were
        told so) is replaced first by a fresh fork of the same rounds."""
        with self._lock:
            self._restart_dead()
            live = [i for i, p in enumerate(self.processes) if not p.gone] or [0]
            i = min(live, key=lambda j: self._running[j])
            self._running[i] += 1
        try:
            yield from self.processes[i].submit(job, stop)
        finally:
            with self._lock:
                self._running[i] -= 1

    def _restart_dead(self) -> None:
        """Fork a replacement for each process that ended without being closed (under self._lock). The rounds
        given to the first forks were never run in this process, so a new child starts from the same state."""
        for slot, p in enumerate(self.processes):
            if p.gone and not p._closing:
                self._load[slot] = 0
                others = [q for q in self.processes if q is not p and not q.gone]
                self.processes[slot] = RoundsProcess(self._bundle, self._rounds, self._load, slot, others)
                self.restarts += 1
                for end in (p._cmds, p._events):  # the dead child's pipes (its reader has ended)
                    end.close()
                log.warning("shared rounds: process %s had ended; process %s replaces it", p.pid,
                            self.processes[slot].pid)

    def close(self, timeout: float = 10.0) -> None:
        for p in self.processes:
            p.close(timeout)


class SharedRounds:
    """The server's shared rounds once started (metasd.ui.generate.start_rounds): a Rounds driver in the server's
    process or a RoundsPool of processes; `now` is None while runs take the engine alone."""

    def __init__(self) -> None:
        self.now: Rounds | RoundsPool | None = None

    def start(self, rounds: Rounds | RoundsPool) -> None:
        self.stop()
        self.now = rounds

    def stop(self) -> None:
        """No shared rounds from now on (their processes end)."""
        if isinstance(self.now, RoundsPool):
            self.now.close()
        self.now = None


class _Load:
    """A pool process's view of the shared load array (metasd.serving.batch.Neighbours): its own slot, the sum of
    the others'. Each slot has one writer, so no lock: a reading a pass late only delays a thread change."""

    def __init__(self, load: Any, slot: int):
        self.load, self.slot = load, slot

    def publish(self, n: int) -> None:
        self.load[self.slot] = n

    def others(self) -> int:
        return sum(self.load) - self.load[self.slot]


class _Outbox:
    """A request's outbox in the child: every item goes down the events pipe, tagged with the request's id."""

    def __init__(self, rid: int, send: Callable[[int, Any], None]):
        self.rid, self._send = rid, send

    def put(self, item: Any) -> None:
        self._send(self.rid, item)


def _serve(bundle: Any, rounds: Rounds, cmds: Any, events: Any, servers_ends: list, load: Any, slot: int) -> None:
    """The child's main thread: prepare each job and join it to the rounds (whose thread then runs it), pass
    Stops on; end when the server closes its end (or dies: its ends are closed here, so the pipe reports it)
    or asks to."""
    for end in servers_ends:
        end.close()
    os.nice(NICE)
    if load is not None:
        rounds.neighbours = _Load(load, slot)
    lock = threading.Lock()
    stops: dict[int, threading.Event] = {}

    def send(rid: int, item: Any) -> None:
        if isinstance(item, _End):
            stops.pop(rid, None)
        try:
            data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001  (an error that does not pickle still reaches its run, as text)
            data = pickle.dumps(RuntimeError(f"{type(item).__name__}: {item}"))
        try:
            with lock:  # a header, then the item as a message of its own: one the server cannot read names its run
                events.send((rid, rounds.together))
                events.send_bytes(data)
        except OSError:  # the server is gone: the main thread sees it too and ends
            pass

    while True:
        try:
            kind, rid, job = cmds.recv()
        except (EOFError, OSError):
            break
        if kind == "close":
            break
        if kind == "stop":
            if rid in stops:
                stops[rid].set()
            continue
        stop = stops[rid] = threading.Event()
        try:
            req = (Request.of(bundle, job.prepared) if job.prepared is not None else
                   prepare(bundle, job.prompt, drafters=job.drafters, max_new_tokens_limit=job.max_new_tokens_limit,
                           **job.settings))
        except BaseException as e:  # noqa: BLE001  (validated by the server already: reaches the run, not the child)
            send(rid, e)
            send(rid, END)
            continue
        req.timed = job.timed
        rounds.join(req, steps(req, stop), _Outbox(rid, send))
    for stop in list(stops.values()):  # running requests end at their next round
        stop.set()
    os._exit(0)  # nothing of the server's (atexit hooks, buffered output) runs twice in a forked child
