"""metasd.serving.streaming (the engine in its own worker, handed over in frames) and viz.LiveView, on tiny models.

No timing asserts: a fast engine must produce fewer frames than rounds, the last frame must be the
whole run, a stop mid-burst must end cleanly, and a failure in the worker reaches only its viewer.
"""

from __future__ import annotations

import threading

import pytest

from metasd.core.events import RoundEvent, Summary
from metasd.decoding.engine import generate, run
from metasd.serving.streaming import EngineStream, FairSlots, FrameBudget
from metasd.ui import viz
from tests.tiny import tiny_bundle

PROMPT = [3, 7, 1, 4, 9, 3, 7, 1, 4, 9, 3, 7, 2, 5]


@pytest.fixture(scope="module")
def bundle():
    return tiny_bundle()


def _stream(bundle, n: int, stop: threading.Event | None = None, **kw) -> EngineStream:
    stop = stop or threading.Event()
    events = generate(bundle, PROMPT, chat_template=False, max_new_tokens=n, stop=stop, **kw)
    return EngineStream(events, stop, max_fps=kw.pop("max_fps", 4.0))


def test_fast_engine_gives_fewer_frames_than_rounds_and_the_last_frame_is_the_whole_run(bundle):
    stream = _stream(bundle, 300, policy="round-robin")
    colors = viz.drafter_colors(bundle.drafter_names)
    view = viz.LiveView(colors, bundle.drafter_names)
    frames, sizes = 0, []
    try:
        for batch, done in stream.batches():
            frames += 1
            for item in batch:
                view.add(item.event, item.t)
            html = view.tokens_html() if not done else view.tokens_html("end")
            sizes.append(len(html))
            if done:
                break
    finally:
        stream.close()
    assert not stream.alive
    rounds, summary = run(bundle, PROMPT, chat_template=False, max_new_tokens=300, policy="round-robin")
    assert len(rounds) > 20, "the tiny engine should run many rounds"
    assert frames == stream.frames and stream.rounds == len(rounds)
    assert frames < len(rounds), f"{frames} frames for {len(rounds)} rounds: rounds were not batched"
    # the final frame is the final state: every round, the summary, and exactly what token_html renders
    assert [ev.emitted for ev in view.rounds] == [ev.emitted for ev in rounds]
    assert isinstance(view.summary, Summary) and view.summary.token_ids == summary.token_ids
    assert view.tokens_html("end") == viz.token_html(rounds, colors, status="end")
    assert view.text() == viz.output_text(rounds)
    assert view.table().equals(viz.drafter_table(view.rounds, bundle.drafter_names))  # same events, same table
    # streaming frames only ever append to the token HTML (gradio then sends only the new part)
    assert sizes == sorted(sizes)


def test_streaming_html_is_a_prefix_of_every_later_frame(bundle):
    colors = viz.drafter_colors(bundle.drafter_names)
    view = viz.LiveView(colors, bundle.drafter_names, placeholder="waiting")
    prev = view.tokens_html()
    rounds, summary = run(bundle, PROMPT, chat_template=False, max_new_tokens=40, policy="round-robin")
    for ev in rounds:
        view.add(ev, 0.0)
        cur = view.tokens_html()
        assert cur.startswith(prev) and len(cur) > len(prev)
        prev = cur
    view.add(summary, summary.wall_s)
    assert view.tokens_html("done").startswith(prev)
    assert view.stats()["new_tokens"] == summary.new_tokens
    assert view.stats()["tokens_per_s"] == summary.tokens_per_s
    # plotly.js fails on an update that sets a property to null (e.g. an axis range): none are sent
    for fig in (view.arm_json(), view.regret_json(), viz.LiveView(colors, bundle.drafter_names).arm_json()):
        assert "null" not in fig


def test_stop_during_a_burst_ends_the_worker_with_a_final_frame(bundle):
    stop = threading.Event()
    stream = _stream(bundle, 450, stop=stop, policy="round-robin")
    seen: list[RoundEvent | Summary] = []
    try:
        for batch, done in stream.batches():
            seen.extend(item.event for item in batch)
            if not done and len(seen) >= 5:
                stop.set()  # what the Stop button does
            if done:
                break
    finally:
        stream.close()
    assert not stream.alive
    assert isinstance(seen[-1], Summary) and seen[-1].stop_reason == "stopped"
    assert seen[-1].new_tokens < 450
    assert all(isinstance(e, RoundEvent) for e in seen[:-1])


def test_a_viewer_that_goes_away_ends_the_worker(bundle):
    stream = _stream(bundle, 450, policy="round-robin")
    gen = stream.batches()
    next(gen)
    gen.close()  # the page's generator is closed (tab closed, client cancelled)
    stream.close()
    assert not stream.alive


