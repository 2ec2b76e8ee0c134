"""Loopback load test: several gradio_client users at once, bad input mixed in, every output equal to
its solo run; the shared models used from several threads; Stop and a closed tab through the server.

Bounded: 6 users x (2 generations of 12 tokens + 3 bad requests), each call with a timeout. The figures
(users, requests, bad-input kinds, mismatches, peak concurrent generations, stop latency) are printed:
run with `-s` to see them.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from gradio_client import Client

from metasd.decoding.engine import run
from tests.app_server import free_port, page_server
from tests.test_app_api import parse

SERVER = page_server()  # this test process's server, shared with the app served in-process

pytestmark = [pytest.mark.offline_model, pytest.mark.usefixtures("one_torch_thread")]
USERS, TOKENS = 6, 12
PROMPTS = [
    "Translate to French: the library opens at nine.",
    "Summarize in one sentence: rain is expected all week, so the picnic moves to the school hall.",
    "What is 17 times 3? Answer briefly.",
    "Write a Python one-liner that reverses a string s.",
    "Name three colours of the rainbow.",
    "Give one tip for learning to ride a bicycle.",
]
# Two settings per user: (policy, gamma, drafters); None drafters = the preset's default list.
SETTINGS = [("metasd-ucb", 4, None), ("single:prompt-lookup", 3, ["prompt-lookup", "token-recycling"])]
# (keyword overrides of a valid request, words of which one must be in the message)
BAD = [
    ({"prompt": ""}, ["prompt is empty"]),
    ({"prompt": "\x00\u202e \t\x1b"}, ["prompt is empty"]),
    ({"prompt": "x" * 40_000}, ["limit is 32,000"]),
    ({"prompt": "🧪\u20e0" * 9000}, ["model's context is 8,192"]),
    ({"gamma": 0}, ["gamma must be between 1 and 16"]),
    ({"gamma": "many"}, ["gamma must be a number"]),
    ({"max_new_tokens": 100_000}, ["max_new_tokens must be between 1 and"]),
    ({"temperature": -1}, ["temperature must be between"]),
    ({"top_p": 5}, ["top_p must be between"]),
    ({"seed": -1}, ["seed must be between"]),
    ({"seed": 1.5}, ["seed must be a whole number"]),
    ({"policy": "nope"}, ["unknown policy"]),
    ({"policy": "single:nope"}, ["not among the chosen drafters"]),
    ({"drafters": ["nope"]}, ["unknown drafter", "not in the list of choices"]),
    ({"preset": "gpt2"}, ["unknown preset", "not in the list of choices"]),
    ({"reward": "nope"}, ["unknown reward", "not in the list of choices"]),
    ({"drafters": []}, ["Tick at least one drafter"]),
    ({"full_info": True, "policy": "hedge", "max_new_tokens": 0}, ["max_new_tokens must be between"]),
]


SERVED: dict = {}


@pytest.fixture(scope="module")
def server():
    """A server of its own that runs 3 generations at once (the page's default on a CPU is 1), so that
    requests really share the models; it closes at the end of the module."""
    import app

    SERVER.presets.get("offline")
    saved = app.GEN_CONCURRENCY  # read by app.launch (the queue's concurrency), so set on app
    app.GEN_CONCURRENCY = 3
    try:
        demo = app.build_demo(SERVER)
        port = free_port()
        app.launch(SERVER, demo, host="127.0.0.1", port=port, prevent_thread_lock=True, quiet=True)
    finally:
        app.GEN_CONCURRENCY = saved
    SERVED["demo"] = demo
    yield f"http://127.0.0.1:{port}/"
    demo.close()


def _request(prompt: str, setting: tuple) -> dict:
    policy, gamma, drafters = setting
    kw = {"prompt": prompt, "preset": "offline", "policy": policy, "gamma": gamma, "max_new_tokens": TOKENS}
    if drafters is not None:
        kw["drafters"] = drafters
    return kw


def _solo(bundle, kw: dict) -> str:
    args = {k: v for k, v in kw.items() if k not in ("prompt", "preset")}
    rounds, _ = run(bundle, kw["prompt"], **args)
    return "".join("".join(ev.emitted_text) for ev in rounds)


@pytest.mark.timeout(600)
def test_concurrent_users_get_exactly_their_solo_output(server):

    peak = {"n": 0}
    watching = threading.Event()

    def watch():
        while not watching.is_set():
            with SERVER.stops.lock:
                n = sum(len(v) for v in SERVER.stops.runs.values())
            peak["n"] = max(peak["n"], n)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    def user(i: int) -> dict:
        client = Client(server, verbose=False)
        valid, bad = [], []
        for j in range(len(SETTINGS)):
            kw = _request(PROMPTS[i], SETTINGS[j])
            job = client.submit(api_name="/generate", **kw)
            # Bad input from the same user while its generation is queued or running.
            k = (i * 3 + j) % len(BAD)
            extra, needles = BAD[k]
            with pytest.raises(Exception) as err:
                client.predict(api_name="/generate", **{**kw, **extra})
            bad.append((k, needles, str(err.value)))
            outs = job.result(timeout=240)
            valid.append((kw, "".join(parse(outs[0]).out)))
        k = (i * 3 + 2) % len(BAD)
        extra, needles = BAD[k]
        with pytest.raises(Exception) as err:
            client.predict(api_name="/generate", **{**_request(PROMPTS[i], SETTINGS[0]), **extra})
        bad.append((k, needles, str(err.value)))
        return {"valid": valid, "bad": bad}

    t0 = time.perf_counter()
    with ThreadPoolExecutor(USERS) as pool:
        results = list(pool.map(user, range(USERS), timeout=540))
    wall = time.perf_counter() - t0
    watching.set()
    watcher.join(2)

    bundle = SERVER.presets.get("offline")
    differing, served, kinds = [], 0, set()
    for r in results:
        for kw, text in r["valid"]:
            served += 1
            if text != _solo(bundle, kw):
                differing.append(kw)
        for k, needles, msg in r["bad"]:
            kinds.add(k)
            assert any(n in msg for n in needles), (BAD[k][0], msg[:300])
            assert "Traceback" not in msg
    print(f"\n[load] {USERS} concurrent users, {served} generations served in {wall:.1f} s, "
          f"peak {peak['n']} generations at once; {sum(len(r['bad']) for r in results)} bad requests of "
          f"{len(kinds)} kinds refused clearly; {len(differing)} outputs differed from their solo runs")
    assert served == USERS * len(SETTINGS) and not differing
    assert len(kinds) == len(BAD) and peak["n"] >= 2
    # Still healthy: nothing left running, and a new user is served.
    assert not SERVER.stops.runs
    out = Client(server, verbose=False).predict(api_name="/generate", **_request(PROMPTS[0], SETTINGS[0]))
    assert "".join(parse(out[0]).out) == _solo(bundle, _request(PROMPTS[0], SETTINGS[0]))


@pytest.mark.timeout(300)
def test_shared_models_are_safe_from_several_threads():
    """The engine called from 6 threads at once on the one loaded bundle (no queue in between) gives
    each request the token ids it gets alone."""

    bundle = SERVER.presets.get("offline")
    jobs = [(PROMPTS[i], SETTINGS[i % 2]) for i in range(USERS)]

    def ids(job) -> tuple[int, ...]:
        kw = _request(*job)
        args = {k: v for k, v in kw.items() if k not in ("prompt", "preset")}
        return run(bundle, kw["prompt"], **{**args, "max_new_tokens": 8})[1].token_ids

    solo = [ids(j) for j in jobs]
    with ThreadPoolExecutor(USERS) as pool:
        together = list(pool.map(ids, jobs, timeout=240))
    assert together == solo


def _stops_of(session: str) -> int:

    with SERVER.stops.lock:
        return len(SERVER.stops.runs.get(session, ()))


@pytest.mark.timeout(300)
def test_cancel_and_closed_tab_end_the_worker(server):
    # 1. The client cancels (what the Stop button's `cancels` does).
    client = Client(server, verbose=False)
    job = client.submit(api_name="/generate", **{**_request(PROMPTS[1], SETTINGS[0]), "max_new_tokens": 400})
    for n, _ in enumerate(job, 1):
        if n >= 2:
            break
    session = client.session_hash
    assert _stops_of(session) == 1
    t0 = time.perf_counter()
    job.cancel()
    while _stops_of(session) and time.perf_counter() - t0 < 10:
        time.sleep(0.01)
    cancel_s = time.perf_counter() - t0
    assert not _stops_of(session), "the cancelled generation is still running"

    # 2. The tab closes: the page's event stream goes away mid-generation.
    demo_fns = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]
    names = [p["parameter_name"] for p in demo_fns["parameters"]]
    values = {**{p["parameter_name"]: p["parameter_default"] for p in demo_fns["parameters"]},
              **_request(PROMPTS[2], SETTINGS[0]), "max_new_tokens": 400}
    fn_index = next(i for i, f in SERVED["demo"].fns.items() if f.api_name == "generate")
    session = uuid.uuid4().hex[:11]
    data = [values[n] for n in names] + [None]  # + the per-session State (baselines)
    r = httpx.post(f"{server}gradio_api/queue/join", json={"data": data, "fn_index": fn_index, "session_hash": session,
                                                           "event_data": None, "trigger_id": None}, timeout=30)
    assert r.status_code == 200, r.text
    with httpx.stream("GET", f"{server}gradio_api/queue/data", params={"session_hash": session}, timeout=60) as s:
        generating = 0
        for line in s.iter_lines():
            if '"process_generating"' in line:
                generating += 1
                if generating >= 2:
                    break
    t0 = time.perf_counter()  # the stream is closed here, as when the tab closes
    while _stops_of(session) and time.perf_counter() - t0 < 20:
        time.sleep(0.01)
    closed_s = time.perf_counter() - t0
    print(f"\n[stop] cancel -> worker ended: {1000 * cancel_s:.0f} ms; closed tab -> worker ended: {1000 * closed_s:.0f} ms")
    assert not _stops_of(session), "the closed tab's generation is still running"
    assert cancel_s < 3 and closed_s < 3
    out = client.predict(api_name="/generate", **_request(PROMPTS[3], SETTINGS[0]))
    assert parse(out[0]).out, "the app serves the next request"

