"""metasd.ui.viz (events -> HTML, figures, tables) and metasd.bandits.playground, without a browser."""

from __future__ import annotations

import io
import json
import re
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest

from metasd.bandits.playground import SynthDrafter, compare, expected_speedup, expected_tokens, simulate
from metasd.core.events import RoundEvent
from metasd.core.validation import first_per_category, parse_prompt_set
from metasd.decoding.engine import run
from metasd.ui import viz
from tests.tiny import tiny_bundle

PROMPT = [3, 7, 1, 4, 9, 3, 7, 1, 4, 9, 3, 7, 2, 5]


@pytest.fixture(scope="module")
def bundle():
    return tiny_bundle()


@pytest.fixture(scope="module")
def generation(bundle):
    return run(bundle, PROMPT, chat_template=False, max_new_tokens=40, policy="round-robin")


@pytest.fixture(scope="module")
def colors(bundle):
    return viz.drafter_colors(bundle.drafter_names)


class Spans(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.spans: list[dict] = []
        self._cur: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "span" and (a.get("class") or "").startswith("tok "):
            self._cur = {"kind": a["class"].split()[1], "drafter": a.get("data-drafter"), "style": a.get("style") or "",
                         "title": a.get("title") or "", "text": ""}
            self.spans.append(self._cur)

    def handle_endtag(self, tag):
        if tag == "span":
            self._cur = None

    def handle_data(self, data):
        if self._cur is not None:
            self._cur["text"] += data


def spans(html: str) -> list[dict]:
    p = Spans()
    p.feed(html)
    return p.spans


def _event(**kw) -> RoundEvent:
    base = dict(round=1, drafter="prompt-lookup", draft=(5, 6, 7), accepted=1, emitted=(5, 9), target_token=9,
                bonus=False, p_draft=(0.9, 0.1, 0.5), q_draft=(1.0, 1.0, 1.0), accept_prob=(0.9, 0.1, 0.5), reward=0.5,
                rewards={"prompt-lookup": 0.5, "token-recycling": None},
                probabilities={"prompt-lookup": 1.0, "token-recycling": 0.0},
                regret=0.0, regret_measured=False, draft_ms=1.0, verify_ms=2.0, overhead_ms=0.1, new_tokens=2,
                emitted_text=("<b>&amp;", ' "x"'), draft_text=("<b>&amp;", "<script>", "\n"))
    base.update(kw)
    return RoundEvent(**base)


def test_token_html_colours_each_accepted_token_by_its_drafter(generation, colors):
    rounds, _ = generation
    html = viz.token_html(rounds, colors)
    got = spans(html)
    acc = [s for s in got if s["kind"] == "acc"]
    assert acc, "round-robin over four drafters on a repetitive prompt accepts some drafts"
    for s in acc:
        assert colors[s["drafter"]] in s["style"]
    # every drafter that got a token accepted shows its own colour, and the colours differ
    used = {s["drafter"] for s in acc}
    assert len({colors[d] for d in used}) == len(used)
    # the target's own tokens are neutral: no drafter colour
    for s in got:
        if s["kind"] == "tgt":
            assert s["drafter"] is None and not any(c in s["style"] for c in colors.values())
    # the shown output (accepted + target tokens) is exactly the engine's output, in order
    assert "".join(s["text"] for s in got if s["kind"] != "rej") == "".join(f"<{t}>" for ev in rounds for t in ev.emitted)
    assert viz.output_text(rounds) == "".join(s["text"] for s in got if s["kind"] != "rej")
    # the legend names each drafter with its colour
    for name, c in colors.items():
        assert f'data-drafter="{name}"' in html.split('<div class="tok-stream"')[0] and c in html


def test_rejected_drafts_are_grouped_in_place(generation, colors):
    rounds, _ = generation
    html = viz.token_html(rounds, colors)
    got = spans(html)
    n_rejected = sum(len(ev.draft) - ev.accepted for ev in rounds)
    rej = [s for s in got if s["kind"] == "rej"]
    assert n_rejected > 0 and len(rej) == n_rejected
    for s in rej:
        # struck through by the page's CSS (class rej; the browser test checks the computed style), in its colour
        assert colors[s["drafter"]] in s["style"]
    # in place: each round reads accepted..., rejected..., then the target's token
    i = 0
    for ev in rounds:
        want = ["acc"] * ev.accepted + ["rej"] * (len(ev.draft) - ev.accepted) + ["tgt"]
        kinds = [s["kind"] for s in got[i : i + len(want)]]
        assert kinds == want
        i += len(kinds)
        # A round's rejected pieces are one group: the page's mark (with their count) and the draft on hover.
        group = [s for s in viz.round_spans(ev, colors) if s.startswith('<span class="rejs"')]
        if len(ev.draft) > ev.accepted:
            assert len(group) == 1 and f'data-n="{len(ev.draft) - ev.accepted}"' in group[0]
            assert "did not keep" in group[0]
        else:
            assert group == []
    hidden = spans(viz.token_html(rounds, colors, show_rejected=False))
    assert [s for s in hidden if s["kind"] == "rej"] == []
    assert [s["text"] for s in hidden] == [s["text"] for s in got if s["kind"] != "rej"]


def test_token_text_and_tooltips_are_html_escaped(colors):
    ev = _event()
    html = viz.token_html([ev], colors)
    assert "<script>" not in html and "<b>" not in html
    assert "&lt;script&gt;" in html and "&lt;b&gt;&amp;amp;" in html and "&quot;x&quot;" in html
    got = spans(html)
    assert [s["kind"] for s in got] == ["acc", "rej", "rej", "tgt"]
    assert got[0]["text"] == "<b>&amp;" and got[1]["text"] == "<script>" and got[3]["text"] == ' "x"'
    assert got[2]["text"] == "\u21b5"  # a rejected newline stays visible in place
    # hover: p, q and the acceptance probability where known
    assert "p = 0.900" in got[0]["title"] and "q = 1.000" in got[0]["title"]
    assert "accept prob = min(1, p/q) = 0.900" in got[0]["title"]
    assert "rejected" in got[1]["title"] and "p = 0.100" in got[1]["title"]
    assert "correction" in got[3]["title"]
    bonus = spans(viz.token_html([_event(accepted=3, emitted=(5, 6, 7, 8), bonus=True,
                                         emitted_text=("a", "b", "c", "d"))], colors))
    assert [s["kind"] for s in bonus] == ["acc", "acc", "acc", "tgt"] and "bonus" in bonus[-1]["title"]
    drafter_name = viz.legend_html({"<evil>": "#000000"})
    assert "<evil>" not in drafter_name and "&lt;evil&gt;" in drafter_name


def test_arm_probability_figure(generation, colors):
    rounds, _ = generation
    fig = viz.arm_probability_figure(rounds, colors)
    names = list(rounds[0].probabilities)
    stacked = [t for t in fig.data if t.stackgroup]
    assert [t.name for t in stacked] == names
    total = np.sum([np.asarray(t.y, dtype=float) for t in stacked], axis=0)
    assert np.allclose(total, 1.0)
    # rounds 1..N as x0/dx (no x array to stream)
    assert stacked[0].x0 == 1 and stacked[0].dx == 1 and [ev.round for ev in rounds] == list(range(1, len(rounds) + 1))
    pulled = [t for t in fig.data if not t.stackgroup]
    assert sum(len(t.x) for t in pulled) == len(rounds)
    for t in pulled:
        name = t.name.removeprefix("pulled ")
        assert t.dy == 0 and list(t.x) == [ev.round for ev in rounds if ev.drafter == name]
        assert t.marker.line.color == colors[name]
    rows = [t.y0 for t in pulled]
    assert sorted(rows) == list(range(len(names))) and rows == sorted(rows, reverse=True)  # one row per arm, in order
    assert fig.layout.margin.t <= 40 and fig.layout.height <= 320
    # light updates: the figure is re-sent every round, so no heavyweight named template
    assert len(fig.to_json()) < 1500 + 250 * len(rounds) * len(names)
    assert len(json.dumps(fig.layout.template.to_plotly_json())) < 1000


def test_regret_figure_is_labelled_measured_or_estimated(bundle):
    est, _ = run(bundle, PROMPT, chat_template=False, max_new_tokens=16)
    mea, _ = run(bundle, PROMPT, chat_template=False, max_new_tokens=16, full_info=True)
    f1, f2 = viz.regret_figure(est), viz.regret_figure(mea)
    assert "estimated" in f1.data[0].name and "estimated" in f1.layout.title.text
    assert "measured" in f2.data[0].name and "measured" in f2.layout.title.text
    assert list(f2.data[0].y) == [ev.regret for ev in mea]
    assert viz.regret_figure([]).data[0].y == () and f2.data[0].x0 == 1


def test_drafter_table_and_live_stats(generation):
    rounds, summary = generation
    df = viz.drafter_table(rounds, list(rounds[0].probabilities))
    assert isinstance(df, pd.DataFrame)
    assert list(df.columns) == ["drafter", "pulls", "acceptance rate", "mean reward", "tokens / call", "time share"]
    assert df["pulls"].sum() == len(rounds) == summary.target_calls
    assert df["time share"].sum() == pytest.approx(1.0, abs=0.01)
    by_name = {d.name: d for d in summary.drafters}
    for row in df.to_dict("records"):
        d = by_name[row["drafter"]]
        assert row["pulls"] == d.pulls
        if d.drafted:
            assert row["acceptance rate"] == pytest.approx(d.acceptance_rate, abs=1e-3)
            assert row["mean reward"] == pytest.approx(d.mean_reward, abs=1e-3)
    s = viz.live_stats(rounds, 2.0)
    assert s["new_tokens"] == summary.new_tokens and s["tokens_per_s"] == pytest.approx(summary.new_tokens / 2.0)
    assert s["target_calls"] == len(rounds) and s["mean_accepted"] == pytest.approx(summary.mean_accepted)
    assert s["speedup"] is None and "\u2014" in viz.stats_html(s)  # never invented without a baseline
    s2 = viz.live_stats(rounds, 2.0, baseline_tps=s["tokens_per_s"] / 2)
    assert s2["speedup"] == pytest.approx(2.0) and "2.00\u00d7" in viz.stats_html(s2)


def test_round_log_csv_and_json(generation):
    rounds, summary = generation
    df = viz.rounds_frame(rounds)
    back = pd.read_csv(io.StringIO(df.to_csv(index=False)))
    assert len(back) == len(rounds) and list(back["round"]) == [ev.round for ev in rounds]
    assert list(back["accepted"]) == [ev.accepted for ev in rounds]
    assert [f"prob[{n}]" for n in rounds[0].probabilities] == [c for c in back.columns if c.startswith("prob[")]
    from metasd.core.runfile import run_document

    obj = json.loads(json.dumps(run_document("p", rounds, summary)))
    assert obj["token_ids"] == list(summary.token_ids) and len(obj["rounds"]) == len(rounds)
    assert obj["stats"]["target_calls"] == summary.target_calls


def test_compare_figures_and_prompt_sets():
    rows = []
    for cat in ("qa", "rag"):
        for m, acc, sp in (("single:a", 0.2, 0.9), ("single:b", 0.7, 1.4), ("metasd-ucb", 0.6, 1.3)):
            rows.append({"method": m, "category": cat, "acceptance_rate": acc + (0.1 if cat == "rag" else 0), "speedup": sp})
    df = pd.DataFrame(rows)
    heat = viz.acceptance_heatmap(df)
    assert list(heat.data[0].y) == ["a", "b"] and list(heat.data[0].x) == ["qa", "rag"]
    assert np.allclose(heat.data[0].z, [[0.2, 0.3], [0.7, 0.8]])
    df = pd.concat([df, pd.DataFrame([{"method": "target alone", "category": "qa", "speedup": 1.0}])])
    bars = viz.speedup_bars(df, {"a": "#111111", "b": "#222222"})
    assert {t.name for t in bars.data} == {"single:a", "single:b", "metasd-ucb"}  # the target alone is the line at 1
    by = {t.name: t for t in bars.data}
    assert by["single:a"].marker.color == "#111111" and by["single:b"].marker.color == "#222222"
    assert list(by["single:b"].y) == pytest.approx([1.4, 1.4]) and list(by["single:b"].x) == ["qa", "rag"]
    items = parse_prompt_set('{"question_id": 1, "category": "qa", "turns": ["Why?", "And?"]}\n\n'
                             '{"question_id": 2, "category": "qa", "turns": ["How?"]}\n'
                             '{"question_id": 3, "category": "rag", "turns": ["Where?"]}\n', int_ids=True)
    assert [i["prompt"] for i in items] == ["Why?", "How?", "Where?"]
    assert [i["question_id"] for i in first_per_category(items, 1)] == [1, 3]
    with pytest.raises(ValueError, match="line 2"):
        parse_prompt_set('{"turns": ["ok"]}\n{"turns": []}\n')
    with pytest.raises(ValueError, match="not JSON"):
        parse_prompt_set("nope")


def test_examples_file_is_our_own_prompt_set():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "assets" / "examples.json").read_text(encoding="utf-8")
    items = json.loads(text)
    cats = {e["category"] for e in items}
    assert cats == {"translation", "summarization", "qa", "math", "rag", "code", "chat"}
    jsonl = "\n".join(json.dumps(e) for e in items)
    assert len(parse_prompt_set(jsonl)) == len(items)


