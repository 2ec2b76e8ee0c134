"""Run files and replays: one format for the CLI's --json, the page's download and the gallery; loading
it checks everything and executes nothing; a replay ends on exactly the token view the live run ended on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from metasd.core.engine import run
from metasd.core.runfile import FORMAT, MAX_BYTES, parse_run, run_document
from metasd.core.validation import InvalidInput
from metasd.ui import viz
from tests.tiny import tiny_bundle

ROOT = Path(__file__).resolve().parent.parent
PROMPT_IDS = [3, 7, 1, 4, 9, 3, 7, 1, 4, 9, 3, 7, 2, 5]


@pytest.fixture(scope="module")
def tiny_run():
    bundle = tiny_bundle()
    rounds, summary = run(bundle, PROMPT_IDS, chat_template=False, max_new_tokens=40, policy="round-robin",
                          full_info=True)
    doc = run_document("ids", rounds, summary, preset="tiny", drafters=bundle.drafter_names,
                       colors=viz.drafter_colors(bundle.drafter_names), settings=summary.config)
    return rounds, summary, doc


def test_a_run_file_round_trips_exactly(tiny_run):
    rounds, summary, doc = tiny_run
    back = parse_run(json.dumps(doc))
    assert back.rounds == rounds  # every field of every round, floats included
    assert back.summary.token_ids == summary.token_ids and back.summary.stop_reason == summary.stop_reason
    assert back.summary.stats_json() == summary.stats_json()
    assert back.colors == viz.drafter_colors(tiny_bundle().drafter_names) and back.preset == "tiny"
    # the generate --json contract, extended, never narrowed
    assert {"prompt", "text", "token_ids", "rounds", "stats", "config"} <= set(doc) and doc["format"] == FORMAT


@pytest.mark.parametrize("mutate, message", [
    (lambda d: "not json {", "not JSON"),
    (lambda d: b"\xff\xfe", "not UTF-8"),
    (lambda d: [1, 2], "JSON object"),
    (lambda d: {**d, "format": "something-else"}, "not a MetaSD run file"),
    (lambda d: {**d, "version": 99}, "newer than this app reads"),
    (lambda d: {**d, "rounds": []}, "no rounds"),
    (lambda d: {**d, "rounds": [{"round": 1}]}, "round 1 of the run file lacks"),
    (lambda d: {**d, "rounds": [{**d["rounds"][0], "accepted": 99}]}, "within the draft"),
    (lambda d: {**d, "rounds": [{**d["rounds"][0], "reward": "NaN"}]}, "must be a number"),
    (lambda d: {**d, "colors": {"prompt-lookup": '#"><b>'}}, "#rrggbb"),
    (lambda d: {**d, "stats": {"new_tokens": 1}}, "stats of the run file"),
    (lambda d: "x" * (MAX_BYTES + 1), "the limit is"),
])
def test_bad_run_files_get_one_clear_message(tiny_run, mutate, message):
    _, _, doc = tiny_run
    bad = mutate(json.loads(json.dumps(doc)))
    data = bad if isinstance(bad, str | bytes) else json.dumps(bad)
    with pytest.raises(InvalidInput, match=message):
        parse_run(data)


def test_every_example_has_a_recorded_run_in_the_gallery():
    import app

    names = {n for _, n in app.gallery()}
    assert {e["question_id"] for e in app.EXAMPLES} <= names
    for name in names:
        r = parse_run((ROOT / "assets" / "runs" / f"{name}.json").read_bytes())
        assert r.preset == "offline" and r.summary is not None and r.rounds
        assert r.summary.text == "".join("".join(ev.emitted_text) for ev in r.rounds)
    # a link opens the Replay tab on a recorded run; anything else is ignored
    tabs, pick = app.open_link(SimpleNamespace(query_params={"run": sorted(names)[0]}))
    assert tabs.selected == "replay" and pick["value"] == sorted(names)[0]
    assert app.open_link(SimpleNamespace(query_params={"run": "../../etc/passwd"})) == (app.gr.skip(), app.gr.skip())


@pytest.mark.offline_model
@pytest.mark.timeout(300)
def test_replay_ends_on_exactly_the_live_token_view(tmp_path):
    import app

    app.get_bundle("offline")
    prompt = app.EXAMPLES[8]["turns"][0]
    live = list(app.generate_view(prompt, "offline", None, app.PAGE_POLICY, max_new_tokens=48))
    record = live[-1][6]
    _, js = app.write_logs(record)
    replayed = list(app.replay_view(js["value"], "", 64.0))
    assert replayed[-1][0] == live[-1][0], "the replay's final token view differs from the live one"
    assert replayed[-1][5] == live[-1][5]  # the plain-text answer too
    # the round slider: every round's state, and the last one is the end state
    n = len(record.rounds)
    assert app.replay_at(js["value"], "", n)[0] == live[-1][0]
    middle = app.replay_at(js["value"], "", n // 2)[0]
    assert middle.count('class="tok ') < live[-1][0].count('class="tok ')
    with pytest.raises(app.gr.Error, match="round"):
        app.replay_at(js["value"], "", n + 1)
    # a gallery run by name; an unknown name is refused
    assert "done:" in list(app.replay_view(None, app.gallery()[0][1], 64.0))[-1][0]
    with pytest.raises(app.gr.Error, match="no recorded run"):
        list(app.replay_view(None, "../app.py", 2.0))


@pytest.mark.offline_model
@pytest.mark.timeout(300)
def test_cli_generate_json_then_replay(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("METASD_PLUGINS", None)
    gen = subprocess.run([sys.executable, "-m", "metasd", "generate", "Translate to French: good morning",
                          "--max-new-tokens", "16", "--json"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=180)
    assert gen.returncode == 0, gen.stderr
    path = tmp_path / "run.json"
    path.write_text(gen.stdout, encoding="utf-8")
    doc = json.loads(gen.stdout)
    rep = subprocess.run([sys.executable, "-m", "metasd", "replay", str(path), "--speed", "0"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert rep.returncode == 0, rep.stderr
    assert doc["text"].strip()[:20] in rep.stdout and "stopped by" in rep.stdout
    (tmp_path / "bad.json").write_text('{"format": "nope"}', encoding="utf-8")
    bad = subprocess.run([sys.executable, "-m", "metasd", "replay", str(tmp_path / "bad.json")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error: not a MetaSD run file")
