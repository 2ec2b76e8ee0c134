"""The page in real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright), clicked as a
person clicks it: streaming and colours, Stop mid-answer, the projector layout, the keyboard,
accessibility (axe-core), honest input limits.

Also writes assets/screenshot.png, the README's screenshot (1280x720, a projector). Fails (never
skips) without Chromium.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.app_server import (
    app_url,  # noqa: F401  (fixture)
    page_server,
)

SERVER = page_server()  # this test process's server, shared with the app served in-process

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = Path(__file__).resolve().parents[1] / "assets" / "screenshot.png"
ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-quic"]
PROJECTOR = {"width": 1280, "height": 720}
LONG_PROMPT = "Write a long, detailed story about a lighthouse keeper and a storm, in many paragraphs."
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]

pytestmark = [pytest.mark.browser, pytest.mark.offline_model]


@pytest.fixture(scope="module")
def browser():
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: install Debian's chromium (make browser)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser, app_url):  # noqa: F811
    from playwright.sync_api import expect

    ctx = browser.new_context(viewport=PROJECTOR, device_scale_factor=1)
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(app_url, wait_until="domcontentloaded")
    expect(pg.locator("#run")).to_be_visible(timeout=60_000)
    pg.js_errors = errors
    yield pg
    ctx.close()


def set_max_new_tokens(page, n: int) -> None:
    box = page.locator("#max-new-tokens input[type=number]")
    box.fill(str(n))
    box.press("Enter")


def check_lanes(page, root: str, names: list[str], tokens: int | None = None) -> None:
    """Lanes under an answer: one row per drafter, each naming it, one cell per token; a cell's focus and hover
    give drafter, token and number; its fill height (the second channel) is its number."""
    rows = page.locator(f"{root} tr[data-drafter]")
    assert sorted(rows.evaluate_all("els => els.map(e => e.dataset.drafter)")) == sorted(names)
    for n in names:
        assert n in page.locator(f"{root} tr[data-drafter='{n}'] th").inner_text()
    cells = page.locator(f"{root} tr[data-drafter] td")
    if tokens is not None:
        assert cells.count() == len(names) * tokens
    assert page.locator(f"{root} td.p").count() >= 1, "the pulled drafter's cells are marked"
    full = page.locator(f"{root} td[style*='--v:1.000']")
    if full.count():  # a full cell is filled in its drafter's colour
        assert "gradient" in full.first.evaluate("e => getComputedStyle(e).backgroundImage")
    first = page.locator(f"{root} tr[data-drafter] td").first
    first.focus()
    tip = first.get_attribute("aria-label")
    assert re.search(r"token 1 .*: [01]\.\d\d", tip) and any(tip.startswith(n) for n in names), tip
    shown = page.evaluate(f"() => getComputedStyle(document.querySelector('{root} tr[data-drafter] td'), '::after').content")
    assert "token 1" in shown, shown
    # One tab stop for all the cells; the arrow keys walk them, the stop moving along with the focus.
    assert page.locator(f"{root} td[tabindex='0']").count() == 1
    if tokens is None or tokens > 1:
        page.keyboard.press("ArrowRight")
        assert "token 2 " in page.evaluate("() => document.activeElement.getAttribute('aria-label')")
    if len(names) > 1:
        page.keyboard.press("ArrowDown")
        label = page.evaluate("() => document.activeElement.getAttribute('aria-label')")
        second = page.locator(f"{root} tr[data-drafter]").nth(1).get_attribute("data-drafter")
        assert label.startswith(second), label
    assert page.locator(f"{root} td[tabindex='0']").count() == 1


def wait_idle(page, timeout_ms: int = 180_000) -> None:
    """The run and what follows it (logs, the target-alone measurement) are over: Run is enabled again
    and the stat cards say whether the speed-up was measured."""
    from playwright.sync_api import expect

    expect(page.locator("#run")).to_be_enabled(timeout=timeout_ms)
    expect(page.locator("#stats .card").last).not_to_contain_text("not measured yet", timeout=timeout_ms)


@pytest.mark.timeout(400)
def test_page_streams_coloured_tokens_and_plots(page):
    from playwright.sync_api import expect

    # Pick the first translation example from the list (each example is named by its task): it fills the prompt box.
    page.locator("#examples").get_by_text("Translation \u00b7 Translate into French", exact=False).first.click()
    expect(page.locator("#prompt textarea")).to_have_value(re.compile("Translate into French"), timeout=10_000)
    # At projector size the list sits below the fold (the click scrolled down to it, as a person does):
    # picking an example brings the prompt, Run and the answer's box back into view together.
    page.wait_for_function("""() => ['prompt', 'run', 'stop', 'tokens'].every(id => {
        const r = document.getElementById(id).getBoundingClientRect();
        return r.top >= 0 && r.bottom <= window.innerHeight; })""", timeout=5_000)

    # Count the DOM changes of the token view and of the arm plot while the answer streams.
    page.evaluate("""() => { window.changes = {};
        for (const id of ['tokens', 'arm-probabilities']) { window.changes[id] = 0;
            new MutationObserver(() => { window.changes[id] += 1; }).observe(document.getElementById(id),
                {subtree: true, childList: true, attributes: true, characterData: true}); } }""")
    page.locator("#run").click()
    # Run says at once that it runs; Stop is live only now.
    expect(page.locator("#run")).to_be_disabled(timeout=5_000)
    expect(page.locator("#stop")).to_be_enabled(timeout=5_000)
    # Tokens stream in, coloured by drafter; the run ends with a summary line.
    expect(page.locator("#tokens .tok.acc").first).to_be_visible(timeout=120_000)
    expect(page.locator("#tokens .tok-status")).to_contain_text("done", timeout=180_000)
    # Every frame carries the figures again (cheaper for the server than a skipped output), but the browser
    # redraws a plot only when its figure changed, at most every PLOT_INTERVAL_S: far fewer changes than the
    # token view's, which changes with every frame.
    changes = page.evaluate("() => window.changes")
    assert changes["arm-probabilities"] * 2 < changes["tokens"], changes
    # The drafter lanes follow the answer's end within 2 s: one row per drafter of the request, each naming it.
    expect(page.locator("#lanes tr[data-drafter]").first).to_be_visible(timeout=2_000)
    expect(page.locator("#stop")).to_be_disabled(timeout=10_000)

    legend = page.locator("#tokens .tok-legend .chip[data-drafter]")
    bundle = SERVER.presets.get("offline")
    names = [n for n in bundle.drafter_names if n in bundle.default_drafters]  # the request's arms, in colour order
    expect(legend).to_have_count(len(names))
    assert legend.evaluate_all("els => els.map(e => e.dataset.drafter)") == names
    from metasd.decoding.catalog import kind_by_name

    # each chip: a sample, the drafter's name and its kind (model-free, self, distilled, white-box, ...)
    assert [t.split()[-2:] for t in legend.all_inner_texts()] == [[n, kind_by_name(n)] for n in names]
    looks = page.eval_on_selector_all(
        "#tokens .tok.acc", "els => els.map(e => { const s = getComputedStyle(e); "
        "return [e.dataset.drafter, s.backgroundColor, s.textDecorationLine, "
        "[s.textDecorationStyle, s.textDecorationThickness, s.textUnderlineOffset].join(' ')]; })")
    assert looks and all(bg not in ("rgba(0, 0, 0, 0)", "transparent") for _, bg, _, _ in looks)
    assert all("underline" in line for _, _, line, _ in looks), "accepted tokens are underlined"
    per_drafter = {d: (bg, style) for d, bg, _, style in looks}
    assert len({bg for bg, _ in per_drafter.values()}) == len(per_drafter), "each drafter has its own colour"
    # ... and its own underline: style, thickness and offset (tests/test_viz.py checks every preset's drafters)
    assert len({st for _, st in per_drafter.values()}) == len(per_drafter), "... and its own underline"
    target_bg = page.eval_on_selector("#tokens .tok.tgt", "e => getComputedStyle(e).backgroundColor")
    assert target_bg in ("rgba(0, 0, 0, 0)", "transparent"), "target tokens are neutral"
    hover = page.eval_on_selector("#tokens .tok.acc", "e => e.title")
    who = hover.split(",")[0]
    assert who.split(" (")[0] in names and "p = " in hover, "the drafter's name and p, q on hover"
    assert who.endswith(f"({kind_by_name(who.split(' (')[0])})"), "... and its kind"
    if page.locator("#tokens .tok-flow .rejs").count():
        # By default a round's rejected draft is a mark between the tokens (words stay whole), the draft on hover.
        mark = page.locator("#tokens .tok-flow .rejs").first
        expect(mark).to_be_visible()
        expect(page.locator("#tokens .tok.rej").first).to_be_hidden()
        n = mark.get_attribute("data-n")
        assert page.evaluate("e => getComputedStyle(e, '::before').content", mark.element_handle()) == f'"\u2715{n}"'
        assert "did not keep" in mark.get_attribute("title")
        # One click shows them struck through in place, another hides them, without re-running.
        page.locator("#rejected-look").get_by_label("inline").check()
        expect(page.locator("#tokens .tok.rej").first).to_be_visible()
        deco = page.eval_on_selector("#tokens .tok.rej", "e => getComputedStyle(e).textDecorationLine")
        assert "line-through" in deco
        page.locator("#rejected-look").get_by_label("hidden").check()
        expect(page.locator("#tokens .tok-flow .rejs").first).to_be_hidden()
        page.locator("#rejected-look").get_by_label("marks").check()
        expect(page.locator("#tokens .tok-flow .rejs").first).to_be_visible()

    check_lanes(page, "#lanes", names, len(page.locator("#tokens .tok.acc, #tokens .tok.tgt").all()))
    # Both plots render as plotly SVG with their traces.
    for pid in ("arm-probabilities", "regret"):
        expect(page.locator(f"#{pid} .js-plotly-plot .main-svg").first).to_be_visible(timeout=30_000)
        assert page.locator(f"#{pid} .scatterlayer .trace").count() >= 1
    expect(page.locator("#regret")).to_contain_text("estimated")
    # The background measurement of the target alone turns into a measured speed-up.
    expect(page.locator("#stats")).to_contain_text("target alone:", timeout=120_000)
    expect(page.locator("#stats")).to_contain_text(re.compile(r"drew \d+ frames for \d+ rounds"))
    expect(page.locator("#drafter-table")).to_contain_text("prompt-lookup")
    # The answer as plain text, beside the coloured view.
    page.get_by_text("The answer as plain text").click()
    expect(page.locator("#answer-text textarea")).to_have_value(re.compile(r"\w{3,}"))
    page.get_by_text("The answer as plain text").click()

    wait_idle(page)
    page.mouse.move(0, 0)
    # What a projector shows (1280x720): the coloured answer, its numbers and the plots under them (the drafter
    # lanes follow below the plots).
    page.evaluate("""() => { const t = document.getElementById('tokens').getBoundingClientRect();
                              window.scrollTo(0, Math.max(0, window.scrollY + t.top - 8)); }""")
    page.wait_for_timeout(400)
    box = page.locator("#tokens").bounding_box()
    assert 0 <= box["y"] and box["y"] + min(box["height"], 200) < PROJECTOR["height"], box
    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT))
    assert SCREENSHOT.stat().st_size > 20_000
    assert not page.js_errors, page.js_errors


@pytest.mark.timeout(400)
def test_stop_by_mouse_mid_answer_keeps_the_answer_on_the_first_screen(page):
    from playwright.sync_api import expect

    page.locator("#prompt textarea").fill(LONG_PROMPT)
    set_max_new_tokens(page, 256)
    page.locator("#run").click()
    expect(page.locator("#tokens :is(.tok.acc, .tok.tgt)").first).to_be_visible(timeout=60_000)
    # The answer is on the first screen of a projector, without scrolling.
    box = page.locator("#tokens .tok-stream").bounding_box()
    assert box and box["y"] >= 0 and box["y"] + 40 <= PROJECTOR["height"], box
    assert page.evaluate("window.scrollY") == 0
    page.wait_for_timeout(1500)
    shown = page.locator("#tokens .tok").count()
    assert shown > 0 and not page.locator("#tokens .tok-status").count(), "still streaming when Stop is clicked"
    t0 = time.perf_counter()
    page.locator("#stop").click()  # a real mouse click: move, press, release
    expect(page.locator("#tokens .tok-status")).to_contain_text("stopped after", timeout=2_000)
    took = time.perf_counter() - t0
    print(f"\n[browser] Stop -> 'stopped' shown in {1000 * took:.0f} ms; {shown} spans before the click")
    # Everything shown so far stays: tokens, numbers, plots, table, and the downloads of the partial run.
    assert page.locator("#tokens .tok").count() >= shown
    n = int(re.search(r"stopped after (\d+) tokens", page.locator("#tokens .tok-status").inner_text()).group(1))
    assert 0 < n < 256
    expect(page.locator("#stats .card").first).to_contain_text(f"{n} tokens")
    assert page.locator("#arm-probabilities .scatterlayer .trace").count() >= 1
    expect(page.locator("#run")).to_be_enabled(timeout=10_000)
    expect(page.get_by_role("button", name="JSON")).to_be_enabled(timeout=10_000)
    wait_idle(page)
    page.wait_for_timeout(1000)
    assert page.locator("#tokens .tok-status").inner_text().startswith("stopped after"), "nothing reset the view"
    assert not page.js_errors, page.js_errors


@pytest.mark.timeout(300)
def test_keyboard_ctrl_enter_runs_and_escape_stops(page):
    from playwright.sync_api import expect

    page.locator("#prompt textarea").fill(LONG_PROMPT)
    set_max_new_tokens(page, 256)
    page.locator("#prompt textarea").press("Control+Enter")
    expect(page.locator("#tokens :is(.tok.acc, .tok.tgt)").first).to_be_visible(timeout=60_000)
    assert "Write a long" in page.locator("#prompt textarea").input_value() and \
        "\n" not in page.locator("#prompt textarea").input_value(), "Ctrl+Enter ran instead of adding a line"
    page.keyboard.press("Escape")
    expect(page.locator("#tokens .tok-status")).to_contain_text("stopped after", timeout=3_000)
    wait_idle(page)


@pytest.mark.timeout(200)
def test_overlong_prompt_gets_a_visible_notice(page):
    from playwright.sync_api import expect

    from metasd.core.validation import MAX_PROMPT_CHARS

    page.locator("#prompt textarea").fill("word " * 12_000)  # 60,000 characters
    assert len(page.locator("#prompt textarea").input_value()) == 60_000, "the box must not cut the prompt silently"
    page.locator("#run").click()
    notice = page.get_by_text(re.compile(f"the limit is {MAX_PROMPT_CHARS:,}"))
    expect(notice.first).to_be_visible(timeout=20_000)
    expect(page.locator("#run")).to_be_enabled(timeout=10_000)


@pytest.mark.timeout(400)
def test_no_serious_accessibility_findings_on_any_tab(page):
    from axe_playwright_python.sync_playwright import Axe
    from playwright.sync_api import expect

    axe = Axe()

    def serious() -> list[str]:
        res = axe.run(page, options={"runOnly": {"type": "tag", "values": AXE_TAGS}})
        return [f"{v['id']}: {n['target']} {(n.get('any') or [{}])[0].get('message', '')}"
                for v in res.response["violations"] if v["impact"] in ("serious", "critical") for n in v["nodes"]]

    findings: dict[str, list[str]] = {}
    # Generate, with an answer on it (coloured tokens, struck-through rejects, the stat cards).
    set_max_new_tokens(page, 32)
    page.locator("#run").click()
    expect(page.locator("#tokens .tok-status")).to_be_visible(timeout=120_000)
    wait_idle(page)
    findings["Generate"] = serious()
    expect(page.locator("#lanes tr[data-drafter]").first).to_be_visible(timeout=10_000)
    for tab in ("Compare", "Replay", "Bandit playground"):
        page.get_by_role("tab", name=tab, exact=True).click()
        page.wait_for_timeout(2500)
        if tab == "Replay":  # a replayed run, with its lanes
            page.locator("#replay-speed input[type=number]").fill("64")
            page.locator("#replay-speed input[type=number]").press("Enter")
            page.locator("#replay-play").click()
            expect(page.locator("#replay-tokens .tok-status")).to_contain_text("done", timeout=60_000)
            expect(page.locator("#replay-lanes tr[data-drafter]").first).to_be_visible(timeout=10_000)
        findings[tab] = serious()
    assert not any(findings.values()), findings


@pytest.mark.timeout(600)
def test_compare_cancel_and_generate_served_in_between(browser, app_url):  # noqa: F811
    """A prompt set on Compare shares the model: another page's Generate run is served between its steps,
    and Cancel ends the set within one step, keeping the results so far."""
    from playwright.sync_api import expect

    ctx_a = browser.new_context(viewport=PROJECTOR)
    ctx_b = browser.new_context(viewport=PROJECTOR)
    try:
        a, b = ctx_a.new_page(), ctx_b.new_page()
        for pg in (a, b):
            pg.goto(app_url, wait_until="domcontentloaded")
            expect(pg.locator("#run")).to_be_visible(timeout=60_000)
        a.get_by_role("tab", name="Compare", exact=True).click()
        box = a.locator("#compare-max-new-tokens input[type=number]")
        box.fill("16")
        box.press("Enter")
        a.locator("#compare-run").click()
        expect(a.get_by_text(re.compile(r"about \d+ s left")).first).to_be_visible(timeout=60_000)

        # Meanwhile, another user generates: served between the Compare run's steps, not after the whole set.
        set_max_new_tokens(b, 16)
        t0 = time.perf_counter()
        b.locator("#run").click()
        expect(b.locator("#tokens .tok-status")).to_contain_text("done", timeout=90_000)
        served = time.perf_counter() - t0
        expect(a.get_by_text(re.compile(r"about \d+ s left")).first).to_be_visible(timeout=10_000)  # still running

        t1 = time.perf_counter()
        a.locator("#compare-cancel").click()
        expect(a.get_by_text(re.compile(r"Cancelled")).first).to_be_visible(timeout=60_000)
        ended = time.perf_counter() - t1
        print(f"\n[browser] Generate served {served:.1f} s after Run during a Compare set; Cancel ended it in {ended:.1f} s")
        expect(a.get_by_text(re.compile(r"about \d+ s left"))).to_have_count(0, timeout=10_000)
    finally:
        ctx_a.close()
        ctx_b.close()


@pytest.mark.timeout(400)
def test_wide_screen_shows_answer_and_plots_and_a_phone_scrolls_to_the_answer(browser, app_url):  # noqa: F811
    from playwright.sync_api import expect

    for viewport, check in (({"width": 1280, "height": 720}, "laptop"), ({"width": 1920, "height": 1080}, "plots"),
                            ({"width": 390, "height": 844}, "scroll")):
        ctx = browser.new_context(viewport=viewport)
        try:
            pg = ctx.new_page()
            pg.goto(app_url, wait_until="domcontentloaded")
            expect(pg.locator("#run")).to_be_visible(timeout=60_000)
            set_max_new_tokens(pg, 24)
            pg.locator("#run").click()
            expect(pg.locator("#tokens :is(.tok.acc, .tok.tgt)").first).to_be_visible(timeout=60_000)
            pg.wait_for_timeout(800)  # the smooth scroll on a phone
            boxes = {i: pg.locator(f"#{i}").bounding_box() for i in ("tokens", "arm-probabilities", "regret")}
            top = boxes["tokens"]["y"]
            assert 0 <= top < viewport["height"] / 2, (viewport, boxes)  # the answer is where the eye is
            if check == "plots":  # answer and both plots on one 1920x1080 screen
                for i in ("arm-probabilities", "regret"):
                    assert boxes[i]["y"] + boxes[i]["height"] <= viewport["height"], (i, boxes)
            elif check == "scroll":
                assert pg.evaluate("window.scrollY") > 0, "the phone page scrolled the answer into view"
            expect(pg.locator("#run")).to_be_enabled(timeout=120_000)
            if check == "laptop":  # after the run: the answer, the numbers and the arm plot's top on the first screen
                wait_idle(pg)
                pg.evaluate("window.scrollTo(0, 0)")
                stats, arm = (pg.locator(f"#{i}").bounding_box() for i in ("stats", "arm-probabilities"))
                assert stats["y"] + stats["height"] <= viewport["height"], stats
                assert arm["y"] + 40 <= viewport["height"], arm  # its title and top edge, not just a pixel
            if check == "plots":  # the lanes arrive after the answer: their first row on the first screen
                expect(pg.locator("#lanes tr[data-drafter]").first).to_be_visible(timeout=120_000)
                pg.evaluate("window.scrollTo(0, 0)")
                row = pg.locator("#lanes tr[data-drafter]").first.bounding_box()
                assert row["y"] + row["height"] <= viewport["height"], row
                width = pg.locator("#answer").bounding_box()["width"] + pg.locator("#controls").bounding_box()["width"]
                assert width >= 0.85 * viewport["width"], width  # the page uses the width
        finally:
            ctx.close()


@pytest.mark.timeout(300)
def test_a_link_opens_a_recorded_run_and_replays_it(browser, app_url):  # noqa: F811
    from playwright.sync_api import expect

    ctx = browser.new_context(viewport=PROJECTOR)
    try:
        pg = ctx.new_page()
        pg.goto(app_url + "?run=ex-translation-1", wait_until="domcontentloaded")
        expect(pg.get_by_role("tab", name="Replay", exact=True)).to_have_attribute("aria-selected", "true", timeout=60_000)
        expect(pg.locator("#replay-run input")).to_have_value(re.compile("ex-translation-1"))
        pg.locator("#replay-speed input[type=number]").fill("16")
        pg.locator("#replay-speed input[type=number]").press("Enter")
        pg.locator("#replay-play").click()
        expect(pg.locator("#replay-tokens :is(.tok.acc, .tok.tgt)").first).to_be_visible(timeout=30_000)
        expect(pg.locator("#replay-tokens .tok-status")).to_contain_text("done", timeout=60_000)
        expect(pg.locator("#replay-stats")).to_contain_text("recorded on the offline preset")
        done = pg.locator("#replay-tokens .tok").count()
        # step back to round 1 with the slider's number box, as a person types it
        box = pg.locator("#replay-round input[type=number]")
        expect(box).not_to_have_value("0", timeout=10_000)
        box.fill("1")
        box.press("Enter")
        expect(pg.locator("#replay-tokens .tok-status")).to_contain_text("round 1 of", timeout=20_000)
        assert pg.locator("#replay-tokens .tok").count() < done
    finally:
        ctx.close()


@pytest.mark.timeout(600)
def legend_colours(page, root: str) -> dict[str, str]:
    """Each drafter's colour as a view's legend draws it (the swatch's computed underline colour)."""
    return page.eval_on_selector_all(
        f"{root} .tok-legend .chip[data-drafter]",
        "els => Object.fromEntries(els.map(e => [e.dataset.drafter, "
        "getComputedStyle(e.querySelector('.swatch')).textDecorationColor]))")


def _rgb(hex_color: str) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def test_a_replayed_gallery_run_and_a_compare_grid_cell_show_lanes(page):
    """A gallery run replays with its lanes; Compare's prompt set fills the lanes grid, and a click on one of
    its cells opens that prompt's run in Replay, lanes and all. Every drafter wears one colour in Generate,
    Replay and Compare's bars, and no two share one."""
    import json

    from playwright.sync_api import expect

    generate = legend_colours(page, "#tokens")
    assert len(generate) >= 3 and len(set(generate.values())) == len(generate), generate

    page.get_by_role("tab", name="Replay", exact=True).click()
    # Its empty view names its own button (Play, not Run).
    expect(page.locator("#replay-tokens .tok-flow")).to_have_attribute("data-empty", re.compile("press Play"))
    page.locator("#replay-speed input[type=number]").fill("64")
    page.locator("#replay-speed input[type=number]").press("Enter")
    page.locator("#replay-play").click()
    expect(page.locator("#replay-tokens .tok-status")).to_contain_text("done", timeout=60_000)
    name = page.locator("#replay-run input").input_value()
    doc = json.loads((SCREENSHOT.parent / "runs" / f"{re.search(r'ex-[a-z]+-[0-9]+', name).group(0)}.json").read_text())
    check_lanes(page, "#replay-lanes", list(doc["lanes"]), len(doc["token_ids"]))
    replay = legend_colours(page, "#replay-tokens")
    assert len(set(replay.values())) == len(replay) and set(replay) & set(generate), (replay, generate)
    assert all(replay[n] == generate[n] for n in set(replay) & set(generate)), (replay, generate)

    page.get_by_role("tab", name="Compare", exact=True).click()
    expect(page.locator("#compare-run")).to_be_visible()
    head = page.locator("table").first.locator("th").all_inner_texts()
    assert not any(h.strip() in ("1", "2", "3") for h in head), head  # the empty table names its columns
    box = page.locator("#compare-max-new-tokens input[type=number]")
    box.fill("8")
    box.press("Enter")
    page.locator("#compare-run").click()
    grid = page.locator("#lane-grid")
    cell = grid.get_by_role("gridcell", name=re.compile(r"^\d+%"))  # a drafter's cell, not the progress overlay
    expect(cell.first).to_be_visible(timeout=300_000)  # the first prompt's row
    page.locator("#compare-cancel").click()
    expect(page.get_by_text(re.compile(r"Cancelled")).first).to_be_visible(timeout=120_000)
    expect(page.locator("#compare-run")).to_be_enabled(timeout=60_000)
    bars = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].flatMap(g => (g.data || [])"
                         ".filter(t => t.type === 'bar').map(t => [t.name, t.marker.color, (t.text || [])[0]]))")
    singles = {name.split(":", 1)[1]: c for name, c, _ in bars if name.startswith("single:")}
    assert singles and all(_rgb(c) == generate[n] for n, c in singles.items() if n in generate), (singles, generate)
    assert len(set(singles.values())) == len(singles)
    assert all(label for _, _, label in bars), bars  # every bar names its method, not colour alone
    cell.first.click()
    expect(page.get_by_role("tab", name="Replay", exact=True)).to_have_attribute("aria-selected", "true", timeout=20_000)
    expect(page.locator("#replay-lanes tr[data-drafter]").first).to_be_visible(timeout=20_000)
    assert page.locator("#replay-lanes tr[data-drafter]").count() >= 2
    expect(page.locator("#replay-tokens .tok-status")).to_contain_text("done", timeout=10_000)
    assert not page.js_errors, page.js_errors
