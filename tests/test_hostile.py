"""A hostile visitor against `python app.py` (a subprocess on 127.0.0.1), with gradio_client and raw HTTP,
private events called by their function index included (issue #27).

Every case ends in an answer or in a message of the app's own (never gradio's bare "Error", never a
traceback) within its time bound; the server's event loop never stalls (a pinger measures it); and after
the whole suite the server's RSS has grown by less than 200 MB and a normal request still works. Run files
and API arguments are also drawn by hypothesis (bounded examples, so the file runs in a few minutes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.app_server import free_port

ROOT = Path(__file__).resolve().parent.parent
GALLERY = ROOT / "assets" / "runs" / "ex-chat-1.json"
pytestmark = [pytest.mark.offline_model]
DRAFTERS = ["prompt-lookup", "token-recycling"]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    deps: dict[str, dict[str, Any]]
    rss0: int = 0
    stalls: list[float] = field(default_factory=list)

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss


def _start() -> Server:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false", "GRADIO_ANALYTICS_ENABLED": "False"}
    env.pop("METASD_PLUGINS", None)
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"metasd-hostile-{port}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app.py exited with {proc.returncode}; see {log.name}")
        try:
            cfg = httpx.get(url + "config", timeout=5)
            # The page is served while the models load: the server's baseline is taken once they are ready.
            if cfg.status_code == 200 and b"ready to serve" in Path(log.name).read_bytes():
                deps = {d["api_name"]: d for d in cfg.json()["dependencies"]}
                return Server(url, proc, deps)
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError("app.py did not start within 600 s")


class Pinger:
    """Measures the server's event loop: the slowest of cheap requests made every 50 ms."""

    def __init__(self, url: str):
        self.url, self.worst, self._stop = url, 0.0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as c:
            while not self._stop.is_set():
                t = time.perf_counter()
                c.get(self.url + "gradio_api/info")
                self.worst = max(self.worst, time.perf_counter() - t)
                self._stop.wait(0.05)

    def __enter__(self) -> Pinger:
        self._t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._t.join(30)


@pytest.fixture(scope="module")
def server():
    s = _start()
    try:
        # A normal request first (models warm, caches filled): the RSS baseline is a serving server's.
        ok, out, _ = call(s, "replay", [None, "ex-rag-2", 64], timeout=60)
        assert ok, out
        s.rss0 = s.rss()
        yield s
    finally:
        s.proc.terminate()
        try:
            s.proc.wait(30)
        except subprocess.TimeoutExpired:
            s.proc.kill()


# ---------------------------------------------------------------------------------------------------------
# Raw HTTP: any event by its function index, as any client can


def call(s: Server, name: str, data: list[Any], timeout: float = 60, session: str | None = None) -> tuple[bool, Any, float]:
    """Call the event `name` (its config name; private ones too) by function index. Returns (ok, output data or
    the error message, seconds). Raises if no answer comes within `timeout`."""
    dep = s.deps[name]
    session = session or uuid.uuid4().hex[:12]
    body = {"fn_index": dep["id"], "data": data, "session_hash": session, "event_data": None, "trigger_id": None}
    t = time.perf_counter()
    if not dep["queue"]:
        r = httpx.post(s.url + "gradio_api/run/predict", json=body, timeout=timeout)
        out = r.json()
        return r.status_code == 200 and "error" not in out, out.get("data", out.get("error")), time.perf_counter() - t
    r = httpx.post(s.url + "gradio_api/queue/join", json=body, timeout=timeout)
    assert r.status_code == 200, r.text
    event = r.json()["event_id"]
    with httpx.stream("GET", s.url + "gradio_api/queue/data", params={"session_hash": session}, timeout=timeout) as sse:
        for line in sse.iter_lines():
            if time.perf_counter() - t > timeout:
                raise TimeoutError(f"{name}: no answer within {timeout} s")
            if not line.startswith("data:"):
                continue
            msg = json.loads(line[5:])
            if msg.get("event_id") == event and msg.get("msg") == "process_completed":
                out = msg.get("output") or {}
                ok = bool(msg.get("success"))
                return ok, out.get("data") if ok else out.get("error"), time.perf_counter() - t
    raise AssertionError(f"{name}: the stream ended without an answer")