# ------------------------------------------------------------------------------------------ playground


ARMS = [SynthDrafter("weak", 0.3, 0.0), SynthDrafter("good", 0.8, 0.0), SynthDrafter("ok", 0.6, 0.0)]


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_speedup(0.5, 2, 0.25) == pytest.approx(1.75 / 1.5)


def test_simulation_matches_the_formula_and_regret_is_monotone():
    r = simulate("single:good", ARMS, gamma=4, rounds=4000, seed=1)
    assert set(r.arms) == {1}
    assert r.tokens.mean() == pytest.approx(expected_tokens(0.8, 4), rel=0.05)
    assert np.allclose(r.regret, 0.0)
    w = simulate("single:weak", ARMS, gamma=4, rounds=100)
    assert w.regret[-1] == pytest.approx(100 * (expected_tokens(0.8, 4) - expected_tokens(0.3, 4)))
    u = simulate("uniform", ARMS, rounds=500)
    assert np.all(np.diff(u.regret) >= -1e-12) and u.probabilities.shape == (500, 3)
    assert np.allclose(u.probabilities.sum(axis=1), 1.0)


def test_bandits_find_the_best_drafter_and_beat_uniform():
    res = compare(["metasd-ucb", "hedge", "uniform"], ARMS, rounds=2000, seed=0)
    ucb, hedge, uni = res
    assert ucb.best == 1
    assert (ucb.arms[-500:] == 1).mean() > 0.9 and (hedge.arms[-500:] == 1).mean() > 0.9
    assert ucb.regret[-1] < 0.25 * uni.regret[-1] and hedge.regret[-1] < 0.25 * uni.regret[-1]


