"""Drafter lanes (metasd/decoding/lanes.py): checked against an independent computation on tiny models, the pulled
drafter's consistency with every round under every policy, run files (version 2, version 1 still loads),
the views, and `generate --json`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from metasd.bandits.policies import POLICIES
from metasd.core.runfile import VERSION, parse_run, run_document
from metasd.core.sampling import Sampling
from metasd.core.validation import InvalidInput
from metasd.decoding import lanes
from metasd.decoding.engine import run
from metasd.drafting.drafters import layer_skip_view
from metasd.ui import viz
from tests.tiny import tiny_bundle

ROOT = Path(__file__).resolve().parents[1]
# A prompt with repeats, so that prompt lookup has something to copy.
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 9, 10, 11, 1, 2, 3]


@pytest.fixture(scope="module")
def bundle():
    return tiny_bundle(vocab=32, scale=4.0)


def _answer(rounds) -> list[int]:
    return [t for ev in rounds for t in ev.emitted]


def _lookup(ids: list[int], end: int, max_n: int = 3) -> int:
    """Prompt lookup written out plainly: the token after the latest earlier occurrence of the longest
    suffix (3, 2, then 1 tokens) of ids[:end], or -1."""
    for n in range(min(max_n, end - 1), 0, -1):
        pat = ids[end - n : end]
        for i in range(end - n - 1, -1, -1):
            if ids[i : i + n] == pat:
                return ids[i + n]
    return -1


def _model_argmax(model, ids: list[int], start: int) -> list[int]:
    """A causal LM's own greedy prediction at every position from `start` on, in one plain forward pass."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids[:-1]])).logits[0]
    return logits[start - 1 :].argmax(-1).tolist()


def _recycling(bundle, rounds, prompt: list[int]) -> list[float]:
    """Token recycling simulated outside the engine: its table starts from the target's predictions after the
    prompt's tokens, is read before each round, and learns from the target's rows on every verified input
    (the last id and the whole draft, rejected tokens included), each from a fresh forward pass."""
    target = bundle.target
    table = np.full(32, -1)
    with torch.no_grad():
        rows = target(input_ids=torch.tensor([prompt[:-1]])).logits[0].argmax(-1).tolist()
    for t, nxt in list(zip(prompt[:-1], rows, strict=True))[-32:]:
        table[t] = nxt
    ids, out = list(prompt), []
    for ev in rounds:
        out.extend(float(table[p] == t) for p, t in zip([ids[-1], *ev.emitted[:-1]], ev.emitted, strict=True))
        fed = [ids[-1], *ev.draft]
        with torch.no_grad():
            rows = target(input_ids=torch.tensor([ids[:-1] + fed])).logits[0, len(ids) - 1 :].argmax(-1).tolist()
        for t, nxt in zip(fed, rows, strict=True):
            table[t] = nxt
        ids.extend(ev.emitted)
    return out


def test_lanes_equal_an_independent_computation(bundle):
    names = bundle.drafter_names
    rounds, s = run(bundle, PROMPT, drafters=names, policy="round-robin", max_new_tokens=40)
    got, _ = lanes.lanes_for(bundle, PROMPT, rounds, s.config)
    answer = _answer(rounds)
    ids = PROMPT + answer
    assert set(got) == set(names) and all(len(v) == len(answer) for v in got.values())
    want = {
        "prompt-lookup": [float(_lookup(ids, len(PROMPT) + j) == t) for j, t in enumerate(answer)],
        "tiny-lm": [float(p == t) for p, t in zip(_model_argmax(bundle.models["tiny-lm"], ids, len(PROMPT)), answer,
                                                   strict=True)],
        "layer-skip": [float(p == t) for p, t in zip(_model_argmax(layer_skip_view(bundle.target, [0]), ids, len(PROMPT)),
                                                      answer, strict=True)],
        "token-recycling": _recycling(bundle, rounds, PROMPT),
    }
    for name, lane in want.items():
        assert got[name] == lane, name
    assert any(0 < lanes.share(v) < 1 for v in got.values()), "a test lane should be neither all 0 nor all 1"


def test_sampled_lanes_are_sum_min_p_q(bundle):
    rounds, s = run(bundle, PROMPT, drafters=["tiny-lm", "prompt-lookup"], policy="metasd-ucb", max_new_tokens=24,
                    temperature=1.0, seed=3)
    got, _ = lanes.lanes_for(bundle, PROMPT, rounds, s.config)
    ids = PROMPT + _answer(rounds)
    with torch.no_grad():
        p = torch.softmax(bundle.target(input_ids=torch.tensor([ids[:-1]])).logits[0, len(PROMPT) - 1 :], -1)
        q = torch.softmax(bundle.models["tiny-lm"](input_ids=torch.tensor([ids[:-1]])).logits[0, len(PROMPT) - 1 :], -1)
    want = torch.minimum(p, q).sum(-1).tolist()
    assert got["tiny-lm"] == pytest.approx(want, abs=1e-4)
    # prompt lookup's lane is p(x) of the token it would copy, 0 where it has none
    answer = _answer(rounds)
    pl = [float(p[j, x]) if (x := _lookup(ids, len(PROMPT) + j)) >= 0 else 0.0 for j in range(len(answer))]
    assert got["prompt-lookup"] == pytest.approx(pl, abs=1e-4)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_pulled_drafter_agrees_with_every_round(policy):
    b = tiny_bundle(vocab=32, scale=4.0, white_box=True)
    names = b.drafter_names
    rounds, s = run(b, PROMPT, drafters=names, policy=policy, max_new_tokens=40, seed=1)
    live, _ = lanes.lanes_for(b, PROMPT, rounds, s.config)
    # Every cell teacher-forced after the answer (none live): the drafters' `predict` against their `propose`.
    posthoc = lanes.fill(b, PROMPT, rounds, names, Sampling(0.0, 1.0, 0), cells={d: [None] * s.new_tokens for d in names})
    for d in names:
        assert lanes.agrees_with_rounds(live[d], rounds, d) == [], (policy, d)
        assert lanes.agrees_with_rounds(posthoc[d], rounds, d) == [], (policy, d, "predict disagrees with propose")
        assert all(x in (0.0, 1.0) for x in live[d])
    assert posthoc == live, "the live cells and the after-the-answer ones must be the same numbers"