def upload(s: Server, data: bytes, name: str = "run.json") -> dict[str, Any]:
    r = httpx.post(s.url + "gradio_api/upload", files=[("files", (name, data))], timeout=60)
    assert r.status_code == 200, r.text[:300]
    return {"path": r.json()[0], "orig_name": name, "meta": {"_type": "gradio.FileData"}}


def refused(ok: bool, out: Any, needle: str = "") -> str:
    """The app's own message: not an answer, not gradio's bare "Error", no traceback; contains `needle`."""
    assert not ok, f"expected a refusal, got an answer: {str(out)[:300]}"
    msg = str(out or "")
    assert msg.strip() and msg.strip() != "Error" and "Traceback" not in msg, msg
    assert any(n.lower() in msg.lower() for n in needle.split("|")), msg  # "a|b": either wording
    return msg


def run_doc(**changes: Any) -> dict[str, Any]:
    doc = json.loads(GALLERY.read_text(encoding="utf-8"))
    # The gallery's lanes fit its own rounds; these files reshape the rounds, so they go without lanes (a
    # lanes field is checked on its own: runfile.check_lanes, tests/test_lanes.py).
    doc.pop("lanes", None)
    doc.update(changes)
    return doc


def with_round(doc: dict[str, Any], **changes: Any) -> dict[str, Any]:
    doc["rounds"] = [{**doc["rounds"][0], **changes}]
    return doc


def replay_file(s: Server, doc: dict[str, Any] | bytes, speed: float = 64, timeout: float = 60) -> tuple[bool, Any, float]:
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return call(s, "replay", [upload(s, data), None, speed], timeout=timeout)


# ---------------------------------------------------------------------------------------------------------
# The table, row by row


def test_an_amplifying_run_file_is_refused_before_rendering(server):
    """17,721 bytes, one round, a 300-character drafter, 8,000 drafted ids: it rendered 6.4 MB of HTML."""
    doc = with_round(run_doc(), drafter="d" * 300, draft=[1] * 8000, accepted=0, draft_text=[], p_draft=[], q_draft=[],
                     accept_prob=[], emitted=[1], emitted_text=["x"])
    ok, out, secs = replay_file(server, doc)
    refused(ok, out, "the limit is")
    doc = with_round(run_doc(), drafter="d" * 64, draft=[1] * 8000, accepted=0, draft_text=[], emitted=[1],
                     emitted_text=["x"], p_draft=[], q_draft=[], accept_prob=[])
    refused(*replay_file(server, doc)[:2], "8,000 tokens")
    # within every per-round bound, but thousands of rounds of 64 unnamed drafted ids: refused by the render bound
    r0 = {**run_doc()["rounds"][0], "drafter": "d" * 64, "draft": [1] * 64, "accepted": 0, "draft_text": [],
          "p_draft": [], "q_draft": [], "accept_prob": [], "emitted": [1], "emitted_text": [""]}
    doc = run_doc(rounds=[dict(r0, round=i + 1) for i in range(3000)], drafters=["d" * 64], colors={})
    refused(*replay_file(server, json.dumps(doc, separators=(",", ":")).encode())[:2], "would render")
    assert secs < 10


def test_thousands_of_drafters_are_refused_quickly(server):
    names = [f"drafter-{i}" for i in range(6000)]
    doc = with_round(run_doc(drafters=names, colors={}), probabilities={n: 0.0 for n in names})
    ok, out, secs = replay_file(server, doc)
    refused(ok, out, "drafters")
    assert secs < 10


def test_a_huge_recorded_time_never_holds_a_slot(server):
    for t in (1e300, 10**400):
        ok, out, secs = replay_file(server, with_round(run_doc(), draft_ms=t, verify_ms=t, overhead_ms=t), speed=64)
        assert ok, out
        assert secs < 10  # clamped: 3 x 10 s recorded at 64x
    # at the slowest speed each round waits at most REPLAY_ROUND_MAX_S (2 s), the replay at most REPLAY_MAX_S,
    # and Stop (a private event) ends it at once: twenty rounds that each claim the longest time a round may
    doc = run_doc()
    doc["rounds"] = [{**doc["rounds"][0], "round": i + 1, "draft_ms": 1e300} for i in range(20)]
    started = time.perf_counter()
    ok, out, _ = replay_file(server, {**doc, "rounds": doc["rounds"][:2]}, speed=0.25)
    assert ok and time.perf_counter() - started < 15, "two rounds claiming 10 s each took longer than their cap"
    session = uuid.uuid4().hex[:12]
    box: dict[str, Any] = {}
    doc = json.dumps(doc).encode()
    worker = threading.Thread(target=lambda: box.update(r=call(server, "replay", [upload(server, doc), None, 0.25],
                                                               timeout=200, session=session)))
    worker.start()
    time.sleep(3)
    ok, _, _ = call(server, "stop_replay", [], session=session)
    assert ok
    worker.join(30)
    assert not worker.is_alive(), "Stop did not end the replay"
    ok, out, secs = box["r"]
    assert ok and "replay stopped" in json.dumps(out), str(out)[:300]