def test_cost_blind_reward_pays_for_an_expensive_drafter():
    arms = [SynthDrafter("cheap", 0.7, 0.0), SynthDrafter("pricey", 0.95, 0.6)]
    assert np.argmax([expected_speedup(a.acceptance, 4, a.cost) for a in arms]) == 0
    blind = simulate("metasd-ucb", arms, rounds=2000, reward="bd", seed=0)
    aware = simulate("metasd-ucb", arms, rounds=2000, reward="throughput", seed=0)
    # The cost-aware index keeps the paper's block-divergence reward and weighs it by cost instead.
    costed = simulate("metasd-ucb-cost", arms, rounds=2000, reward="bd", seed=0)
    assert (blind.arms[-500:] == 1).mean() > 0.9  # accuracy alone prefers the expensive drafter
    assert (aware.arms[-500:] == 0).mean() > 0.9 and (costed.arms[-500:] == 0).mean() > 0.9
    assert aware.regret[-1] < 0.2 * blind.regret[-1] and costed.regret[-1] < 0.2 * blind.regret[-1]


def test_playground_figures_and_table():
    res = compare(["metasd-ucb", "exp3"], ARMS, rounds=1000)
    colors = viz.drafter_colors([a.name for a in ARMS])
    probs = viz.playground_probability_figure(res, colors)
    assert len(probs.data) == 2 * len(ARMS) and sum(t.showlegend for t in probs.data) == len(ARMS)
    assert max(len(t.x) for t in probs.data) <= 400 + 1
    reg = viz.playground_regret_figure(res)
    assert [t.name for t in reg.data] == ["metasd-ucb", "exp3"]
    table = viz.playground_table(res)
    assert list(table["policy"]) == ["metasd-ucb", "exp3"]
    assert (table[[f"pulls {a.name}" for a in ARMS]].sum(axis=1) == 1000).all()
    with pytest.raises(ValueError, match="acceptance"):
        simulate("uniform", [SynthDrafter("x", 1.5)])


