"""Security of the served app: only preset models, safetensors only, no remote code, no share link,
files served only from the app's own temp dir, bounded uploads and inputs."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from unittest import mock
from urllib.parse import quote

import httpx
import pytest

from tests.app_server import (
    app_url,  # noqa: F401  (fixture)
    page_server,
)

SERVER = page_server()  # this test process's server, shared with the app served in-process

ROOT = Path(__file__).resolve().parent.parent


def get_file(base: str, path: str) -> httpx.Response:
    return httpx.get(f"{base}gradio_api/file={path}", timeout=30, follow_redirects=False)


@pytest.mark.offline_model
@pytest.mark.timeout(180)
def test_files_are_served_only_from_the_apps_temp_dir(app_url):  # noqa: F811
    from metasd.decoding.loading import offline_target_dir

    own = SERVER.files.root / "metasd-run-0123456789abcdef0123456789abcdef.csv"
    own.write_text("round,drafter\n1,prompt-lookup\n")
    assert get_file(app_url, str(own)).status_code == 200, "the app's own run logs are downloadable"

    model_file = offline_target_dir(progress=lambda m: None) / "model.safetensors"
    refused = ["/etc/passwd", "/etc/shadow", "/proc/self/environ", str(ROOT / "app.py"), str(ROOT / "metasd" / "models.py"),
               str(model_file), f"{SERVER.files.root}/../../etc/passwd", f"{SERVER.files.root}/%2e%2e/%2e%2e/etc/passwd",
               quote("/etc/passwd", safe=""), "../../../../etc/passwd", "app.py", "~/.bashrc", "file:///etc/passwd",
               "http://127.0.0.1:1/secret", "http://169.254.169.254/latest/meta-data/"]
    for path in refused:
        r = get_file(app_url, path)
        assert r.status_code in (400, 403, 404), (path, r.status_code)
        assert "root:" not in r.text and "safetensors" not in r.headers.get("content-type", "")
    assert len(refused) >= 15


@pytest.mark.offline_model
@pytest.mark.timeout(180)
def test_an_api_call_cannot_name_a_server_file_as_its_upload(app_url):  # noqa: F811
    """A client may send a FileData pointing anywhere: gradio accepts only files uploaded to it."""
    payload = {"data": ["upload", {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}, 1, "offline",
                        "metasd-ucb", 8]}
    r = httpx.post(f"{app_url}gradio_api/call/compare_set", json=payload, timeout=30)
    assert r.status_code == 200
    event_id = r.json()["event_id"]
    with httpx.stream("GET", f"{app_url}gradio_api/call/compare_set/{event_id}", timeout=120) as s:
        body = "".join(s.iter_text())
    assert "event: error" in body and "root:" not in body, body[:500]


@pytest.mark.offline_model
@pytest.mark.timeout(180)
def test_uploads_are_size_limited(app_url, tmp_path):  # noqa: F811
    from gradio_client import Client, handle_file

    from metasd.core.validation import PROMPT_SET_MAX_BYTES

    big = tmp_path / "big.jsonl"
    line = json.dumps({"question_id": 1, "category": "qa", "turns": ["x" * 1000]}) + "\n"
    big.write_text(line * (PROMPT_SET_MAX_BYTES // len(line) + 10))
    client = Client(app_url, verbose=False)
    with pytest.raises(Exception) as err:
        client.predict("upload", handle_file(str(big)), 1, "offline", "metasd-ucb", 8, api_name="/compare_set")
    assert "Traceback" not in str(err.value)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "category": "qa", "turns": ["hi"]}\nnot json at all\n')
    with pytest.raises(Exception) as err:
        client.predict("upload", handle_file(str(bad)), 1, "offline", "metasd-ucb", 8, api_name="/compare_set")
    assert "line 2 of the prompt file is not JSON" in str(err.value)


@pytest.mark.offline_model
@pytest.mark.timeout(180)
def test_the_api_cannot_load_a_model_by_name_or_path(app_url):  # noqa: F811
    from gradio_client import Client

    from metasd.ui import bundles

    client = Client(app_url, verbose=False)
    with mock.patch.object(bundles, "load_bundle", side_effect=AssertionError("a model load was attempted")):
        for name in ("gpt2", "Qwen/Qwen2.5-7B-Instruct", "/work/main", "../../etc/passwd", "https://example.com/m"):
            for api, args in (("/generate", ("hi",)), ("/compare", ("hi", name, "metasd-ucb", 8))):
                kwargs = {"preset": name} if api == "/generate" else {}
                with pytest.raises(Exception) as err:
                    client.predict(*args, api_name=api, **kwargs)
                assert "attempted" not in str(err.value) and "Traceback" not in str(err.value)
        # /replay reads only run files: an upload, or a recorded run by a name the gallery lists
        for name in ("../app", "/etc/passwd", "../../assets/examples"):
            with pytest.raises(Exception) as err:
                client.predict(None, name, 2.0, api_name="/replay")
            msg = str(err.value)  # the dropdown's own check, or the handler's: either way refused, no traceback
            assert ("no recorded run" in msg or "not in the list of choices" in msg) and "Traceback" not in msg
    named = set(client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    assert named == {"/generate", "/compare", "/compare_set", "/playground", "/replay"}, named


def test_models_load_from_safetensors_without_remote_code():
    import torch

    from metasd.decoding import loading as models

    with mock.patch.object(models.AutoModelForCausalLM, "from_pretrained") as fp:
        models.load_causal_lm("some/preset-model", torch.device("cpu"), torch.float32)
    kwargs = fp.call_args.kwargs
    assert kwargs["use_safetensors"] is True and kwargs["trust_remote_code"] is False
    sources = [ROOT / "app.py", *sorted((ROOT / "metasd").rglob("*.py"))]  # metasd/ui/ too
    for src in sources:
        text = src.read_text(encoding="utf-8")
        assert not re.search(r"trust_remote_code\s*=\s*True", text), src
        assert not re.search(r"pickle\.loads?\(|use_safetensors\s*=\s*False", text), src
        # torch.load only as weights_only (metasd.training.train reads its own tensor cache that way; the app never does)
        assert all("weights_only=True" in line for line in text.splitlines() if "torch.load(" in line), src


def test_launch_binds_locally_without_a_share_link_and_bounds_the_queue(monkeypatch):
    import gradio as gr

    import app
    from metasd.core.validation import PROMPT_SET_MAX_BYTES, RUN_MAX_BYTES, UPLOAD_MAX_BYTES
    from metasd.ui.config import QUEUE_SIZE

    for var in ("GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT", "PORT", "SPACE_ID"):
        monkeypatch.delenv(var, raising=False)
    demo = gr.Blocks()
    with mock.patch.object(gr.Blocks, "launch") as launch:
        app.launch(SERVER, demo)
    kw = launch.call_args.kwargs
    assert kw["server_name"] == "127.0.0.1" and kw["share"] is False
    assert kw["allowed_paths"] == [str(SERVER.files.root)]
    assert str(ROOT) in kw["blocked_paths"]
    # gradio's upload cap is the run-file cap (the largest upload any tab takes), never below it
    assert kw["max_file_size"] == UPLOAD_MAX_BYTES == max(RUN_MAX_BYTES, PROMPT_SET_MAX_BYTES)
    assert demo._queue.max_size == QUEUE_SIZE
    # ... and polls for work every 10 ms, not gradio's 1 ms (10% of a core on an idle 2-core server)
    from metasd.ui.session import QUEUE_POLL_S
    assert demo._queue.sleep_when_free == QUEUE_POLL_S >= 0.01
    with mock.patch.object(gr.Blocks, "launch") as launch:
        app.launch(SERVER, demo, share=True)  # only when asked
    assert launch.call_args.kwargs["share"] is True


def test_temp_files_are_private_and_unguessable():
    from metasd.ui.files import write_logs
    from metasd.ui.session import RunRecord

    assert stat.S_IMODE(os.stat(SERVER.files.root).st_mode) == 0o700
    from metasd.core.events import RoundEvent

    ev = RoundEvent(round=1, drafter="prompt-lookup", draft=(1,), accepted=1, emitted=(1, 2), target_token=2, bonus=True,
                    p_draft=(0.9,), q_draft=(1.0,), accept_prob=(0.9,), reward=0.9, rewards={"prompt-lookup": 0.9},
                    probabilities={"prompt-lookup": 1.0}, regret=0.0, regret_measured=False, draft_ms=1.0, verify_ms=1.0,
                    overhead_ms=0.1, new_tokens=2, emitted_text=("a", "b"), draft_text=("a",))
    record = RunRecord(prompt="my private prompt", rounds=[ev], summary=None, preset="offline",
                       settings={"policy": "single:../../etc"})
    csv, js = write_logs(SERVER.files, record)
    folders = set()
    for upd in (csv, js):
        path = Path(upd["value"])
        # named by content (preset, policy, time), inside a private folder whose name nobody can guess
        assert path.parent.parent == SERVER.files.root and re.fullmatch(r"[0-9a-f]{32}", path.parent.name)
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
        assert re.fullmatch(r"metasd-offline-single-etc-\d{8}-\d{6}\.(csv|json)", path.name), path.name
        folders.add(path.parent)
        path.unlink()
    assert len(folders) == 1
    folders.pop().rmdir()


def test_input_limits_protect_the_host():
    from metasd.core.validation import LIMITS, MAX_PROMPT_CHARS
    from metasd.ui.config import COMPARE_MAX_NEW_TOKENS, COMPARE_MAX_PROMPTS, MAX_NEW_TOKENS, QUEUE_SIZE

    assert MAX_NEW_TOKENS <= LIMITS["max_new_tokens"][1] and COMPARE_MAX_NEW_TOKENS <= MAX_NEW_TOKENS
    assert MAX_PROMPT_CHARS <= 32_000 and QUEUE_SIZE <= 64 and COMPARE_MAX_PROMPTS <= 40
    assert LIMITS["rounds"][1] * LIMITS["gamma"][1] * 8 <= 3_000_000  # the playground's arrays stay small
    from metasd.core.runfile import MAX_BYTES
    from metasd.core.validation import COMPARE_MAX_WORK, PLAYGROUND_MAX_WORK, RUN_MAX_BYTES, UPLOAD_MAX_BYTES

    assert MAX_BYTES == RUN_MAX_BYTES <= UPLOAD_MAX_BYTES <= 8_000_000  # one cap, stated once
    assert 1_500_000 <= RUN_MAX_BYTES  # a 1024-token full-information run (README) is accepted
    assert COMPARE_MAX_WORK <= 5_000_000 and PLAYGROUND_MAX_WORK <= 500_000


def test_presets_load_in_the_background_and_loaded_ones_are_bounded(monkeypatch):
    """A hub preset loads in a thread of its own: whoever asked is told at once, nobody waits on a lock meanwhile
    (the loaded preset keeps serving), and at most MAX_BUNDLES stay loaded (least recently used unloaded)."""
    import threading
    import time
    from types import SimpleNamespace

    from metasd.ui import bundles

    gate = threading.Event()

    def slow_load(name, progress=None):
        gate.wait(10)
        return SimpleNamespace(name=name, drafter_names=[f"{name}-d"], default_drafters=[f"{name}-d"])

    monkeypatch.setattr(bundles, "available_presets", lambda: ["hub-a", "hub-b", "hub-c"])
    monkeypatch.setattr(bundles, "load_bundle", slow_load)
    monkeypatch.setattr(bundles, "_warm_up", lambda b: None)
    monkeypatch.setattr(bundles, "MAX_BUNDLES", 2)
    monkeypatch.setattr(bundles, "WAIT_IN_REQUESTS", False)  # as on a GPU host
    presets = bundles.Presets()
    gate.set()
    assert presets.get("hub-a").name == "hub-a"  # start-up: waits for its load
    gate.clear()
    t = time.perf_counter()
    with pytest.raises(bundles.Loading, match="loading in the background"):
        presets.get("hub-b", wait=False)
    assert presets.get("hub-a", wait=False).name == "hub-a"  # served while hub-b loads
    assert time.perf_counter() - t < 1.0
    import gradio as gr

    with pytest.raises(gr.Error, match="loading in the background"):
        presets.bundle_for("hub-b")  # the page's message, not a wait
    gate.set()
    assert presets.get("hub-b").name == "hub-b"
    presets.get("hub-a")  # hub-a most recently used: hub-b is the one to go
    assert presets.get("hub-c").name == "hub-c"
    assert list(presets.loaded) == ["hub-a", "hub-c"]


def test_a_wait_for_a_load_ends_with_the_load_a_stop_or_its_time_limit(monkeypatch):
    """PresetLoad.waiting, which both the page's run and Compare wait in: it ticks while the load runs, returns when
    it ends or Stop/Cancel is pressed, and raises the user's message where the load failed or ran past LOAD_WAIT_S."""
    import threading

    from metasd.core.validation import InvalidInput
    from metasd.ui import bundles

    load, stop = bundles.PresetLoad(), threading.Event()
    ticks = 0
    for _ in load.waiting("offline", stop, every=0.01):
        ticks += 1
        if ticks == 3:
            load.set()  # loaded
    assert ticks == 3

    load = bundles.PresetLoad()
    load.error = "OSError: disk full"
    load.set()
    with pytest.raises(InvalidInput, match=r"loading preset offline failed \(OSError: disk full\); choose it again"):
        list(load.waiting("offline", stop))

    load, stop = bundles.PresetLoad(), threading.Event()
    waiting = load.waiting("offline", stop, every=0.01)
    next(waiting)
    stop.set()  # Stop pressed: the wait ends without a word (the caller says it was stopped)
    assert list(waiting) == []

    monkeypatch.setattr(bundles, "LOAD_WAIT_S", 0.05)
    load = bundles.PresetLoad()
    with pytest.raises(InvalidInput, match="did not load within"):
        list(load.waiting("offline", threading.Event(), every=0.02))
