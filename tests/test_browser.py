"""The page in real headless Chromium (Debian's /usr/bin/chromium): run an example, see it render.

Also writes assets/screenshot.png, the README's screenshot. Fails (never skips) without Chromium.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.app_server import app_url  # noqa: F401  (fixture)

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = Path(__file__).resolve().parents[1] / "assets" / "screenshot.png"
ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-quic"]


@pytest.mark.browser
@pytest.mark.offline_model
@pytest.mark.timeout(300)
def test_page_streams_coloured_tokens_and_plots(app_url):  # noqa: F811
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: install Debian's chromium (make browser)"
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(app_url, wait_until="domcontentloaded")
            expect(page.locator("#run")).to_be_visible(timeout=60_000)

            # Pick an example from the RAG group: it fills the prompt box.
            page.get_by_role("tab", name="RAG", exact=True).click()
            page.get_by_text("The Aurora Research", exact=False).first.click()
            expect(page.locator("#prompt textarea")).to_have_value(
                __import__("re").compile("Aurora Research Station"), timeout=10_000)

            page.locator("#run").click()
            # Tokens stream in, coloured by drafter; the run ends with a summary line.
            expect(page.locator("#tokens .tok.acc").first).to_be_visible(timeout=120_000)
            expect(page.locator("#tokens .tok-status")).to_contain_text("done", timeout=180_000)

            legend = page.locator("#tokens .tok-legend .chip[data-drafter]")
            import app

            names = app.get_bundle("offline").drafter_names
            expect(legend).to_have_count(len(names))
            assert legend.all_inner_texts() == names
            backgrounds = page.eval_on_selector_all(
                "#tokens .tok.acc", "els => els.map(e => [e.dataset.drafter, getComputedStyle(e).backgroundColor])")
            assert backgrounds and all(bg not in ("rgba(0, 0, 0, 0)", "transparent") for _, bg in backgrounds)
            per_drafter = {d: bg for d, bg in backgrounds}
            assert len(set(per_drafter.values())) == len(per_drafter), "each drafter has its own colour"
            target_bg = page.eval_on_selector("#tokens .tok.tgt", "e => getComputedStyle(e).backgroundColor")
            assert target_bg in ("rgba(0, 0, 0, 0)", "transparent"), "target tokens are neutral"
            if page.locator("#tokens .tok.rej").count():
                deco = page.eval_on_selector("#tokens .tok.rej", "e => getComputedStyle(e).textDecorationLine")
                assert "line-through" in deco
                # the toggle hides rejected tokens without re-running
                page.get_by_label("Show rejected draft tokens").uncheck()
                expect(page.locator("#tokens .tok.rej").first).to_be_hidden()
                page.get_by_label("Show rejected draft tokens").check()
                expect(page.locator("#tokens .tok.rej").first).to_be_visible()

            # Both plots render as plotly SVG with their traces.
            for pid in ("arm-probabilities", "regret"):
                expect(page.locator(f"#{pid} .js-plotly-plot .main-svg").first).to_be_visible(timeout=30_000)
                assert page.locator(f"#{pid} .scatterlayer .trace").count() >= 1
            expect(page.locator("#regret")).to_contain_text("estimated")
            # The background measurement of the target alone turns into a measured speed-up.
            expect(page.locator("#stats")).to_contain_text("target alone:", timeout=120_000)
            expect(page.locator("#drafter-table")).to_contain_text("prompt-lookup")

            page.mouse.move(0, 0)
            page.wait_for_timeout(400)
            SCREENSHOT.parent.mkdir(exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
            assert SCREENSHOT.stat().st_size > 20_000
            assert not errors, errors
        finally:
            browser.close()