def test_viz_does_not_import_gradio():
    import metasd.bandits.playground
    import metasd.ui.viz

    for mod in (metasd.ui.viz, metasd.bandits.playground):
        src = open(mod.__file__, encoding="utf-8").read()
        assert not re.search(r"^\s*(import|from)\s+gradio", src, re.M)


def test_a_streams_views_are_sent_again_unchanged_but_its_table_skipped():
    """Frames after the first carry the last numbers, plain text, lanes and figures as they were (a value that
    diffs to nothing costs the server less than a skipped output); the table, which a browser redraws when it
    comes again, stays skipped, and so does the record."""
    from metasd.ui.frames import SKIP, Frame, Unchanged, plot

    fill = Unchanged()
    arms, regret = plot('{"data": [1]}'), plot('{"data": [2]}')
    first = fill(Frame(tokens="<p>a</p>", arms=arms, regret=regret, stats="round 1", table="df", text="a",
                       lanes=""))
    assert first.stats == "round 1" and first.lanes == ""
    second = fill(Frame(tokens="<p>ab</p>", text="ab"))
    assert (second.stats, second.text, second.lanes) == ("round 1", "ab", "")
    assert second.arms is arms and second.regret is regret
    assert second.table is SKIP and second.record is SKIP
    third = fill(Frame(tokens="<p>abc</p>", stats="round 3"))
    assert (third.stats, third.text) == ("round 3", "ab")
    assert Unchanged()(Frame(tokens="x")).stats is SKIP  # nothing sent yet: nothing to send again
    import gradio as gr

    # A skip made elsewhere (gr.skip() gives a new dict each call) is filled as well: left as a skip, gradio
    # would build a new HTML component for it on every frame of every stream.
    assert fill(Frame(tokens="<p>abcd</p>", lanes=gr.skip())).lanes == ""


