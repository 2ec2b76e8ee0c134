"""Reliability of the app's handlers: validation on arbitrary input, stops, faults, memory over many runs.

Everything here drives the app's own handler functions in-process (generate_view, compare_prompt,
compare_set, run_playground, stop_generation, measure_baseline). The figures (time from Stop to the
worker ending, memory before and after N runs) are printed: run with `-s` to see them.
"""

from __future__ import annotations

import ctypes
import gc
import math
import os
import re
import threading
import time
import unicodedata
from contextlib import contextmanager
from types import SimpleNamespace
from unittest import mock

import gradio as gr
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

import metasd.decoding.engine as engine
from metasd.core.validation import LIMITS, PROMPT_SET_MAX_BYTES, InvalidInput, parse_prompt_set, validate_settings
from metasd.ui import bundles as ui_bundles
from metasd.ui import compare as ui_compare
from metasd.ui import files as ui_files
from metasd.ui import playground as ui_playground
from metasd.ui.compare import compare_prompt, compare_set
from metasd.ui.config import COMPARE_MAX_NEW_TOKENS, MAX_NEW_TOKENS
from metasd.ui.files import write_logs
from metasd.ui.generate import generate_view, measure_baseline, stop_generation
from metasd.ui.playground import run_playground
from tests.app_server import page_server

SERVER = page_server()  # this test process's server, shared with the app served in-process

PROMPT = "Summarize in one sentence: the bakery on Elm Street opens at seven and sells rye bread, croissants and tea."
pytestmark = [pytest.mark.offline_model, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def page_offline():
    """The page's offline preset, loaded once for the module (as the server loads it at start-up)."""
    return SERVER.presets.get("offline")


def request(session: str) -> SimpleNamespace:
    return SimpleNamespace(session_hash=session)


def consume(gen, limit: int | None = None) -> list:
    out = []
    for x in gen:
        out.append(x)
        if limit is not None and len(out) >= limit:
            break
    return out


def live_caches() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if issubclass(type(o), DynamicCache))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def settle() -> float:
    """RSS after collecting garbage and handing freed heap back to the OS (less allocator noise)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    return rss_mb()


# ----------------------------------------------------------------------------------------------
# Validation through the handlers, on arbitrary strings and numbers (hypothesis)


class Ran(BaseException):
    """Raised by a stub in place of the models: validation let the request through."""


def recorder(calls: list):
    def stub(*a, **k):
        calls.append((a, k))
        raise Ran

    return stub


@contextmanager
def engine_stub():
    """The engine's rounds replaced by a recorder: the handlers validate and tokenize for real, run nothing."""
    seen: list = []

    def rounds(bundle, prompt, prompt_ids, st_, stop, inspect):
        seen.append((prompt, prompt_ids, st_))
        return iter(())

    with mock.patch.object(engine, "_rounds", rounds):
        yield seen


def _named(message: str) -> bool:
    """A validation message names what was wrong."""
    words = ("prompt", "drafter", "policy", "reward", "preset", "context", *LIMITS)
    return any(w in message for w in words) and "Traceback" not in message


NUMBER = st.one_of(st.integers(-10, 10**6), st.integers(min_value=-(2**70), max_value=2**70),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8), st.none(), st.booleans(),
                   st.sampled_from(["4", "0.5", "1e3", "nan", "-inf", " 8 ", "0x10", "", "\u0664"]))
TEXT = st.one_of(st.text(max_size=200), st.sampled_from(["", "   \n\t", "\x00\x1b[31m\u202e", "\ud800 lone", "hi 🧪 漢字",
                                                         "a\u0301" * 40, "\ufeff\u200b\u200d"]))