def test_consistency_check_can_fail(bundle):
    rounds, s = run(bundle, PROMPT, drafters=["prompt-lookup", "tiny-lm"], policy="round-robin", max_new_tokens=24)
    got, _ = lanes.lanes_for(bundle, PROMPT, rounds, s.config)
    pulled = next(ev for ev in rounds if ev.accepted)
    flipped = [1.0 - x for x in got[pulled.drafter]]
    assert lanes.agrees_with_rounds(flipped, rounds, pulled.drafter)


def test_run_files_carry_lanes_and_version_1_still_loads(bundle):
    rounds, s = run(bundle, PROMPT, max_new_tokens=16)
    got, _ = lanes.lanes_for(bundle, PROMPT, rounds, s.config)
    doc = run_document("", rounds, s, preset="tiny", drafters=list(rounds[0].probabilities), lanes=got)
    assert doc["version"] == VERSION >= 2 and "scores" not in doc["rounds"][0]
    back = parse_run(json.dumps(doc))
    assert set(back.lanes) == set(got)
    for d, v in got.items():
        assert back.lanes[d] == pytest.approx(v, abs=1e-4)
    old = {k: v for k, v in doc.items() if k != "lanes"} | {"version": 1}
    assert parse_run(json.dumps(old)).lanes == {}
    for bad in ({"prompt-lookup": [0.5]}, {"prompt-lookup": [2.0] * s.new_tokens}, ["x"]):
        with pytest.raises(InvalidInput):
            parse_run(json.dumps(doc | {"lanes": bad}))


def test_gallery_runs_carry_lanes():
    files = sorted((ROOT / "assets" / "runs").glob("*.json"))
    assert files
    for f in files:
        r = parse_run(f.read_bytes())
        n = sum(len(ev.emitted) for ev in r.rounds)
        assert set(r.lanes) == set(r.drafters) and all(len(v) == n for v in r.lanes.values()), f.name


def test_lanes_view(bundle):
    rounds, s = run(bundle, PROMPT, max_new_tokens=16)
    got, _ = lanes.lanes_for(bundle, PROMPT, rounds, s.config)
    colors = viz.drafter_colors(bundle.drafter_names)
    html = viz.lanes_html(rounds, got, colors)
    assert html.count("<tr data-drafter=") == len(got)
    for d in got:
        assert f'<tr data-drafter="{d}"' in html and f">{d} <span" in html  # each lane names its drafter
    assert html.count("<td ") == len(got) * s.new_tokens
    assert html.count('class="b') >= len(got) and 'class=""' not in html  # round boundaries; no empty classes
    assert " p\"" in html or 'class="p"' in html  # the pulled drafter
    # Every cell labelled; one tab stop for the scroll region and one for the cells (the arrow keys move inside).
    assert html.count("aria-label=") == len(got) * s.new_tokens + 1 and html.count('tabindex="0"') == 2
    assert viz.lanes_html(rounds[:1], got, colors).count("<td ") == len(got) * len(rounds[0].emitted)
    assert "no lanes" in viz.lanes_html([], {}, {}, empty="no lanes")
    grid = viz.lane_grid([{"question_id": "q", "category": "math", "lanes": got}], list(got))
    assert list(grid.columns) == ["prompt", "task", *got] and grid.iloc[0, 2].endswith(tuple(viz._THIRDS))


@pytest.mark.offline_model
def test_generate_json_writes_lanes(offline):  # the fixture converts the offline model once, if it is not yet
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run([sys.executable, "-m", "metasd", "generate", "What is 12 times 7?", "--max-new-tokens", "12",
                        "--json"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout)
    n = len(doc["token_ids"])
    assert doc["version"] >= 2 and set(doc["lanes"]) == set(doc["drafters"])
    assert all(len(v) == n and all(0 <= x <= 1 for x in v) for v in doc["lanes"].values())


def test_after_the_answer_equals_full_information_with_windowed_drafters():
    """With full-information feedback the engine scores every drafter live; recomputing every cell after the
    answer (windowed model drafter and white-box head, whose context is cut) gives the same lanes."""
    b = tiny_bundle(vocab=32, scale=4.0, white_box=True, window=6, head_window=6)
    names = b.drafter_names
    rounds, s = run(b, PROMPT * 2, drafters=names, policy="hedge", max_new_tokens=40, seed=2)
    live = lanes.live_cells(rounds, names)
    posthoc = lanes.fill(b, PROMPT * 2, rounds, names, Sampling(0.0, 1.0, 0),
                         cells={d: [None] * s.new_tokens for d in names})
    for d in names:
        pairs = [(x, y) for x, y in zip(live[d], posthoc[d], strict=True) if x is not None]
        assert len(pairs) > s.new_tokens // 2 and all(x == y for x, y in pairs), d
