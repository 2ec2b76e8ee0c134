"""The speed-up a teacher sees on the page itself, per example: headless Chromium at projector size
(1280x720) against `python app.py` started as users start it (offline preset, page defaults).

For each example: put its prompt in the box (the page's opening example is already there), click Run,
wait until the page has also timed the target alone on the same prompt (it does so after each run),
and read the stat cards: tokens, the engine's tokens/s, the target alone's tokens/s and the speed-up
the page shows. Prints a markdown table and the geometric mean.

    .venv/bin/python scripts/measure_page_examples.py            # all 14 examples
    .venv/bin/python scripts/measure_page_examples.py --only ex-rag-1
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metasd.ui.config import EXAMPLES, PAGE_EXAMPLE  # noqa: E402
from tests.test_browser import ARGS, PROJECTOR, wait_idle  # noqa: E402
from tests.test_start import free_port, scrubbed_env, started  # noqa: E402


def cards(page) -> dict[str, str]:
    """Stat card title -> its value and note, as shown."""
    out = {}
    for card in page.locator("#stats .card").all():
        text = " ".join(card.inner_text().split())
        out[text.split(" ")[0].lower()] = text
    return out


def one(page, url: str, example: dict, opening: bool) -> tuple[str, float | None]:
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector("#run", timeout=60_000)
    if not opening:
        page.locator("#prompt textarea").fill(example["turns"][0])
    page.locator("#run").click()
    wait_idle(page)
    text = page.locator("#stats").inner_text()
    flat = " ".join(text.split())
    speed = re.search(r"([\d.]+)\u00d7", flat)
    base = re.search(r"target alone: ([\d.]+) tok(?:ens)?/s", flat)
    status = page.locator("#tokens .tok-status").inner_text()
    done = re.search(r"done: (\d+) tokens, (\d+) target calls, ([\d.]+) tokens/s", status)
    sp = float(speed.group(1)) if speed else None
    row = (f"| {example['category']} ({example['question_id']}){' (opens the page)' if opening else ''} | "
           f"{done.group(1) if done else '?'} | {done.group(3) if done else '?'} | "
           f"{base.group(1) if base else '?'} | {f'{sp:.2f}x' if sp else '?'} |")
    return row, sp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="comma-separated question ids (default: every example)")
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright

    wanted = [x for x in a.only.split(",") if x]
    chosen = [e for e in EXAMPLES if not wanted or e["question_id"] in wanted]
    opening = EXAMPLES[PAGE_EXAMPLE]["question_id"]
    chosen.sort(key=lambda e: e["question_id"] != opening)
    env = scrubbed_env()
    env.pop("OMP_NUM_THREADS")
    env.update({k: v for k, v in os.environ.items() if k.startswith("METASD_")})  # e.g. METASD_FRAME_FPS to compare
    port = free_port()
    speeds = []
    with started([sys.executable, "app.py", "--port", str(port)], env, port) as served, sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS, headless=True)
        page = browser.new_page(viewport=PROJECTOR)
        print("| example | tokens | page: engine tok/s | page: target alone tok/s | speed-up shown |")
        print("|---|---:|---:|---:|---:|")
        for e in chosen:
            row, sp = one(page, served.url, e, e["question_id"] == opening)
            print(row, flush=True)
            if sp:
                speeds.append(sp)
        browser.close()
    if speeds:
        gm = math.exp(sum(math.log(s) for s in speeds) / len(speeds))
        print(f"\ngeometric mean of the speed-ups shown: {gm:.2f}x over {len(speeds)} examples; "
              f"lowest {min(speeds):.2f}x")


if __name__ == "__main__":
    main()