@given(prompt=TEXT, gamma=NUMBER, mnt=NUMBER, temperature=NUMBER, top_p=NUMBER, seed=NUMBER,
       policy=st.one_of(st.sampled_from(["metasd-ucb", "hedge", "single:prompt-lookup", "single:nope", "nope", ""]),
                        st.text(max_size=12)),
       reward=st.one_of(st.sampled_from(["bd", "be", "throughput"]), st.text(max_size=6)),
       drafters=st.one_of(st.none(), st.just([]), st.lists(st.sampled_from(["prompt-lookup", "token-recycling", "x"]),
                                                            max_size=3)))
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_generate_handler_refuses_clearly_or_runs_in_range(page_offline, prompt, gamma, mnt, temperature, top_p, seed,
                                                           policy, reward, drafters):
    with engine_stub() as seen:
        try:
            consume(generate_view(SERVER, prompt, "offline", drafters, policy, reward, gamma, mnt, temperature, top_p, seed,
                                  request=request("hyp")))
        except gr.Error as e:
            assert _named(str(e.message)), e.message
            assert not seen
            return
    # Accepted: what reached the engine is clean text and settings inside the limits.
    assert len(seen) == 1
    text, ids, s = seen[0]
    assert text.strip() and len(text) <= 32_000
    text.encode("utf-8")
    assert all(ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co") for ch in text)
    assert 1 <= s.gamma <= 16 and 1 <= s.max_new_tokens <= MAX_NEW_TOKENS
    assert 0 <= s.temperature <= 2 and math.isfinite(s.temperature) and 0.01 <= s.top_p <= 1 and 0 <= s.seed < 2**32
    assert len(ids) + s.max_new_tokens + s.gamma < SERVER.presets.get("offline").max_context
    assert not SERVER.stops.runs


@given(prompt=TEXT, mnt=NUMBER, policy=st.sampled_from(["metasd-ucb", "nope", "single:layer-skip", ""]))
@settings(max_examples=120, deadline=None)
def test_compare_handler_validates_before_running(page_offline, prompt, mnt, policy):
    ran: list = []
    with mock.patch.object(ui_compare, "_method_stream", recorder(ran)):
        try:
            list(compare_prompt(SERVER, prompt, "offline", policy, mnt, progress=lambda *a, **k: None))
        except gr.Error as e:
            assert _named(str(e.message)) and not ran, e.message
            return
        except Ran:
            pass
    ((_, bundle, text, methods, n, *_), _), = ran
    assert text.strip() and 1 <= n <= COMPARE_MAX_NEW_TOKENS and policy in methods


ROW = st.fixed_dictionaries({"drafter": st.one_of(st.text(max_size=20), st.none(), st.integers(), st.floats()),
                             "acceptance": NUMBER, "cost": NUMBER})


@given(rows=st.lists(ROW, max_size=10), policies=st.lists(st.sampled_from(["metasd-ucb", "exp3", "hedge", "nope", ""]),
                                                           max_size=4),
       gamma=NUMBER, rounds=NUMBER, reward=st.sampled_from(["bd", "be", "throughput", "x"]), spread=NUMBER, seed=NUMBER)
@example(rows=[{"drafter": "a", "acceptance": 0.5, "cost": 0.1}], policies=["metasd-ucb"], gamma=4, rounds=100,
         reward="bd", spread=1, seed=0)  # an accepted table on every run: random ones rarely pass validation
@settings(max_examples=250, deadline=None)
def test_playground_handler_bounds_the_simulation(page_offline, rows, policies, gamma, rounds, reward, spread, seed):
    import pandas as pd

    calls: list = []
    # The simulation runs here, not in the simulator's spawned process: the recorder cannot be pickled to it (an
    # accepted table failed the test whenever hypothesis happened to draw one).
    with mock.patch.object(ui_playground, "compare", recorder(calls)), \
            mock.patch.object(SERVER.simulator, "run", lambda fn, *a, **k: fn(*a, **k)):
        try:
            run_playground(SERVER, pd.DataFrame(rows, columns=["drafter", "acceptance", "cost"]), policies, gamma, rounds,
                           reward, False, spread, seed)
        except gr.Error as e:
            assert "Playground settings" in e.message and not calls, e.message
            return
        except Ran:
            pass
    ((pols, drafters), k), = calls
    assert 1 <= len(drafters) <= 8 and all(0 <= d.acceptance <= 1 and 0 <= d.cost <= 100 for d in drafters)
    assert 1 <= k["gamma"] <= 16 and 1 <= k["rounds"] <= 20_000 and 0.5 <= k["spread"] <= 50
    assert set(pols) <= {"metasd-ucb", "exp3", "hedge"}


@given(lines=st.lists(st.one_of(st.text(max_size=40), st.just('{"turns": ["hi"], "category": "qa"}'),
                                st.just('{"turns": []}'), st.just("[1, 2]"), st.just('{"turns": ["\\u0000"]}')),
                      max_size=6),
       raw=st.binary(max_size=40))
@settings(max_examples=200, deadline=None)
def test_uploaded_prompt_sets_are_checked(page_offline, tmp_path_factory, lines, raw):
    path = tmp_path_factory.mktemp("up") / "set.jsonl"
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + raw)
    ran: list = []
    with mock.patch.object(ui_compare, "_method_runs", recorder(ran)):
        try:
            list(compare_set(SERVER, "upload", str(path), 10, "offline", "metasd-ucb", 8, progress=lambda *a, **k: None))
        except gr.Error as e:
            msg = str(e.message)
            assert "prompt file" in msg and "Traceback" not in msg, msg
            return
        except Ran:
            pass
    ((_, _, prompt, *_), _), = ran
    assert prompt.strip() and all(ch in "\n\t" or unicodedata.category(ch)[0] != "C" for ch in prompt)