def test_a_text_priors_weight_gets_a_message_naming_it(server):
    doc = run_doc()
    doc["config"] = {**doc.get("config", {}), "priors_weight": "lots"}
    refused(*replay_file(server, doc)[:2], "priors_weight")


def test_a_valid_run_file_above_a_megabyte_is_accepted(server):
    doc = run_doc()
    rounds = doc["rounds"]
    doc["rounds"] = [dict(rounds[i % len(rounds)], round=i + 1, draft_ms=0.1, verify_ms=0.1, overhead_ms=0.0)
                     for i in range(1900)]
    data = json.dumps(doc).encode()
    assert len(data) > 1_200_000
    ok, out, secs = replay_file(server, data, speed=64, timeout=120)
    assert ok, out
    assert secs < 60


def test_markup_in_a_drafter_name_is_escaped_in_every_view(server):
    evil = '<a href="https://evil.example">x</a><img src=x onerror=alert(1)>'[:64]
    doc = run_doc()
    old = doc["rounds"][0]["drafter"]
    doc["rounds"] = [{**r, "drafter": evil if r["drafter"] == old else r["drafter"],
                      "probabilities": {(evil if k == old else k): v for k, v in r["probabilities"].items()},
                      "rewards": {(evil if k == old else k): v for k, v in r["rewards"].items()}} for r in doc["rounds"]]
    doc["drafters"] = [evil if d == old else d for d in doc["drafters"]]
    doc["colors"] = {(evil if k == old else k): v for k, v in doc["colors"].items()}
    up = upload(server, json.dumps(doc).encode())
    ok, out, _ = call(server, "replay_at", [up, None, len(doc["rounds"])])  # a private event, by its index
    assert ok, out
    # token view, both figures, the numbers, the plain text (the per-drafter table is a gradio DataFrame of "str"
    # cells: shown as text, never as markup)
    html_views = [out[0], out[3]]
    figure_text = [x for i in (1, 2) for x in _strings(json.loads(out[i]["plot"]))]
    for text in html_views + figure_text:
        assert "<a " not in text and "<img" not in text, text[:300]
    shown = json.dumps(out[:4])
    assert "&lt;a href" in shown  # the name is there, as text


def _strings(x: Any) -> list[str]:
    """Every string inside a figure's JSON (names, titles, hover templates, tick labels)."""
    if isinstance(x, str):
        return [x]
    if isinstance(x, dict):
        return [s for v in x.values() for s in _strings(v)]
    if isinstance(x, list):
        return [s for v in x for s in _strings(v)]
    return []


def test_a_huge_compare_set_is_refused_before_it_starts(server):
    line = {"question_id": 1, "category": "qa", "turns": ["word " * 3600]}
    data = "\n".join(json.dumps({**line, "question_id": i}) for i in range(30)).encode()
    assert len(data) < 1_000_000
    ok, out, secs = call(server, "compare_set", ["upload", upload(server, data, "set.jsonl"), 10, "offline",
                                                 "metasd-ucb", 256], timeout=60)
    refused(ok, out, "at most")
    assert secs < 30


