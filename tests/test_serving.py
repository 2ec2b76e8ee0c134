"""Serving a class: the app's own line for the model (its place and an estimate while a run waits, "the class is
full" past capacity), Stop while waiting, one run per browser session, a stream nobody reads, page loads that
queue no model work. Drives the app's handlers in-process on the offline model; the line itself on its own."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from unittest import mock

import pytest

from metasd.core.streaming import FairSlots
from metasd.ui import generate as ui_generate
from metasd.ui import playground as ui_playground
from metasd.ui import session as ui_session

PROMPT = "Say hello to the class in one short sentence."


# ----------------------------------------------------------------------------------------------
# The line on its own


def test_line_reports_places_and_refuses_past_capacity():
    line = FairSlots(1, max_waiting=2, service_s=10.0)
    line.acquire()  # someone runs
    a, b = line.join("a"), line.join("b")
    assert a is not None and b is not None
    assert line.join("c") is None, "a full line must refuse at once"
    pa, pb = next(line.wait(a)), next(line.wait(b))
    assert (pa.place, pb.place) == (1, 2)
    assert pa.eta_s == pytest.approx(5.0) and pb.eta_s == pytest.approx(15.0)  # half a run, then one more each
    assert line.retry_after_s() >= 10.0
    line.release()
    assert list(line.wait(a)) == [] and a.admitted_at is not None  # first in line takes the free slot
    assert next(line.wait(b)).place == 1


def test_stop_while_waiting_leaves_the_line_at_once():
    line = FairSlots(1)
    line.acquire()
    stop = threading.Event()
    t = line.join("a", stop)
    behind = line.join("b")
    waiter = line.wait(t, poll=0.05)
    next(waiter)
    stop.set()
    t0 = time.perf_counter()
    assert list(waiter) == []
    assert t.left == "stopped" and time.perf_counter() - t0 < 0.2
    assert next(line.wait(behind)).place == 1  # the one behind moved up
    line.release()
    assert list(line.wait(behind)) == [] and behind.admitted_at is not None


def test_a_reader_that_is_gone_loses_its_place():
    line = FairSlots(1)
    line.acquire()
    t = line.join("a")
    reading = iter([True, True, False])
    places = list(line.wait(t, poll=0.01, reading=lambda: next(reading)))
    assert len(places) == 2 and t.left == "abandoned" and line.waiting == 0
    line.release()


def test_session_reader_gives_up_after_unread_messages():
    unread = {"s": 0}
    with mock.patch.object(ui_session, "_unread", lambda key: unread.get(key)):
        r = ui_session.SessionReader("s", patience_s=0.2)
        assert r()
        unread["s"] = 3  # messages pile up unread
        assert r()  # not yet: a reader may be a moment behind
        time.sleep(0.25)
        assert not r()
        unread["s"] = 0
        assert r()  # it read them after all
        assert ui_session.SessionReader("nobody", patience_s=1.0)()  # nobody can tell: reading


# ----------------------------------------------------------------------------------------------
# The Generate handler in line


@pytest.fixture(scope="module")
def app():
    import app as app_module

    app_module.get_bundle("offline")
    return app_module


def req(session: str) -> SimpleNamespace:
    return SimpleNamespace(session_hash=session)


def status_of(frame: tuple) -> str:
    return f"{frame[0]} {frame[3]}"


@pytest.fixture
def model_busy(app):
    """The model held by someone else for the test's length: Generate runs wait in line."""
    app.MODEL.acquire()
    try:
        yield app.MODEL
    finally:
        app.MODEL.release()


def test_waiting_run_sees_its_place_and_stop_takes_it_out(app, model_busy):
    g = app.generate_view(PROMPT, "offline", max_new_tokens=8, request=req("queued"))
    t0 = time.perf_counter()
    first = next(g)
    assert time.perf_counter() - t0 < 2.0
    assert "1st in line, about" in status_of(first) and first[-1] is None
    assert model_busy.waiting == 1
    app.stop_generation(req("queued"))
    t0 = time.perf_counter()
    rest = list(g)
    assert time.perf_counter() - t0 < 1.0, "Stop while waiting must end the run at once"
    assert "left the line before starting: you pressed Stop" in status_of(rest[-1])
    assert model_busy.waiting == 0 and not app._stops