def test_prompt_file_messages_name_the_problem():
    good = '{"question_id": 1, "category": "qa", "turns": ["What is 2+2?"]}'
    assert parse_prompt_set(good)[0] == {"question_id": "1", "category": "qa", "prompt": "What is 2+2?"}
    for data, needle in [(good + "\n{oops", "line 2 of the prompt file is not JSON"),
                         ('{"turns": "x"}', "line 1 of the prompt file needs"),
                         ('{"turns": ["   "]}', "line 1 of the prompt file: the prompt is empty"),
                         (b"\xff\xfe\x00", "not UTF-8"),
                         ("\n\n", "no prompts"),
                         (good + "\n" + " " * 1_000_001, "bytes; the limit is 1,000,000"),
                         ("\n" * 6000 + good, "lines; the limit is 5,000"),
                         ("[" * 100_000, "line 1 of the prompt file is not JSON")]:
        with pytest.raises(InvalidInput, match=needle):
            parse_prompt_set(data)


def test_oversized_upload_is_refused_before_reading(page_offline, tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"x" * (PROMPT_SET_MAX_BYTES + 1))
    with pytest.raises(gr.Error, match="limit is 1,000,000"):
        list(compare_set(SERVER, "upload", str(path), 1, "offline", "metasd-ucb", 8, progress=lambda *a, **k: None))
    with pytest.raises(gr.Error, match="Upload a JSONL"):
        list(compare_set(SERVER, "upload", None, 1, "offline", "metasd-ucb", 8, progress=lambda *a, **k: None))
    with pytest.raises(gr.Error, match="unknown prompt source"):
        list(compare_set(SERVER, "/etc/passwd", None, 1, "offline", "metasd-ucb", 8, progress=lambda *a, **k: None))


def test_prompt_longer_than_the_context_is_refused_with_the_limit(page_offline):
    with pytest.raises(gr.Error, match=r"the model's context is 8,192"):
        consume(generate_view(SERVER, "🧪\u20e0" * 9000, "offline", max_new_tokens=16))
    assert not SERVER.stops.runs


def test_library_limits_match_the_page(page_offline):
    # The app never asks the engine for more than its own cap, whatever the library allows.
    validate_settings(["a"], max_new_tokens=4096)
    with pytest.raises(gr.Error, match=f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS}, got"):
        consume(generate_view(SERVER, PROMPT, "offline", max_new_tokens=MAX_NEW_TOKENS + 1))


# ----------------------------------------------------------------------------------------------
# Stops