def test_cancelling_a_slow_run_never_stalls_the_event_loop(server):
    session = uuid.uuid4().hex[:12]
    args = ["Write a long story about a robot.", "offline", DRAFTERS, "metasd-ucb", "bd", 4, 512, 0.0, 1.0, 0, False, False, {}]
    dep = server.deps["generate"]
    body = {"fn_index": dep["id"], "data": args, "session_hash": session, "event_data": None, "trigger_id": None}
    event = httpx.post(server.url + "gradio_api/queue/join", json=body, timeout=30).json()["event_id"]
    with Pinger(server.url) as ping:
        with httpx.stream("GET", server.url + "gradio_api/queue/data", params={"session_hash": session},
                          timeout=120) as sse:
            for line in sse.iter_lines():
                if '"process_generating"' in line:
                    break
        time.sleep(1.0)
        r = httpx.post(server.url + "gradio_api/cancel", json={"session_hash": session, "fn_index": dep["id"],
                                                               "event_id": event}, timeout=30)
        assert r.status_code == 200
        time.sleep(2.0)
    server.stalls.append(ping.worst)
    assert ping.worst < 0.5, f"the event loop stalled {ping.worst:.2f} s while a run was cancelled"


def _stall_of_16(server: Server, name: str, args: list[Any]) -> tuple[float, list[tuple[bool, Any, float]]]:
    results: list[tuple[bool, Any, float]] = []
    with Pinger(server.url) as ping:
        threads = [threading.Thread(target=lambda: results.append(call(server, name, args))) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    return ping.worst, results


def test_private_events_validate_and_never_stall_the_loop(server):
    """16 calls at once of the queue-less event that reads a whole run file (0.9 MB) stall the event loop no
    more than 16 calls of a trivial queue-less event (on a busy 2-core machine HTTP alone costs that much)."""
    data = json.dumps(run_doc(rounds=run_doc()["rounds"] * 12)).encode()
    up = upload(server, data)
    trivial, _ = _stall_of_16(server, "_policy_info", ["exp3"])
    worst, results = _stall_of_16(server, "replay_rounds", [up, None])
    server.stalls.append(worst)
    print(f"\n16 calls at once: trivial event {trivial:.3f} s, replay_rounds on {len(data):,} B {worst:.3f} s")
    assert len(results) == 16 and all(ok for ok, _, _ in results)
    # once its replay (in the queue) has read the file, the range is the run's
    ok, _, _ = call(server, "replay_at", [up, None, 1])
    ok2, out, _ = call(server, "replay_rounds", [up, None])
    assert ok and ok2 and out[0]["maximum"] == len(run_doc()["rounds"]) * 12, out
    assert worst < trivial + 0.5, f"16 calls of replay_rounds stalled the loop {worst:.2f} s (trivial: {trivial:.2f} s)"
    # private events validate as public ones
    refused(*call(server, "replay_at", [None, "../../etc/passwd", 1])[:2], "not in the list of choices")
    refused(*call(server, "replay_at", [None, "ex-rag-2", 10**30])[:2], "round")
    refused(*call(server, "on_preset", ["../../models/x"])[:2], "unknown preset|not in the list")
    ok, out, _ = call(server, "_policy_info", ['[click](https://evil.example)<script>'])
    assert ok and "](https" not in out[0] and "<script>" not in out[0], out
    # the playground's handler (public now; the page load sends a precomputed default outside the queue)
    refused(*call(server, "playground", [{"headers": ["drafter", "acceptance", "cost"], "data": [["a", "x", 0]]},
                                             ["exp3"], 4, 100, "bd", False, 8, 0])[:2], "acceptance")


def test_bad_arguments_of_every_public_endpoint_get_messages(server):
    cases = [
        ("generate", ["x" * 100_000, "offline", DRAFTERS, "metasd-ucb", "bd", 4, 16, 0.0, 1.0, 0, False, False, {}], "limit"),
        ("generate", ["hi", "offline", "prompt-lookup", "metasd-ucb", "bd", 4, 16, 0.0, 1.0, 0, False, False, {}],
         "not in the list"),
        ("generate", ["hi", "offline", DRAFTERS, "metasd-ucb", "bd", {"a": 1}, 16, 0.0, 1.0, 0, False, False, {}], "gamma"),
        ("generate", ["hi", "offline", ["<b>nope</b>"], "metasd-ucb", "bd", 4, 16, 0.0, 1.0, 0, False, False, {}],
         "unknown|not in the list"),
        ("generate", ["hi", "offline", DRAFTERS, "metasd-ucb", "bd", 4, 10**9, 0.0, 1.0, 0, False, False, {}], "max_new_tokens"),
        ("compare", ["hi", "offline", "metasd-ucb", "lots"], "max_new_tokens"),
        ("compare", ["word " * 6000, "offline", "metasd-ucb", 256], "at most"),
        ("compare_set", ["elsewhere", None, 1, "offline", "metasd-ucb", 8], "unknown prompt source|not in the list"),
        ("replay", [None, "ex-rag-2", "fast"], "speed"),
        ("replay", [None, "ex-rag-2", float("1e308")], "speed"),
        ("playground", [{"headers": ["drafter", "acceptance", "cost"], "data": [[f"d{i}", 0.5, 0.1] for i in range(8)]},
                        ["metasd-ucb", "exp3", "thompson", "hedge", "uniform"], 4, 20000, "bd", False, 8, 0], "at most"),
        ("playground", [{"headers": ["drafter", "acceptance", "cost"], "data": [["a", 0.5, 0.1]]}, ["exp3"], 4, 100,
                        "bd", False, 8, -1], "seed"),
    ]
    for name, args, needle in cases:
        ok, out, secs = call(server, name, args, timeout=60)
        refused(ok, out, needle)
        assert secs < 30, (name, secs)


def test_a_bad_run_file_format_gets_messages(server):
    for data, needle in [(b'{"a": ' * 50_000 + b"1" + b"}" * 50_000, "run file"),
                         (b'{"format": "metasd-run", "version": 1, "n": ' + b"9" * 5000 + b"}", "out of range"),
                         (b"\xff\xfe\x00garbage", "UTF-8"), (b"[]", "JSON object"),
                         (b'{"format": "<script>", "version": 1}', "not a MetaSD run file")]:
        refused(*replay_file(server, data)[:2], needle)


# ---------------------------------------------------------------------------------------------------------
# Property-based: run files and API arguments drawn at random


_value = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=False, allow_infinity=False),
                   st.text(max_size=80), st.lists(st.integers(-5, 10**6), max_size=70))