def test_figure_json_drops_nones_in_nested_dicts_and_leaves_number_lists_as_they_are():
    from metasd.ui.viz import _without_none

    ys = [0.1, 0.2, None, 0.4]  # a gap in a line is plotly's own None: kept
    spec = {"data": [{"y": ys, "marker": {"color": None, "size": 3}}, [{"a": None, "b": [1, 2]}]],
            "layout": {"xaxis": {"range": None, "title": {"text": "round"}}}}
    out = _without_none(spec)
    assert out == {"data": [{"y": ys, "marker": {"size": 3}}, [{"b": [1, 2]}]],
                   "layout": {"xaxis": {"title": {"text": "round"}}}}
    assert out["data"][0]["y"] is ys  # a list of numbers is not walked (figures go out on every frame)


def test_every_drafter_of_a_preset_has_its_own_underline_and_the_stylesheet_draws_it():
    """The underline is the second channel besides colour: no two drafters of one preset may share it (with
    five looks, the offline page's default arms math-drafter and chat-drafter looked like prompt lookup and
    token recycling), and each look is a rule of the page's stylesheet."""
    import re

    from metasd.models.colors import UNDERLINES
    from metasd.models.presets import PRESETS
    from metasd.paths import ROOT

    css = (ROOT / "assets" / "style.css").read_text(encoding="utf-8")
    rules = dict(re.findall(r"\.u-([\w-]+) \{([^}]*)\}", css))
    assert set(UNDERLINES) <= set(rules), set(UNDERLINES) - set(rules)
    assert len({rules[u].strip() for u in UNDERLINES}) == len(UNDERLINES), "two looks draw the same line"
    for preset in PRESETS.values():
        colors = viz.drafter_colors(preset.drafter_names)
        looks = [viz.underline_of(colors, n) for n in preset.drafter_names]
        assert len(set(looks)) == len(looks), (preset.name, looks)
        assert len({(colors[n], u) for n, u in zip(preset.drafter_names, looks, strict=True)}) == len(looks)