def test_stop_ends_the_worker_within_a_round_and_frees_its_caches(page_offline):
    assert live_caches() == 0
    ticks: list[float] = []
    done = threading.Event()
    ended: list[float] = []

    def worker():
        try:
            for _ in generate_view(SERVER, PROMPT, "offline", max_new_tokens=400, request=request("stop-me")):
                ticks.append(time.perf_counter())
        finally:
            ended.append(time.perf_counter())
            done.set()

    th = threading.Thread(target=worker, daemon=True)
    th.start()
    t_wait = time.perf_counter()
    while len(ticks) < 3 and time.perf_counter() - t_wait < 60:
        time.sleep(0.01)
    assert len(ticks) >= 3, "the generation did not start"
    t_stop = time.perf_counter()
    stop_generation(SERVER, request("someone-else"))  # another session's Stop touches nothing
    time.sleep(0.3)
    assert not done.is_set()
    t_stop = time.perf_counter()
    stop_generation(SERVER, request("stop-me"))
    assert done.wait(10), "the worker kept running after Stop"
    th.join(5)
    elapsed = ended[0] - t_stop
    rounds = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    print(f"\n[stop] Stop -> worker ended: {elapsed * 1000:.0f} ms (one round took {1000 * max(rounds):.0f} ms at most, "
          f"{len(ticks)} updates before the end)")
    assert elapsed < 2.0
    assert not SERVER.stops.runs and live_caches() == 0


def test_closed_tab_unload_stops_the_sessions_runs(page_offline):
    """demo.unload calls stop_generation with the closed session: every run of that session ends."""
    gens = [generate_view(SERVER, PROMPT, "offline", max_new_tokens=400, request=request("tab")) for _ in range(2)]
    for g in gens:
        next(g)
    assert len(SERVER.stops.runs["tab"]) == 2
    t0 = time.perf_counter()
    stop_generation(SERVER, request("tab"))
    for g in gens:
        rest = consume(g)
        assert len(rest) <= 2  # at most the round in flight, then the summary
    print(f"\n[unload] both runs of the closed session ended {1000 * (time.perf_counter() - t0):.0f} ms after unload")
    assert not SERVER.stops.runs and live_caches() == 0


@contextmanager
def still_loading(name: str, step: str):
    """The preset marked as loading (as in the first half-minute after a start) until the block ends, when the
    load ends as a successful one does (the models themselves stay the ones loaded for the module)."""
    load = ui_bundles.PresetLoad()
    load.step = step
    with SERVER.presets.lock:
        SERVER.presets.loads[name] = load
    try:
        yield load
    finally:
        with SERVER.presets.lock:
            SERVER.presets.loads.pop(name, None)
        load.set()


waits_for_loads = pytest.mark.skipif(not ui_bundles.WAIT_IN_REQUESTS, reason="on a GPU a request is told to come back")


def _status(out) -> str:
    return str(out.tokens)


@waits_for_loads
def test_a_run_pressed_while_the_models_load_is_told_so_then_runs(page_offline):
    """app.main serves the page before the models have loaded: a Run meanwhile waits for them, saying what the
    load is doing, then streams its answer as any other run; Stop takes it back while it waits."""
    frames: list = []
    done = threading.Event()
    with still_loading("offline", "loading target SmolLM2"):
        th = threading.Thread(target=lambda: (frames.extend(generate_view(SERVER, PROMPT, "offline", max_new_tokens=8,
                                                                           request=request("early"))), done.set()),
                              daemon=True)
        th.start()
        t0 = time.perf_counter()
        while len(frames) < 2 and time.perf_counter() - t0 < 10:
            time.sleep(0.05)
        assert len(frames) >= 2 and not done.is_set()
        assert "waiting for the model to load" in _status(frames[0]) and "loading target SmolLM2" in str(frames[0].stats)
        assert "early" in SERVER.stops.runs  # Stop can reach it while it waits
    assert done.wait(60), "the run did not start once the models were loaded"
    assert frames[-1].record is not None and frames[-1].record.summary.new_tokens > 0
    assert not SERVER.stops.runs

    with still_loading("offline", "converting"):
        gen = generate_view(SERVER, PROMPT, "offline", max_new_tokens=8, request=request("early-stop"))
        assert "waiting for the model to load" in _status(next(gen))
        stop_generation(SERVER, request("early-stop"))
        rest = consume(gen)
    assert rest and "stopped while the model was loading" in _status(rest[-1])
    assert not SERVER.stops.runs and live_caches() == 0


