"""Time to first streamed token and streamed tokens/s through the app's /generate API, next to
the engine alone on the same prompt and settings (both in this process, interleaved).

    PYTHONPATH=. .venv/bin/python scripts/measure_streaming.py [--repeats 3] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

from gradio_client import Client

import metasd
from metasd.events import RoundEvent
from tests.app_server import serve

PROMPT = ("Answer from the passage. Passage: The Greenway Bridge is 480 metres long and opened in 2009. "
          "It carries bicycles and pedestrians across the river. Question: How long is the Greenway Bridge?")


def via_app(client: Client, n: int) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    job = client.submit(PROMPT, max_new_tokens=n, api_name="/generate")
    first = None
    last_html = ""
    for update in job:
        html = update[0] if isinstance(update, list | tuple) else update
        if first is None and re.search(r"<span[^>]*class=\"[^\"]*tok", str(html)):
            first = time.perf_counter() - t0
        last_html = str(html)
    total = time.perf_counter() - t0
    return first or total, total, len(last_html)


def via_engine(bundle, n: int) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    first, tokens = None, 0
    for ev in metasd.generate(bundle, PROMPT, max_new_tokens=n):
        if isinstance(ev, RoundEvent):
            first = first or time.perf_counter() - t0
        else:
            tokens = ev.new_tokens
    return first or 0.0, time.perf_counter() - t0, tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    a = ap.parse_args()
    url = serve()
    import app

    bundle = app.get_bundle("offline")
    client = Client(url, verbose=False)
    _, _, tokens = via_engine(bundle, a.max_new_tokens)  # warm-up, and the token count
    rows = {"app": [], "engine": []}
    for _ in range(a.repeats):
        rows["app"].append(via_app(client, a.max_new_tokens))
        rows["engine"].append(via_engine(bundle, a.max_new_tokens))
    for name, rs in rows.items():
        first = statistics.median(r[0] for r in rs)
        total = statistics.median(r[1] for r in rs)
        print(f"{name:7s} first token {first * 1000:7.0f} ms   whole run {total:6.2f} s   {tokens / total:5.1f} tokens/s")


if __name__ == "__main__":
    main()