def test_a_drafters_colour_is_its_own_in_every_view():
    """Colour comes from the name: a view showing a few drafters colours them as the full view does,
    no two drafters of any preset share a colour, and the CLI prints the page's colour."""
    from metasd.cli import _terminal
    from metasd.models.colors import PALETTE, canonical_names
    from metasd.models.presets import PRESETS

    full = viz.drafter_colors(PRESETS["offline"].drafter_names)
    assert len(set(full.values())) == len(full) == 10
    canon = canonical_names()
    assert len({viz.drafter_colors([n])[n] for n in canon}) == len(canon) <= len(PALETTE)
    for preset in PRESETS.values():
        names = preset.drafter_names
        colors = viz.drafter_colors(names)
        assert len(set(colors.values())) == len(names), preset.name
        # Any subset, in any order (Generate's chosen arms, Compare's methods, a run file's drafters).
        for k in range(1, len(names) + 1):
            sub = list(reversed(names[:k]))
            assert viz.drafter_colors(sub) == {n: colors[n] for n in sub}
    alone = viz.drafter_colors(["prompt-lookup"])["prompt-lookup"]
    assert alone == viz.drafter_colors(["qwen-0.5b", "prompt-lookup"])["prompt-lookup"]  # across presets too
    # Names no preset owns (plugins, tests) never take a colour of the others in their view, stably.
    mixed = ["prompt-lookup", "echo-last", "my-drafter", "tiny-lm", "token-recycling"]
    colors = viz.drafter_colors(mixed)
    assert len(set(colors.values())) == len(mixed)
    assert viz.drafter_colors(["tiny-lm", "my-drafter"], universe=mixed) == {n: colors[n] for n in ("tiny-lm", "my-drafter")}
    r, g, b = (int(full["retrieval"][i : i + 2], 16) for i in (1, 3, 5))
    assert _terminal(full["retrieval"]) == f"\033[38;2;{r};{g};{b}m"


def test_replay_colours_a_run_as_generate_does(tmp_path):
    """A run file written with other colours (an older build's) replays in the names' own colours."""
    from metasd.core.runfile import parse_run
    from metasd.paths import RUNS_DIR
    from metasd.ui.replay import _replay_setup

    doc = json.loads((RUNS_DIR / "ex-chat-1.json").read_text(encoding="utf-8"))
    doc["colors"] = {n: "#000000" for n in doc["colors"]}
    run = parse_run(json.dumps(doc).encode())
    view, _ = _replay_setup(run)
    names = list(view.colors)
    assert view.colors == viz.drafter_colors(names) and "#000000" not in view.colors.values()


def test_simulations_run_in_a_niced_process_of_their_own():
    """The playground's simulations never hold the server's interpreter lock nor compete with the model
    at its priority: they run in one spawned process at the lowest priority, and one that dies is replaced."""
    import os

    from metasd.ui.server import Simulator

    sim = Simulator()
    try:
        pid = sim.run(os.getpid)
        assert pid != os.getpid() and sim.run(os.nice, 0) == 19
        assert sim.run(os.getpid) == pid  # one process, reused
        with pytest.raises(Exception):  # noqa: B017  (BrokenProcessPool: the process was killed mid-call)
            sim.run(os._exit, 1)
        assert sim.run(os.getpid) not in (pid, os.getpid())  # a new one serves the next simulation
    finally:
        sim.close()