@waits_for_loads
def test_compare_pressed_while_the_models_load_shows_the_wait_in_its_progress(page_offline):
    said: list[str] = []
    result: list = []
    with still_loading("offline", "loading target SmolLM2"):
        th = threading.Thread(target=lambda: result.append(list(compare_prompt(SERVER,   # its frames; the last holds all
            PROMPT, "offline", "metasd-ucb", 4, progress=lambda *a, desc="", **k: said.append(desc)))[-1]), daemon=True)
        th.start()
        time.sleep(1.5)
        assert not result and said and "waiting for the model to load" in said[0] and "SmolLM2" in said[0]
    th.join(120)
    assert result and len(result[0][0]) >= 3  # the target alone, each drafter, the bandit


@waits_for_loads
def test_a_load_that_fails_is_told_to_every_run_that_waited_and_starts_no_other(page_offline):
    """The real load path (get_bundle's thread, its progress lines) with load_bundle failing after a step: both
    runs waiting on it get the failure in words, Compare's wait too, and none of them starts a second load."""
    calls: list[str] = []
    stepped, release = threading.Event(), threading.Event()

    def failing_load(name, progress):
        calls.append(name)
        progress("[metasd] loading target SmolLM2 ...")
        stepped.set()
        release.wait(20)
        raise OSError("disk full")

    saved = SERVER.presets.loaded.pop("offline")
    outcomes: dict[str, object] = {}
    firsts: dict[str, str] = {}

    def page_run(who: str) -> None:
        try:
            for out in generate_view(SERVER, PROMPT, "offline", max_new_tokens=8, request=request(who)):
                firsts.setdefault(who, _status(out) + str(out.stats))
            outcomes[who] = "ran"
        except gr.Error as e:
            outcomes[who] = str(e)

    def compare_run() -> None:
        try:
            list(compare_prompt(SERVER, PROMPT, "offline", "metasd-ucb", 4, progress=lambda *a, **k: None))
            outcomes["compare"] = "ran"
        except gr.Error as e:
            outcomes["compare"] = str(e)

    try:
        with mock.patch.object(ui_bundles, "load_bundle", failing_load):
            SERVER.presets.start_loading("offline")
            assert stepped.wait(10)  # the runs come once the load has said what it does
            threads = [threading.Thread(target=page_run, args=(w,), daemon=True) for w in ("a", "b")]
            threads.append(threading.Thread(target=compare_run, daemon=True))
            for th in threads:
                th.start()
            t0 = time.perf_counter()
            while len(firsts) < 2 and time.perf_counter() - t0 < 30:  # a fresh process's first figures take seconds
                time.sleep(0.05)
            assert all("loading target SmolLM2" in firsts.get(w, "") for w in ("a", "b")), (firsts, outcomes)
            release.set()
            for th in threads:
                th.join(30)
        assert calls == ["offline"]  # one load, however many waited
        assert set(outcomes) == {"a", "b", "compare"}
        assert all("loading preset offline failed (OSError: disk full)" in str(v) for v in outcomes.values()), outcomes
        assert not SERVER.stops.runs
    finally:
        with SERVER.presets.lock:
            SERVER.presets.errors.pop("offline", None)
            SERVER.presets.loaded["offline"] = saved


# ----------------------------------------------------------------------------------------------
# Faults


def _final_text(outputs) -> str:
    return "".join("".join(ev.emitted_text) for ev in outputs[-1].record.rounds)


@pytest.mark.parametrize("fault", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
                                   RuntimeError("device-side assert triggered")])
