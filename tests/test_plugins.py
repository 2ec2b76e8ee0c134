"""Bring your own drafter: register_drafter, METASD_PLUGINS, and `python -m metasd drafters`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metasd import Drafter, InvalidInput, load_plugins, register_drafter, run, target_greedy
from metasd.drafting.registry import KINDS, registered, unregister_drafter
from tests.tiny import tiny_bundle

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "tests.plugins.echo_drafter"


@pytest.fixture
def echo():
    names = load_plugins(PLUGIN)
    assert "echo-last" in registered()
    yield registered()["echo-last"]
    for n in names or ["echo-last"]:
        unregister_drafter(n)


def test_a_registered_drafter_works_wherever_a_drafter_name_does_and_stays_lossless(echo):
    bundle = tiny_bundle(vocab=24, seed=2)
    assert "echo-last" in bundle.drafter_names and "echo-last" not in bundle.default_drafters
    prompt = [3, 3, 3, 3, 5, 5, 5, 5, 7, 7]
    ref = target_greedy(bundle, prompt, 40)
    for policy, drafters in (("single:echo-last", None), ("metasd-ucb", ["prompt-lookup", "echo-last"]),
                             ("exp3", ["echo-last", "tiny-lm"])):
        rounds, s = run(bundle, prompt, policy=policy, drafters=drafters, max_new_tokens=40, full_info=True)
        assert list(s.token_ids) == ref, policy
        assert any(r.drafter == "echo-last" for r in rounds), policy
    assert isinstance(echo.make(bundle), Drafter) and echo.kind == "model-free"


def test_registration_is_checked():
    ok = lambda bundle: None  # noqa: E731
    for bad in ("", "single:x", "a b", "../x", "x" * 65, 3):
        with pytest.raises(ValueError):
            register_drafter(bad, ok)
    with pytest.raises(ValueError, match="kind"):
        register_drafter("fine", ok, kind="magic")
    with pytest.raises(TypeError):
        register_drafter("fine", "not callable")
    register_drafter("broken", ok)
    try:
        with pytest.raises(InvalidInput, match="not a metasd Drafter"):
            run(tiny_bundle(vocab=24), [1, 2, 3], policy="single:broken", max_new_tokens=4)
    finally:
        unregister_drafter("broken")
    assert "broken" not in tiny_bundle(vocab=24).drafter_names


def test_plugin_modules_are_named_by_the_operator_and_failures_are_loud():
    assert load_plugins("") == [] and load_plugins(None) == []
    with pytest.raises(ValueError, match="not an importable module path"):
        load_plugins("../../etc/passwd")
    with pytest.raises(RuntimeError, match="could not import 'metasd_no_such_plugin'"):
        load_plugins("metasd_no_such_plugin")


def _cli(*args: str, plugins: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "METASD_PLUGINS"}
    env["PYTHONPATH"] = str(ROOT)
    if plugins is not None:
        env["METASD_PLUGINS"] = plugins
    return subprocess.run([sys.executable, "-m", "metasd", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)


def test_drafters_command_lists_every_drafter_with_its_kind(capsys):
    from metasd.cli import main
    from metasd.models.presets import PRESETS

    for preset in PRESETS:  # in this process (each command line costs seconds of imports); the CLI's own below
        capsys.readouterr()
        assert main(["drafters", "--preset", preset, "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        assert [r["name"] for r in rows] == [d.name for d in PRESETS[preset].drafters]
        assert all(r["kind"] in KINDS and r["description"] for r in rows)
        assert all({"parameters", "file_bytes", "cost"} <= set(r) for r in rows)
        for r in rows:  # trained drafters: their own parameters and file, read from the file's header
            if r["kind"] in ("distilled", "white-box"):
                assert r["parameters"] > 1_000_000 and r["file_bytes"] > 1_000_000, r
            elif r["kind"] in ("model-free", "self"):
                assert r["parameters"] == 0, r
    text = _cli("drafters").stdout
    assert "prompt-lookup" in text and "model-free" in text and "distilled" in text and "white-box" in text
    # The offline preset's costs were measured (drafters --measure --save) for every drafter it has.
    assert main(["drafters", "--json"]) == 0
    offline = json.loads(capsys.readouterr().out)
    assert all(r["cost"] is not None and 0 < r["cost"] < 2 for r in offline), offline
    bad = _cli("drafters", "--preset", "gpt2")
    assert bad.returncode == 2 and "unknown preset" in bad.stderr


@pytest.mark.offline_model
def test_cli_loads_operator_plugins_and_generates_and_benchmarks_with_them(tmp_path):
    rows = json.loads(_cli("drafters", "--json", plugins=PLUGIN).stdout)
    assert {"name": "echo-last", "kind": "model-free"}.items() <= rows[-1].items()
    out = _cli("generate", "List: 1, 1, 1, 1, 1, 1,", "--policy", "single:echo-last", "--max-new-tokens", "12",
               "--json", plugins=PLUGIN)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert {r["drafter"] for r in doc["rounds"]} == {"echo-last"}
    (tmp_path / "p.jsonl").write_text('{"question_id": 1, "category": "qa", "turns": ["List: 1, 1, 1, 1,"]}\n',
                                      encoding="utf-8")
    bench = _cli("bench", "--prompts", str(tmp_path / "p.jsonl"), "--methods", "single:echo-last",
                 "--max-new-tokens", "8", "--out", str(tmp_path / "out"), "--quiet", plugins=PLUGIN)
    assert bench.returncode == 0, bench.stderr  # a researcher's own drafter, benchmarked like a preset's
    assert "single:echo-last" in (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")
    missing = _cli("drafters", plugins="metasd_no_such_plugin")
    assert missing.returncode == 2 and "could not import" in missing.stderr
