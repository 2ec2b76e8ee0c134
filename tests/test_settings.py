"""Settings in one place (metasd/settings.py, docs/DESIGN.md §11): every METASD_* name read there and only there,
each value checked with a clear message, `python -m metasd config` printing every effective value and its source,
and the docs' table equal to the registry."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from metasd import settings

ROOT = Path(__file__).resolve().parents[1]


def test_no_module_but_settings_reads_a_metasd_variable():
    """No os.environ / os.getenv lookup of a METASD_ name outside metasd/settings.py (app.py and scripts included),
    and every METASD_ name the code mentions is a registered setting."""
    readers, names = [], set()
    for p in [ROOT / "app.py", *sorted((ROOT / "metasd").rglob("*.py"))]:
        text = p.read_text(encoding="utf-8")
        names |= set(re.findall(r"\bMETASD_[A-Z_]+[A-Z]\b", text))
        if p.name != "settings.py" and re.search(r"(environ(\.get)?\s*[\[(]|getenv\()\s*[\"']METASD_", text):
            readers.append(str(p.relative_to(ROOT)))
    assert readers == []
    assert names <= set(settings.BY_NAME), sorted(names - set(settings.BY_NAME))
    assert len(settings.SETTINGS) == len(settings.BY_NAME) >= 22


def test_the_docs_table_is_the_registry():
    design = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    assert settings.docs_table() in design


@pytest.mark.parametrize("name, raw, message", [
    ("METASD_MAX_BATCH", "lots", "a whole number from 1 to 1024"),
    ("METASD_MAX_BATCH", "0", "a whole number from 1 to 1024"),
    ("METASD_ROUNDS_NICE", "40", "from -20 to 19"),
    ("METASD_BATCH", "maybe", "1 or 0"),
    ("METASD_FRAME_FPS", "nan", "a number from 0.5 to 120"),
    ("METASD_BATCH_SLOWDOWN", "inf", "a number from 1 to 1000"),
])
def test_a_bad_value_names_the_setting_and_what_it_takes(name, raw, message):
    with pytest.raises(settings.SettingError, match=f"^{name}='{re.escape(raw)}' cannot be used: it takes .*{message}"):
        settings.check({name: raw})


def test_values_are_parsed_and_sources_reported():
    env = {"METASD_MAX_BATCH": " 8 ", "METASD_BATCH": "yes", "METASD_FRAME_FPS": "2.5", "METASD_PRESET": ""}
    assert settings.value("METASD_MAX_BATCH", env) == 8 and settings.value("METASD_BATCH", env) is True
    assert settings.value("METASD_FRAME_FPS", env) == 2.5
    rows = {n: (v, src) for n, v, src in settings.effective(env)}
    assert rows["METASD_MAX_BATCH"] == (8, "environment") and rows["METASD_PRESET"] == ("", "default")
    assert rows["METASD_KV_BUDGET_MB"] == (4096, "default")
    assert any(line.startswith("METASD_MAX_BATCH") and "8" in line and "(environment)" in line
               for line in settings.describe(env))


def test_the_config_command_prints_every_setting_and_refuses_a_bad_one():
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "METASD_PREFIX_MB": "64"}
    done = subprocess.run([sys.executable, "-m", "metasd", "config"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == [s.name for s in settings.SETTINGS]
    assert re.search(r"^METASD_PREFIX_MB\s+64\s+\(environment\)$", done.stdout, re.M)
    assert re.search(r"^METASD_MAX_BATCH\s+32\s+\(default\)$", done.stdout, re.M)
    bad = subprocess.run([sys.executable, "-m", "metasd", "config"], cwd=ROOT, capture_output=True, text=True,
                         env={**env, "METASD_PREFIX_MB": "-1"}, timeout=120)
    assert bad.returncode == 2 and "error: METASD_PREFIX_MB='-1' cannot be used" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize(("cores", "env", "cuda", "fps", "plots"), [
    (2, {}, False, 3.0, 2.0),  # a teacher's laptop: the browser draws on the engine's two cores
    (2, {"PORT": "7860"}, False, 8.0, 1.0),  # hosted: the browsers are elsewhere
    (16, {}, False, 8.0, 1.0),  # cores to spare for a browser
    (2, {}, True, 8.0, 1.0),  # the engine on a GPU
])
def test_frame_rates_leave_a_small_machine_to_the_run(monkeypatch, cores, env, cuda, fps, plots):
    for name in ("PORT", "SPACE_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, v in env.items():
        monkeypatch.setenv(name, v)
    m = settings.Machine()
    m.cores = cores
    m.__dict__["cuda"] = cuda  # the cached property, answered without torch
    monkeypatch.setattr(settings, "machine", lambda: m)
    assert settings.value("METASD_FRAME_FPS", {}) == fps and settings.value("METASD_PLOT_INTERVAL", {}) == plots
    assert settings.value("METASD_FRAME_FPS", {"METASD_FRAME_FPS": "8"}) == 8.0  # the operator's word wins