def test_a_fault_mid_generation_is_reported_and_the_next_request_is_clean(page_offline, fault):
    reference = _final_text(consume(generate_view(SERVER, PROMPT, "offline", max_new_tokens=12)))
    real_verify = engine.verify
    calls = {"n": 0}

    def failing(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise fault
        return real_verify(*a, **k)

    seen = []
    with mock.patch.object(engine, "verify", failing), pytest.raises(gr.Error) as err:
        for out in generate_view(SERVER, PROMPT, "offline", max_new_tokens=12, request=request("faulty")):
            seen.append(out)
    # the user saw the rounds before the fault (frames may batch rounds: the last one holds both). A token's
    # title reads "round 2, ..." for a drafted one and "round 2: no draft ..." where the cost-aware policy took a
    # plain step, which it may do on a CPU whose probed verification costs say no drafter pays yet.
    last = seen[-1].tokens if seen else ""
    assert len(seen) >= 2 and re.search(r"round 2[,:]", last) and not re.search(r"round 3[,:]", last)
    msg = str(err.value.message)
    if isinstance(fault, torch.OutOfMemoryError):
        assert "Out of memory" in msg
    else:
        assert "Generation failed (RuntimeError)" in msg
    assert "Traceback" not in msg and "20.00 GiB" not in msg and "device-side" not in msg
    assert not SERVER.stops.runs and live_caches() == 0
    # The shared model is untouched: the next request gives the same output as before the fault.
    assert _final_text(consume(generate_view(SERVER, PROMPT, "offline", max_new_tokens=12))) == reference


def test_a_fault_in_the_baseline_measurement_is_a_message(page_offline):
    outs = consume(generate_view(SERVER, PROMPT, "offline", max_new_tokens=4))
    record = outs[-1].record

    def boom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory")

    with mock.patch.object(ui_bundles, "target_greedy", boom), pytest.raises(gr.Error, match="Out of memory"):
        measure_baseline(SERVER, record, {}, True, True)
    stats, baselines = measure_baseline(SERVER, record, {}, True, True)
    assert len(baselines) == 1 and "identical" in next(iter(baselines.values()))["note"]


# ----------------------------------------------------------------------------------------------
# Memory over many runs


def test_memory_is_bounded_over_many_runs(page_offline):
    # 60 measured runs after 20 to warm up (METASD_MEMORY_RUNS for a longer soak): a leak of 1 MB a run shows.
    n_warm, n_total = 20, int(os.environ.get("METASD_MEMORY_RUNS", "80"))
    prompts = [f"Say hello to student number {i} in one short sentence." for i in range(7)]

    def one(i: int) -> None:
        outs = consume(generate_view(SERVER, prompts[i % len(prompts)], "offline", max_new_tokens=4,
                                     request=request(f"mem-{i % 5}")))
        write_logs(SERVER.files, outs[-1].record)  # the download files too: the temp dir must stay bounded

    t0 = time.perf_counter()
    for i in range(n_warm):
        one(i)
    before = settle()
    with mock.patch.object(ui_files, "TMP_MAX_FILES", 40):
        for i in range(n_warm, n_total):
            one(i)
    after = settle()
    secs = time.perf_counter() - t0
    files = len(list(SERVER.files.root.iterdir()))
    print(f"\n[memory] RSS after {n_warm} runs: {before:.1f} MB; after {n_total} runs: {after:.1f} MB "
          f"(+{after - before:.1f} MB); {files} temp files; {secs:.0f} s")
    assert after - before < 40, "memory grows with the number of requests"
    assert live_caches() == 0 and not SERVER.stops.runs
    assert files <= 42


def test_the_target_alone_is_timed_while_the_page_draws_its_progress(page_offline):
    """Timing the target alone streams its progress at the run's frame rate (the page keeps drawing, as it did
    during the run), then the result; the timing itself is the one measure_target returns."""
    from metasd.ui.generate import measure_baseline_stream

    outs = consume(generate_view(SERVER, PROMPT, "offline", max_new_tokens=48))
    record = outs[-1].record
    frames = list(measure_baseline_stream(SERVER, record, {}, True, True))
    progress = [s for s, b in frames[:-1]]
    assert progress and all("Timing the target alone on this prompt" in s for s in progress)
    n = record.rounds[-1].new_tokens
    made = [int(re.search(rf"(\d+) of {n} tokens", s).group(1)) for s in progress]
    assert made == sorted(made) and made[-1] > 0, made  # it grows as the target writes
    stats, baselines = frames[-1]
    (entry,) = baselines.values()
    assert "the page drawing its progress" in entry["note"] and "identical" in entry["note"]
    assert "\u00d7" in stats  # the speed-up, now that both sides are timed
