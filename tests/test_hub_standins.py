"""The GPU presets' loading and greedy identity, proven on the CPU with tiny stand-ins (tests/hub_standins.py).

The stand-ins carry every hub preset's real repository ids in a Hugging Face cache laid out as the hub lays
it out; a subprocess with HF_HUB_OFFLINE=1 and HF_HUB_CACHE pointing there runs `load_bundle(<preset>)` on
its real code path (the hub library reads those variables once, at import, hence the subprocess), then every
policy and every single drafter next to `target_greedy`. `scripts/gpu_bench.sh --dry-run` runs the GPU
benchmark's own commands against the same stand-ins, so the script cannot rot before a GPU runs it.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from metasd.core.runfile import parse_run
from metasd.models.presets import PRESETS
from tests import hub_standins
from tests.test_start import ROOT, scrubbed_env

HUB_PRESETS = [n for n, p in PRESETS.items() if "hub" in p.tags]


def standin_env(cache: Path, **extra: str) -> dict[str, str]:
    return scrubbed_env(PYTHONPATH=str(ROOT), **hub_standins.hub_env(cache), **extra)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    hub = tmp_path_factory.mktemp("hf") / "hub"
    hub_standins.build_cache(hub)
    return hub


@pytest.fixture(scope="module")
def report(cache) -> dict:
    p = subprocess.run([sys.executable, "-m", "tests.hub_standins", "--check"], cwd=ROOT, env=standin_env(cache),
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, f"the stand-in check failed:\n{p.stderr[-4000:]}"
    return json.loads(p.stdout)


def test_cache_is_laid_out_as_the_hub_does(cache):
    """models--org--name/{refs/main, snapshots/<commit>/<file> -> ../../blobs/<sha256>}, for every repository a
    hub preset names (targets and model drafters)."""
    repos = hub_standins.hub_repos()
    expected = {PRESETS[n].target for n in HUB_PRESETS}
    expected |= {d.model_id for n in HUB_PRESETS for d in PRESETS[n].drafters if d.kind == "model"}
    assert set(repos) == expected
    for repo in repos:
        folder = cache / ("models--" + repo.replace("/", "--"))
        commit = (folder / "refs" / "main").read_text()
        snap = folder / "snapshots" / commit
        for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json"):
            f = snap / name
            assert f.is_symlink() and f.resolve().parent == (folder / "blobs").resolve(), f


def test_every_hub_preset_loads_offline_from_the_cache(report):
    """Each hub preset loads by its repository ids, in fp32 on the CPU (the presets' "auto" dtype), with the
    real checkpoints' shape of vocabularies: a tokenizer smaller than every table, the 7B's table 128 rows
    larger than its drafters', tied heads on the small models only."""
    assert sorted(report) == sorted(HUB_PRESETS)
    for name, e in report.items():
        preset = PRESETS[name]
        assert e["target_source"] == preset.target
        assert e["dtype"] == "torch.float32", "on the CPU a hub preset runs in fp32"
        assert sorted(e["drafter_rows"]) == sorted(d.name for d in preset.drafters if d.kind == "model")
        assert e["tokenizer_ids"] < min(e["target_rows"], *e["drafter_rows"].values())
        assert e["target_tied"] == (preset.target not in hub_standins.UNTIED)
    big = report["qwen2.5-7b"]
    assert all(big["target_rows"] - rows == 128 for rows in big["drafter_rows"].values()), big
    small = report["qwen2.5-1.5b"]
    assert all(rows == small["target_rows"] for rows in small["drafter_rows"].values()), small


def test_prompts_go_through_the_chat_template(report):
    for e in report.values():
        assert e["chat_prefix"] == ["<|im_start|>"], e["chat_prefix"]


def test_every_policy_and_drafter_is_identical_to_the_target_greedy(report):
    """fp32 greedy: every policy (and full information with each reward) and every single drafter emits
    exactly the target's own greedy tokens, with every id inside the tokenizer."""
    for name, e in report.items():
        policies = {r["policy"] for r in e["runs"]}
        assert {f"single:{d.name}" for d in PRESETS[name].drafters} <= policies
        for r in e["runs"]:
            assert len(r["reference"]) > 0
            assert r["ours"] == r["reference"], (name, r["policy"], r.get("reward"), r["prompt"])
            assert max(r["ours"]) < e["tokenizer_ids"]


def test_every_hub_preset_serves_a_class_in_shared_rounds_as_a_gpu_server_does(report):
    """The scheduler a GPU server runs (batch-invariant blocks of rows; docs/DESIGN.md §7) on every hub preset's
    architecture: three requests verified in shared passes, each one's output its solo output."""
    for name, entry in report.items():
        shared = entry["shared"]
        assert shared["invariant"] and shared["share"], name
        assert shared["together"] == shared["solo"] and shared["most"] >= 2, (name, shared)


def test_model_drafters_get_accepted_across_the_vocabulary_gap(report):
    """On the 7B preset the drafters' logits (1024 ids) are fitted into the target's 1152: each model drafter
    alone must have drafts accepted, so the fitted rows really took part in verification."""
    e = report["qwen2.5-7b"]
    for d in e["drafter_rows"]:
        accepted = sum(r["accepted"].get(d, 0) for r in e["runs"] if r["policy"] == f"single:{d}")
        assert accepted > 0, f"{d} never had a draft accepted"


def test_checkpoint_decoding_defaults_never_reach_the_reference(cache, report):
    """The instruct checkpoints ship sampling defaults and a repetition penalty (generation_config.json); the
    loader keeps only the special token ids, so `target_greedy` (transformers generate) stays plain greedy."""
    for name, e in report.items():
        shipped = json.loads(_snapshot_file(cache, PRESETS[name].target, "generation_config.json").read_text())
        assert shipped["repetition_penalty"] > 1 and shipped["do_sample"] is True
        assert e["generation_config"] == {"do_sample": None, "repetition_penalty": None, "temperature": None}


def _snapshot_file(cache: Path, repo: str, name: str) -> Path:
    folder = cache / ("models--" + repo.replace("/", "--"))
    return folder / "snapshots" / (folder / "refs" / "main").read_text() / name


@pytest.mark.timeout(300)
@pytest.mark.parametrize("preset", HUB_PRESETS)
def test_gpu_bench_dry_run(preset, tmp_path):
    """`scripts/gpu_bench.sh --dry-run`: the GPU benchmark's commands, on the CPU against stand-ins it builds
    itself. Every method of the preset's list runs, every output is identical to the baseline, the replays it
    records are valid run files, and the class of users at once gets its solo answers."""
    out = tmp_path / "out"
    env = scrubbed_env(PRESET=preset, OUT_DIR=str(out), PYTHON=sys.executable, TMPDIR=str(tmp_path))
    p = subprocess.run(["bash", "scripts/gpu_bench.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=280)
    assert p.returncode == 0, f"gpu_bench.sh --dry-run exited {p.returncode}:\n{p.stderr[-4000:]}"
    assert "Traceback" not in p.stderr, p.stderr[-4000:]
    with open(out / "results.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    methods = {r["method"] for r in rows}
    listed = _script_methods(preset)
    assert listed and set(listed) <= methods, (listed, methods)
    assert all(r["identical_to_baseline"] == "True" for r in rows), [r for r in rows if r["identical_to_baseline"] != "True"]
    runs = sorted((out / "runs").glob("*.json"))
    assert runs, "no replay recorded"
    for f in runs:
        replay = parse_run(f.read_bytes())
        assert replay.rounds, f
    # The concurrent-users run: every user's answer is its solo answer, on the shared rounds.
    load = (out / "load_users.md").read_text(encoding="utf-8")
    rows = [line for line in load.splitlines() if re.match(r"\| \d+ \| engine only", line)]
    assert len(rows) == 2 and all(re.search(r"\| (\d+) of \1 \|", r) for r in rows), load
    assert "not shared" not in load, load
    assert not any(tmp_path.glob("metasd-standins.*")), "the dry run left its stand-in cache behind"


def _script_methods(preset: str) -> list[str]:
    """The METHODS list gpu_bench.sh uses for a preset, read from the script."""
    text = (ROOT / "scripts" / "gpu_bench.sh").read_text(encoding="utf-8")
    m = re.search(rf"^\s*{re.escape(preset)}\)\n(?:\s*#.*\n)*\s*METHODS=([^ ;]+)", text, re.M)
    assert m, f"gpu_bench.sh has no METHODS for {preset}"
    return m.group(1).split(",")


def test_no_real_hub_cache_was_touched():
    """The stand-ins live in temporary folders only: nothing named after a preset's repository is written to
    this user's real hub cache by these tests."""
    real = Path(os.environ.get("HF_HUB_CACHE") or Path.home() / ".cache" / "huggingface" / "hub")
    for repo in hub_standins.hub_repos():
        folder = real / ("models--" + repo.replace("/", "--"))
        if folder.exists():  # a real download is fine; a stand-in is not
            refs = folder / "refs" / "main"
            assert not refs.exists() or refs.read_text() != hub_standins.commit_of(repo), folder