def test_full_class_is_told_when_to_come_back(app, model_busy):
    waiting = app.generate_view(PROMPT, "offline", max_new_tokens=8, request=req("w1"))
    next(waiting)
    with mock.patch.object(model_busy, "max_waiting", 1):
        frames = list(app.generate_view(PROMPT, "offline", max_new_tokens=8, request=req("w2")))
    assert len(frames) == 1
    text = status_of(frames[0])
    assert "the class is full" in text and "Please press Run again in about" in text
    assert "Queue is full" not in text
    waiting.close()  # the page went away: the ticket leaves the line
    assert model_busy.waiting == 0 and not app._stops


def test_a_new_run_replaces_the_sessions_previous_one(app, model_busy):
    old = app.generate_view(PROMPT, "offline", max_new_tokens=8, request=req("same"))
    next(old)
    new = app.generate_view(PROMPT, "offline", max_new_tokens=8, request=req("same"))
    assert "in line" in status_of(next(new))
    rest = list(old)  # the old run was stopped by the new Run
    assert "you pressed Stop" in status_of(rest[-1])
    assert model_busy.waiting == 1
    new.close()
    assert model_busy.waiting == 0 and not app._stops


def test_an_unread_stream_loses_its_place(app, model_busy):
    with mock.patch.object(ui_session, "_unread", lambda key: 5 if key == "gone" else None), \
            mock.patch.object(ui_session, "READ_PATIENCE_S", 0.5):
        t0 = time.perf_counter()
        frames = list(app.generate_view(PROMPT, "offline", max_new_tokens=8, request=req("gone")))
    assert time.perf_counter() - t0 < 3.0
    assert "its stream was not read" in status_of(frames[-1]) and model_busy.waiting == 0


def test_runs_are_served_in_order_once_the_model_is_free(app):
    """Two sessions: the second waits (its place shown) and is served after the first, both in full."""
    outs: dict[str, list] = {}

    def run(name: str) -> None:
        outs[name] = list(app.generate_view(PROMPT, "offline", max_new_tokens=6, request=req(name)))

    a = threading.Thread(target=run, args=("first",))
    a.start()
    time.sleep(0.05)
    run("second")
    a.join(60)
    for name in ("first", "second"):
        assert outs[name][-1][-1] is not None and outs[name][-1][-1].summary is not None
    assert app.MODEL.waiting == 0 and app.MODEL.running == 0


def test_baseline_waits_for_nobody_while_others_are_in_line(app, model_busy):
    g = app.generate_view(PROMPT, "offline", max_new_tokens=8, request=req("someone"))
    next(g)
    record = ui_session.RunRecord(preset="offline", prompt="A prompt never timed.", settings={"temperature": 0.0},
                                  all_drafters=["x"], drafters=["x"])
    record.rounds = [SimpleNamespace(new_tokens=4, emitted=[1], emitted_text=["a"])]
    with mock.patch.object(ui_generate, "measure_target", side_effect=AssertionError("timed while others wait")), \
            mock.patch.object(ui_generate, "_record_view", lambda r: ui_generate.viz.LiveView({}, [])):
        stats, baselines = app.measure_baseline(record, {}, True, False)
    assert "not timed now" in stats and baselines == {}
    g.close()


# ----------------------------------------------------------------------------------------------
# Page loads


def test_page_load_queues_no_model_work(app):
    demo = app.build_demo()
    loads = [d for d in demo.config["dependencies"] if any(t[1] == "load" for t in d["targets"])]
    assert loads, "the page has load events"
    for d in loads:
        assert d["queue"] is False, f"a page load queues {demo.fns[d['id']].name}"
    names = {demo.fns[d["id"]].name for d in loads}
    assert "run_playground" not in names and "measure_baseline" not in names
    with mock.patch.object(app.MODEL, "acquire", side_effect=AssertionError("page load took the model")):
        first = ui_playground.playground_default()
    assert ui_playground.playground_default() is first  # computed once per server, not once per page