def test_a_failure_in_the_worker_reaches_its_viewer_after_the_rounds_before_it():
    def events():
        yield from ()
        raise RuntimeError("boom in round 1")

    stream = EngineStream(events(), threading.Event())
    with pytest.raises(RuntimeError, match="boom"):
        for _ in stream.batches():
            pass
    stream.close()
    assert not stream.alive


def test_concurrent_streams_get_exactly_their_own_outputs(bundle):
    results: dict[int, tuple] = {}

    def one(seed: int):
        stream = _stream(bundle, 60, policy="uniform", seed=seed, temperature=1.0)
        got = []
        try:
            for batch, done in stream.batches():
                got.extend(i.event for i in batch)
                if done:
                    break
        finally:
            stream.close()
        results[seed] = got[-1].token_ids

    threads = [threading.Thread(target=one, args=(s,)) for s in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for seed in (1, 2, 3):
        _, alone = run(bundle, PROMPT, chat_template=False, max_new_tokens=60, policy="uniform", seed=seed,
                       temperature=1.0)
        assert results[seed] == alone.token_ids


def test_slow_rendering_spaces_the_frames_out_and_each_frame_carries_the_rounds_in_between(bundle):
    """A frame that took 0.5 s to render makes the next one wait at least three times that, and the rounds the
    engine produced meanwhile arrive together in it; the first round is shown at once, the summary ends it."""
    import time

    _, summary = run(bundle, PROMPT, chat_template=False, max_new_tokens=4, policy="round-robin")
    rounds = [object() for _ in range(5)]  # the stream hands events over without looking into rounds
    summary_gate = threading.Event()

    def events():
        yield from rounds
        summary_gate.wait(30)
        yield summary

    stream = EngineStream(events(), threading.Event(), max_fps=8.0)
    try:
        frames = stream.batches()
        first, done = next(frames)
        assert [t.event for t in first] == rounds[:1] and not done  # the first visible token is not held back
        stream.frame_cost(0.5)  # that frame took 0.5 s to draw
        asked = time.perf_counter()
        second, done = next(frames)
        waited = time.perf_counter() - asked
        assert waited >= 1.5 * 0.999, f"the next frame came {waited:.3f} s after the last one was drawn"
        assert [t.event for t in second] == rounds[1:] and not done  # four rounds, one frame
        summary_gate.set()
        last, done = next(frames)
        assert done and [t.event for t in last] == [summary]
        with pytest.raises(StopIteration):
            next(frames)
        assert (stream.frames, stream.rounds) == (3, 5)
    finally:
        summary_gate.set()
        stream.close()
    with pytest.raises(ValueError):
        EngineStream(iter(()), threading.Event(), max_fps=0)


def test_the_servers_frame_budget_is_shared_by_its_open_streams(bundle):
    """Two streams under a budget of 4 frames a second draw a frame each at most every half second; a stream
    counts only while its frames are being taken, and one left half-read stops counting when it is dropped."""
    import time

    budget = FrameBudget(4.0)
    assert budget.interval() == 0.25 and budget.open == 0
    gates = [threading.Event() for _ in range(2)]

    def events(gate: threading.Event):
        yield from (object() for _ in range(3))
        gate.wait(30)

    streams = [EngineStream(events(g), threading.Event(), max_fps=100.0, budget=budget) for g in gates]
    try:
        frames = [s.batches() for s in streams]
        for f in frames:
            first, _ = next(f)  # the first round at once, budget or not
            assert len(first) == 1
        assert budget.open == 2 and budget.interval() == 0.5
        asked = time.perf_counter()
        second, _ = next(frames[0])
        waited = time.perf_counter() - asked
        assert waited >= 0.5 * 0.95, f"a frame came {waited:.3f} s after the last with two streams open"
        assert len(second) == 2  # the rounds in between arrive together
        frames[1].close()  # a page that went away: its generator is dropped
        assert budget.open == 1 and budget.interval() == 0.25
    finally:
        for g in gates:
            g.set()
        for s in streams:
            s.close()
    for f in frames:
        f.close()
    assert budget.open == 0
    with pytest.raises(ValueError):
        FrameBudget(0)


def test_fair_slots_serve_first_come_first_served():
    slots = FairSlots(1)
    order: list[str] = []
    slots.acquire()  # a Compare run holds the model
    ready = threading.Event()

    def generate_request():
        ready.set()
        with slots.hold():
            order.append("generate")

    t = threading.Thread(target=generate_request)
    t.start()
    ready.wait(5)
    while slots.waiting == 0:  # the request is in line
        pass
    slots.release()
    # the Compare run releases and at once asks again: the waiting request goes first, not the Compare run
    with slots.hold():
        order.append("compare")
    t.join(5)
    assert order == ["generate", "compare"]
    assert slots.try_acquire() and not slots.try_acquire()
    slots.release()
    with pytest.raises(RuntimeError):
        slots.release()


def test_the_prompt_is_prefilled_by_the_engine_worker_not_by_the_caller(bundle):
    """generate() only validates; the prompt's pass runs on the first round, in the worker that drives
    the events (where the page sets its torch threads), so the page's first frame is not held back."""
    callers: list[str] = []
    hook = bundle.target.register_forward_pre_hook(lambda *_: callers.append(threading.current_thread().name))
    try:
        stop = threading.Event()
        events = generate(bundle, PROMPT, chat_template=False, max_new_tokens=6, stop=stop, policy="round-robin")
        assert callers == []  # nothing run yet
        stream = EngineStream(events, stop)
        try:
            rounds = [item.event for batch, _ in stream.batches() for item in batch]
        finally:
            stream.close()
    finally:
        hook.remove()
    assert isinstance(rounds[-1], Summary) and rounds[-1].new_tokens == 6
    assert rounds[-1].prefill_s > 0
    assert callers and set(callers) == {"metasd-engine"}


def test_target_alone_is_timed_with_the_engine_workers_threading(bundle, monkeypatch):
    """The page's speed-up divides by the target alone (metasd.ui.bundles.measure_target): its prompt pass
    must get the prefill's threads and every step after it the rounds' threads, in a thread of its own,
    exactly as the engine's worker does, and give the target's own greedy answer."""
    import torch

    from metasd.decoding.engine import target_greedy
    from metasd.ui import bundles

    monkeypatch.setattr(bundles, "HAS_CUDA", False)
    monkeypatch.setattr(bundles, "PREFILL_THREADS", 2)
    monkeypatch.setattr(bundles, "TORCH_THREADS", 1)
    seen: list[tuple[str, int]] = []
    hook = bundle.target.register_forward_pre_hook(
        lambda *_: seen.append((threading.current_thread().name, torch.get_num_threads())))
    before = torch.get_num_threads()
    try:
        out, seconds = bundles.measure_target(bundle, PROMPT, 5, FairSlots(1))
    finally:
        hook.remove()
    assert torch.get_num_threads() == before  # the caller's threads are left as they were
    assert out == target_greedy(bundle, PROMPT, 5) and seconds > 0
    assert {name for name, _ in seen} == {"metasd-target-alone"}
    threads = [n for _, n in seen]
    assert len(threads) >= 2 and threads[0] == 2 and set(threads[1:]) == {1}, threads


def test_in_fresh_thread_returns_raises_and_keeps_the_callers_threads():
    """Model work on a CPU runs in a thread that ends with it (no OpenMP team outlives its request)."""
    import torch

    from metasd.serving.streaming import in_fresh_thread

    before = torch.get_num_threads()
    seen = in_fresh_thread(lambda: (threading.current_thread().name, torch.get_num_threads()), threads=1, name="w")
    assert seen == ("w", 1) and torch.get_num_threads() == before

    def boom() -> None:
        raise ValueError("from the worker")

    with pytest.raises(ValueError, match="from the worker"):
        in_fresh_thread(boom)
    assert not [t for t in threading.enumerate() if t.name in ("w", "metasd-model")]  # each ended with its call


def test_collect_runs_the_prefill_and_the_rounds_on_their_own_thread_counts(bundle):
    """Compare's runs drain the page's one stream driver: the prompt's pass and the first round on the prefill's
    threads, every later round on the rounds' threads, in the stream's worker; the events pass unchanged."""
    import torch

    seen: list[tuple[str, int]] = []
    hook = bundle.target.register_forward_pre_hook(
        lambda *_: seen.append((threading.current_thread().name, torch.get_num_threads())))
    stop = threading.Event()
    try:
        events = generate(bundle, PROMPT, chat_template=False, max_new_tokens=12, policy="round-robin", stop=stop)
        rounds, summary = EngineStream(events, stop, prefill_threads=2, torch_threads=1).collect()
    finally:
        hook.remove()
    ref_rounds, ref = run(bundle, PROMPT, chat_template=False, max_new_tokens=12, policy="round-robin")
    assert summary.token_ids == ref.token_ids and [r.drafter for r in rounds] == [r.drafter for r in ref_rounds]
    assert {name for name, _ in seen} == {"metasd-engine"}
    threads = [n for _, n in seen]
    assert threads[0] == 2 and threads[-1] == 1 and threads == sorted(threads, reverse=True)
