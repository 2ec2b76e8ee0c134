"""Stop as a person clicks it, in headless Chromium at projector size (1280x720): for each delay, Run a
256-token answer, click Stop that many seconds after the first token shows, and report how long the
page took to say "stopped" and whether the answer stayed.

    .venv/bin/python scripts/measure_stop.py [--delays 1,2,3,4,5] [--repeats 1]

The app runs as users start it (`python app.py`, a separate process, on the offline preset).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_browser import ARGS, LONG_PROMPT, PROJECTOR, set_max_new_tokens  # noqa: E402
from tests.test_start import free_port, scrubbed_env, started  # noqa: E402


def one(page, url: str, delay: float) -> str:
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector("#run", timeout=60_000)
    page.locator("#prompt textarea").fill(LONG_PROMPT)
    set_max_new_tokens(page, 256)
    page.locator("#run").click()
    page.wait_for_selector("#tokens .tok", timeout=60_000)
    page.wait_for_timeout(int(delay * 1000))
    before = page.locator("#tokens .tok").count()
    t0 = time.perf_counter()
    page.locator("#stop").click()
    page.wait_for_selector("#tokens .tok-status", timeout=30_000)
    took = time.perf_counter() - t0
    status = page.locator("#tokens .tok-status").inner_text()
    after = page.locator("#tokens .tok").count()
    m = re.search(r"stopped after (\d+) tokens", status)
    kept = bool(m) and after >= before
    page.wait_for_selector("#run:not([disabled])", timeout=120_000)
    page.wait_for_timeout(500)
    still = page.locator("#tokens .tok-status").inner_text() == status and page.locator("#tokens .tok").count() == after
    tokens = m.group(1) if m else repr(status)
    return (f"| {delay:.0f} s | {took * 1000:.0f} ms | {tokens} | {before} -> {after} | "
            f"{'yes' if kept and still else 'NO'} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--delays", default="1,2,3,4,5")
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright

    env = scrubbed_env()
    env.pop("OMP_NUM_THREADS")
    port = free_port()
    with started([sys.executable, "app.py", "--port", str(port)], env, port) as served, sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS, headless=True)
        page = browser.new_page(viewport=PROJECTOR)
        print("| Stop clicked after the first token | click -> 'stopped' shown | tokens kept | spans before -> after | "
              "answer kept |")
        print("|---:|---:|---:|---:|---|")
        for _ in range(a.repeats):
            for d in (float(x) for x in a.delays.split(",")):
                print(one(page, served.url, d), flush=True)
        browser.close()


if __name__ == "__main__":
    main()
