"""The named `/generate` endpoint through gradio_client, against the app served in-process."""

from __future__ import annotations

import re
import time
from html.parser import HTMLParser

import pytest
from gradio_client import Client

from metasd.decoding.engine import run
from tests.app_server import (
    app_url,  # noqa: F401  (fixture)
    page_server,
)

SERVER = page_server()  # this test process's server, shared with the app served in-process

PROMPT = "Summarize in one sentence: the bakery on Elm Street opens at seven and sells rye bread, croissants and tea."


class _Tokens(HTMLParser):
    """Text of the output tokens (accepted + target) and of the rejected ones, from the token view."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.rejected: list[str] = []
        self._into: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        cls = dict(attrs).get("class") or ""
        if tag == "span" and cls.startswith("tok "):
            self._into = self.rejected if "rej" in cls.split() else self.out

    def handle_endtag(self, tag):
        if tag == "span":
            self._into = None

    def handle_data(self, data):
        if self._into is not None:
            self._into.append(data)


def parse(html: str) -> _Tokens:
    p = _Tokens()
    p.feed(html)
    return p


@pytest.mark.offline_model
@pytest.mark.timeout(180)
def test_generate_streams_rounds_and_matches_engine(app_url):  # noqa: F811
    client = Client(app_url, verbose=False)
    job = client.submit(PROMPT, preset="offline", max_new_tokens=24, api_name="/generate")
    updates = [out for out in job]
    assert len(updates) >= 3, "the page streams: a first frame at once, frames while the engine runs, a final one"
    texts = [parse(u[0]).out for u in updates]
    lengths = [len("".join(t)) for t in texts]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1], "the token view grows round by round"

    rounds, summary = run(SERVER.presets.get("offline"), PROMPT, max_new_tokens=24)
    final = "".join(parse(updates[-1][0]).out)
    assert final == "".join("".join(ev.emitted_text) for ev in rounds)
    assert final.strip() == summary.text.strip()
    # frames are bounded by the run's own rounds (several rounds per frame when the engine is fast; the
    # cost-aware policy's rounds vary with measured times, so the page's count, from its numbers), plus the
    # start, the end and the end again with the drafter lanes
    drawn = re.search(r"drew (\d+) frames for (\d+) rounds", updates[-1][3])
    assert drawn, updates[-1][3][-400:]
    assert len(updates) <= int(drawn.group(2)) + 3
    assert 'data-drafter="' in updates[-1][-1], "the last frame carries the drafter lanes"


@pytest.mark.offline_model
@pytest.mark.timeout(180)
def test_cancel_stops_generation_and_app_keeps_serving(app_url):  # noqa: F811

    client = Client(app_url, verbose=False)
    job = client.submit(PROMPT, preset="offline", max_new_tokens=400, api_name="/generate")
    seen = 0
    for _ in job:
        seen += 1
        if seen >= 2:
            break
    t0 = time.time()
    job.cancel()
    # 400 tokens take well over 10 s here; a cancelled generation ends within a round or two,
    # and its `finally` (stop signal set, engine generator closed) releases the session's entry.
    while SERVER.stops.runs and time.time() - t0 < 10:
        time.sleep(0.1)
    assert not SERVER.stops.runs, "the cancelled generation is still running"
    out = client.predict(PROMPT, preset="offline", max_new_tokens=16, api_name="/generate")
    assert parse(out[0]).out, "the app serves the next request after a cancel"


@pytest.mark.offline_model
@pytest.mark.timeout(120)
def test_invalid_input_is_a_message_not_a_traceback(app_url):  # noqa: F811
    client = Client(app_url, verbose=False)
    with pytest.raises(Exception) as err:
        client.predict("   ", preset="offline", max_new_tokens=16, api_name="/generate")
    assert "prompt is empty" in str(err.value)
    assert "Traceback" not in str(err.value)
    with pytest.raises(Exception) as err:
        client.predict(PROMPT, preset="offline", max_new_tokens=16, policy="single:nope", api_name="/generate")
    assert "nope" in str(err.value)


def test_only_preset_names_load_and_hub_presets_need_cuda(monkeypatch):
    from metasd.core.validation import InvalidInput
    from metasd.models.presets import PRESETS
    from metasd.ui import bundles

    monkeypatch.setattr(bundles, "HAS_CUDA", False)  # where available_presets reads it
    assert bundles.available_presets() == ["offline"]
    for bad in ("gpt2", "Qwen/Qwen2.5-7B-Instruct", "../../etc/passwd", "qwen2.5-7b", None, 3):
        with pytest.raises(InvalidInput):
            bundles.Presets().get(bad)
    monkeypatch.setattr(bundles, "HAS_CUDA", True)
    assert bundles.available_presets() == list(PRESETS)


def test_server_address_follows_the_host(monkeypatch):
    import app

    for var in ("GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT", "PORT", "SPACE_ID"):
        monkeypatch.delenv(var, raising=False)
    assert app.server_address() == ("127.0.0.1", 7860)
    monkeypatch.setenv("PORT", "8123")
    assert app.server_address() == ("0.0.0.0", 8123)
    monkeypatch.delenv("PORT")
    monkeypatch.setenv("SPACE_ID", "someone/metasd-studio")
    assert app.server_address() == ("0.0.0.0", 7860)
    monkeypatch.setenv("GRADIO_SERVER_NAME", "127.0.0.1")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "9000")
    assert app.server_address() == ("127.0.0.1", 9000)
