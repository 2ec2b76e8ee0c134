"""The shared rounds in a process of their own (metasd.serving.remote): each run's output is its solo output,
a Stop and a closed stream end a run there and leave the others alone, a run's error reaches it, and a child
that dies fails its runs with a message instead of leaving them waiting."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest import mock

import psutil
import pytest
import torch

from metasd.core.events import RoundEvent, Summary
from metasd.core.validation import InvalidInput
from metasd.decoding.engine import collect, generate
from metasd.models.cpu_linear import pack_linears
from metasd.serving.batch import Rounds
from metasd.serving.remote import EngineGone, Job, RoundsPool, RoundsProcess
from tests.tiny import tiny_bundle

VOCAB = 64


@pytest.fixture(scope="module")
def bundle():
    b = tiny_bundle(vocab=VOCAB)
    pack_linears(b.target)
    return b


@pytest.fixture
def remote(bundle):
    r = RoundsProcess(bundle, Rounds(bundle.target, max_batch=4, idle_s=5.0, share=True, crowd_threads=1))
    yield r
    r.close()


def _prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, VOCAB, (k,), generator=g).tolist() for k in (5, 17, 9, 30, 12, 3)[:n]]


def _settings(i: int, temperature: float) -> dict:
    return {"chat_template": False, "max_new_tokens": 10 + 3 * i, "temperature": temperature, "seed": i,
            "policy": "metasd-ucb" if temperature == 0 else "round-robin"}


def _emitted(events) -> list[int]:
    rounds, summary = collect(events)
    assert isinstance(summary, Summary)
    return [t for ev in rounds for t in ev.emitted]


def _at_once_equal_solo(bundle, rounds, temperature: float) -> None:
    """Six runs submitted at once to `rounds` (a process or a pool), four at a time: each its solo output."""
    prompts = _prompts(6)
    solo = [_emitted(generate(bundle, p, **_settings(i, temperature))) for i, p in enumerate(prompts)]
    outs: dict[int, list[int]] = {}

    def run(i: int) -> None:
        outs[i] = _emitted(rounds.submit(Job(prompts[i], None, _settings(i, temperature)), threading.Event()))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [outs.get(i) for i in range(len(prompts))] == solo


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_runs_in_the_rounds_process_get_their_solo_outputs(bundle, remote, temperature):
    _at_once_equal_solo(bundle, remote, temperature)
    assert remote.pid != os.getpid() and remote.most >= 2, "the runs never shared a pass in the child"


def test_stop_and_a_closed_stream_end_their_runs_and_leave_the_others(bundle, remote):
    prompts = _prompts(3)
    long = {"chat_template": False, "max_new_tokens": 200, "temperature": 0.0, "policy": "metasd-ucb"}
    stop = threading.Event()
    stopped = remote.submit(Job(prompts[0], None, long), stop)
    closed = remote.submit(Job(prompts[1], None, long), threading.Event())
    other = remote.submit(Job(prompts[2], None, _settings(2, 0.0)), threading.Event())
    assert isinstance(next(stopped), RoundEvent) and isinstance(next(closed), RoundEvent)
    closed.close()  # a cancelled page stream: the child drops the run at its next round
    stop.set()
    t = time.perf_counter()
    rest = list(stopped)
    assert time.perf_counter() - t < 10
    assert isinstance(rest[-1], Summary) and rest[-1].stop_reason == "stopped" and rest[-1].new_tokens < 200
    assert _emitted(other) == _emitted(generate(bundle, prompts[2], **_settings(2, 0.0)))


def test_a_runs_error_reaches_it_and_the_process_serves_on(bundle, remote):
    bad = remote.submit(Job(_prompts(1)[0], ["no-such-drafter"], _settings(0, 0.0)), threading.Event())
    with pytest.raises(InvalidInput, match="no-such-drafter"):
        list(bad)
    assert _emitted(remote.submit(Job(_prompts(1)[0], None, _settings(0, 0.0)), threading.Event()))


def test_a_dead_rounds_process_fails_its_runs_with_a_message(bundle, remote):
    long = {"chat_template": False, "max_new_tokens": 400, "temperature": 0.0, "policy": "metasd-ucb"}
    run = remote.submit(Job(_prompts(1)[0], None, long), threading.Event())
    assert isinstance(next(run), RoundEvent)
    os.kill(remote.pid, 9)
    with pytest.raises(EngineGone, match="process ended"):
        list(run)
    with pytest.raises(EngineGone):
        next(remote.submit(Job(_prompts(1)[0], None, long), threading.Event()))


def test_the_rounds_process_ends_when_its_server_is_killed(tmp_path):
    """A host that kills the server (SIGKILL: nothing of the server's runs) leaves no rounds process behind, the
    first of a pool included (the second was forked with the server's ends of the first's pipes: it closes them)."""
    script = tmp_path / "server.py"
    script.write_text(
        "import sys, time\n"
        "from metasd.serving.batch import Rounds\n"
        "from metasd.serving.remote import RoundsPool\n"
        "from tests.tiny import tiny_bundle\n"
        "b = tiny_bundle(vocab=64)\n"
        "r = RoundsPool(b, Rounds(b.target, max_batch=2, share=True), 2)\n"
        "print(*r.pids, flush=True)\n"
        "time.sleep(600)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    server = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        children = [int(x) for x in server.stdout.readline().split()]
        assert len(children) == 2 and all(psutil.pid_exists(c) for c in children)
        server.kill()
        server.wait(30)

        def alive(pid: int) -> bool:
            return psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(alive(c) for c in children):
            time.sleep(0.2)
        assert not any(alive(c) for c in children), "the rounds outlived the server"
    finally:
        server.kill()


@pytest.fixture
def pool(bundle):
    p = RoundsPool(bundle, Rounds(bundle.target, max_batch=4, idle_s=5.0, share=True, crowd_threads=1), 2)
    yield p
    p.close()


def test_a_pool_spreads_a_class_over_its_processes_each_run_its_solo_output(bundle, pool):
    _at_once_equal_solo(bundle, pool, 1.0)
    assert len(set(pool.pids)) == 2 and os.getpid() not in pool.pids
    assert all(p.most >= 1 for p in pool.processes), "a process of the pool served nobody"
    assert pool.most >= 2, "no process shared a pass"


def test_a_dead_process_of_a_pool_is_replaced_and_its_runs_are_told(bundle, pool):
    """A pool process killed while it holds a run: that run ends with the app's message (press Run again), the
    other process's run goes on to its solo output, and the next run is served by a fresh fork in its place."""
    long = {"chat_template": False, "max_new_tokens": 400, "temperature": 0.0, "policy": "metasd-ucb"}
    held = pool.submit(Job(_prompts(1)[0], None, long), threading.Event())
    assert isinstance(next(held), RoundEvent)
    job = Job(_prompts(2)[1], None, _settings(1, 0.0))
    other = pool.submit(job, threading.Event())  # the other process: it holds fewer runs
    victim = next(p for p in pool.processes if p._queues)
    dead_pid = victim.pid
    os.kill(dead_pid, 9)
    with pytest.raises(EngineGone, match="restarted; press Run again"):
        list(held)
    solo = _emitted(generate(bundle, _prompts(2)[1], **_settings(1, 0.0)))
    assert _emitted(other) == solo
    assert _emitted(pool.submit(job, threading.Event())) == solo
    assert pool.restarts == 1 and dead_pid not in pool.pids and all(p.pid for p in pool.processes)
    assert not pool.gone and all(not p.gone for p in pool.processes)


def _cannot_be_read() -> None:
    raise AttributeError("Can't get attribute 'Gone' on <module 'metasd.core.events'>")


class _Unreadable:
    """Pickles in the rounds' process; unpickling it in the server raises (as a class the server lacks would)."""

    def __reduce__(self):
        return _cannot_be_read, ()


def test_a_message_that_does_not_unpickle_ends_its_run_only(bundle):
    """A run whose second round's event cannot be read in the server ends with a message; another run in the same
    process gets its solo output, and the process serves on."""
    from metasd.decoding.engine import Request

    emit = Request.emit

    def unreadable_second_round(self, r, clock):
        ev = emit(self, r, clock)
        return _Unreadable() if ev.round == 2 and self.budget > 100 else ev

    long = {"chat_template": False, "max_new_tokens": 150, "temperature": 0.0, "policy": "metasd-ucb"}
    with mock.patch.object(Request, "emit", unreadable_second_round):  # in the child too: it is forked here
        proc = RoundsProcess(bundle, Rounds(bundle.target, max_batch=4, idle_s=5.0, share=True, crowd_threads=1))
    try:
        bad = proc.submit(Job(_prompts(1)[0], None, long), threading.Event())
        with pytest.raises(RuntimeError, match="could not be read"):
            list(bad)
        job = Job(_prompts(3)[2], None, _settings(2, 0.0))
        solo = _emitted(generate(bundle, _prompts(3)[2], **_settings(2, 0.0)))
        assert _emitted(proc.submit(job, threading.Event())) == solo
        assert not proc.gone
    finally:
        proc.close()


class _Beside:
    """Another process's requests, as a pool's shared load reports them."""

    def __init__(self, n: int):
        self.n, self.mine = n, None

    def publish(self, n: int) -> None:
        self.mine = n

    def others(self) -> int:
        return self.n


def test_rounds_take_every_core_only_while_nobody_computes_beside_them(bundle):
    before = torch.get_num_threads()
    try:
        rounds = Rounds(bundle.target, max_batch=4, threads=2, share=True, crowd_threads=1)
        rounds.neighbours = beside = _Beside(0)
        rounds._set_threads()
        assert rounds._threads_now == 2  # nobody here, nobody beside: a run alone gets every core
        beside.n = 3
        rounds._set_threads()
        assert rounds._threads_now == 1  # another process computes: one core each
    finally:
        torch.set_num_threads(before)


def test_a_checked_job_is_started_as_it_is_in_the_child(bundle):
    """The server checks a page run once (engine.check) and sends the result: the child starts it without
    preparing it again (its prepare is made to fail here, before the fork), and the output is the solo one."""
    from metasd.decoding.engine import check

    with mock.patch("metasd.serving.remote.prepare", side_effect=AssertionError("prepared again in the child")):
        proc = RoundsProcess(bundle, Rounds(bundle.target, max_batch=4, idle_s=5.0, share=True, crowd_threads=1))
    try:
        prepared = check(bundle, _prompts(2)[1], **_settings(1, 0.0))
        assert _emitted(proc.submit(Job.of(prepared), threading.Event())) == _emitted(
            generate(bundle, _prompts(2)[1], **_settings(1, 0.0)))
        with pytest.raises(AssertionError, match="prepared again"):  # the raw path does prepare (the patch works)
            list(proc.submit(Job(_prompts(1)[0], None, _settings(0, 0.0)), threading.Event()))
    finally:
        proc.close()