_keys = st.sampled_from(["drafter", "draft", "accepted", "emitted", "emitted_text", "draft_text", "draft_ms",
                         "verify_ms", "p_draft", "probabilities", "round", "target_token", "new_tokens", "bonus"])


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(changes=st.dictionaries(_keys, _value, max_size=4), top=st.dictionaries(
    st.sampled_from(["drafters", "colors", "config", "stats", "version", "prompt", "lanes", "settings"]), _value,
    max_size=2))
def test_any_run_file_ends_in_an_answer_or_a_message(server, changes, top):
    doc = run_doc(**top)
    doc["rounds"] = [{**doc["rounds"][0], **changes}, *doc["rounds"][1:4]]
    ok, out, secs = call(server, "replay_at", [upload(server, json.dumps(doc).encode()), None, 2], timeout=30)
    if not ok:
        refused(ok, out)
    assert secs < 20


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(gamma=_value, rounds=_value, spread=_value, seed=_value, reward=st.one_of(st.sampled_from(["bd", "be"]), _value),
       name=st.text(max_size=100), acc=_value)
def test_any_playground_arguments_end_in_an_answer_or_a_message(server, gamma, rounds, spread, seed, reward, name, acc):
    table = {"headers": ["drafter", "acceptance", "cost"], "data": [[name, acc, 0.1], ["b", 0.5, 0.0]]}
    ok, out, secs = call(server, "playground", [table, ["exp3", "hedge"], gamma, rounds, reward, False, spread, seed],
                         timeout=60)
    if not ok:
        refused(ok, out)
    assert secs < 40


# ---------------------------------------------------------------------------------------------------------
# After everything: bounded memory, and the server serves a normal request at normal speed


def test_zz_the_server_still_serves_with_bounded_memory(server):
    from gradio_client import Client

    client = Client(server.url, verbose=False)
    t = time.perf_counter()
    out = client.predict("Translate to French: good morning", "offline", DRAFTERS, "metasd-ucb", "bd", 4, 16, 0.0, 1.0, 0,
                         False, False, api_name="/generate")
    secs = time.perf_counter() - t
    assert "done:" in out[0] and secs < 60, secs
    ok, out, _ = call(server, "replay", [None, "ex-rag-2", 64])
    assert ok
    grown = (server.rss() - server.rss0) / 2**20
    print(f"\nRSS grew {grown:.0f} MB over the hostile suite; worst event-loop stall {max(server.stalls or [0]):.3f} s; "
          f"a normal 16-token request took {secs:.1f} s")
    assert grown < 200, f"RSS grew {grown:.0f} MB"
    assert server.proc.poll() is None
