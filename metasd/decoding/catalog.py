"""What `python -m metasd drafters` reports: each drafter's kind, size and measured cost c.

Sizes come from the weight files' headers (no model is loaded); c = (drafting time per token) / (one
target step) comes from `assets/drafters/costs.json`, which `drafters --measure --save` rewrites from
runs of each drafter alone in the engine on this machine.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from metasd.core.costs import cost_entry
from metasd.drafting.files import drafter_path, parameter_count
from metasd.drafting.registry import kind_by_name, kind_of  # noqa: F401 (kind_by_name: the family a name reports)
from metasd.models.presets import DrafterSpec, Preset
from metasd.paths import COSTS_FILE, DATASTORE_DIR, ROOT

# Prompts the cost runs draft on (one per kind of text; never a page example or a Spec-Bench prompt).
COST_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "A shop sells pens at 3 dollars each. How much do 7 pens cost? Explain step by step.",
    "Give three tips for staying focused while studying.",
)


def weights_of(spec: DrafterSpec) -> Path | None:
    """The file holding a drafter's own weights or data, where it has one in the repository."""
    if spec.kind in ("distilled", "white-box"):
        return drafter_path(spec)
    if spec.kind == "retrieval":
        return DATASTORE_DIR / "offline.npy"
    return None


def describe(preset: Preset, costs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per drafter of the preset: name, kind, description, own parameters, file size, c."""
    costs = load_costs(preset.name) if costs is None else costs
    rows = []
    for s in preset.drafters:
        path = weights_of(s)
        exists = path is not None and path.exists()
        params: int | None = 0
        if s.kind in ("distilled", "white-box"):
            params = parameter_count(path) if exists else None
        elif s.kind == "model":
            params = None  # a hub model: counted when loaded (--measure)
        rows.append({"name": s.name, "kind": kind_of(s), "description": s.description,
                     "default_arm": s.name in preset.bandit_drafters or not preset.bandit_drafters,
                     "source": "preset", "parameters": params,
                     "file_bytes": path.stat().st_size if exists else (0 if path is None else None),
                     "file": str(path.relative_to(ROOT)) if exists else None,
                     "cost": costs.get(s.name)})
    return rows


def load_costs(preset: str) -> dict[str, float]:
    return {k: float(v) for k, v in cost_entry(preset).get("c", {}).items()}


def save_costs(preset: str, c: dict[str, float], detail: dict[str, Any]) -> None:
    data = json.loads(COSTS_FILE.read_text(encoding="utf-8")) if COSTS_FILE.exists() else {}
    old = data.get(preset, {}) if isinstance(data.get(preset), dict) else {}
    rounded = {k: round(v, 4) for k, v in c.items()}
    # Each thread count keeps its own figures (a sampled run reads those of its own count); another device's go.
    # A record from before `by_threads` counts as its own thread count's.
    figures = ("target_step_ms", "drafter_ms", "verify_ms")
    by = old.get("by_threads") if isinstance(old.get("by_threads"), dict) else {}
    if not by and "threads" in old and all(k in old for k in figures):
        by = {str(old["threads"]): {"c": old.get("c", {}), **{k: old[k] for k in figures}}}
    by = dict(by) if old.get("device") == detail.get("device") else {}
    by[str(detail["threads"])] = {"c": rounded, **{k: detail[k] for k in figures}}
    data[preset] = {"c": rounded, **detail, "by_threads": dict(sorted(by.items()))}
    tmp = COSTS_FILE.with_suffix(f".{os.getpid()}.tmp")  # replaced whole: sampled requests read it as they start
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, COSTS_FILE)


@torch.inference_mode()
def target_step_ms(bundle, ctx: int = 200, steps: int = 8) -> float:
    """Median time of one single-token target step with `ctx` tokens in its cache."""
    from metasd.core.kvcache import new_cache  # here: listing drafters needs no transformers (a fast `drafters`)

    m = bundle.target
    ids = torch.randint(0, bundle.tokenizer_vocab, (1, ctx + steps), device=bundle.device)
    cache = new_cache(m.config)
    m(input_ids=ids[:, :ctx], past_key_values=cache, use_cache=True, logits_to_keep=1)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        m(input_ids=ids[:, ctx + i : ctx + i + 1], position_ids=torch.tensor([[ctx + i]], device=bundle.device),
          past_key_values=cache, use_cache=True, logits_to_keep=1)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def measure_costs(bundle, names: list[str], max_new_tokens: int = 48, progress=print,
                  prompts: tuple[str | list[int], ...] = COST_PROMPTS) -> tuple[dict[str, float], dict]:
    """c per drafter: its drafting time per drafted token, alone in the engine on COST_PROMPTS, over the
    target's one-token step; the target is timed between drafters so that machine load hits both alike."""
    from metasd.decoding.engine import run
    from metasd.decoding.probe import verify_profile

    c: dict[str, float] = {}
    ms: dict[str, float] = {}
    steps: list[float] = [target_step_ms(bundle)]
    for name in names:
        drafted = spent = 0.0
        for p in prompts:
            _, s = run(bundle, p, policy=f"single:{name}", drafters=[name], max_new_tokens=max_new_tokens,
                       priors=False)
            st = next(d for d in s.drafters if d.name == name)
            drafted += st.drafted
            spent += st.draft_s
        steps.append(target_step_ms(bundle))
        ms[name] = 1000 * spent / drafted if drafted else float("nan")
        step = statistics.median(steps)
        c[name] = ms[name] / step if drafted else float("nan")
        progress(f"[metasd] {name}: {ms[name]:.2f} ms per drafted token, c = {c[name]:.3f}")
    # The target's pass by ids fed, probed as every request probes it (metasd/decoding/probe.py): with the drafter
    # costs, the fixed prices a sampled run plans with.
    profile = verify_profile(bundle.target)
    progress("[metasd] verification: " + ", ".join(f"{n} ids {m:.1f} ms" for n, m in profile))
    detail = {"target_step_ms": round(statistics.median(steps), 2), "drafter_ms": {k: round(v, 3) for k, v in ms.items()},
              "verify_ms": [[n, round(m, 2)] for n, m in profile], "device": bundle.device.type,
              "method": f"each drafter alone in the engine on {len(prompts)} prompts, {max_new_tokens} tokens; "
                        "target: median one-token step at 200 tokens of context", "threads": torch.get_num_threads()}
    return {k: v for k, v in c.items() if math.isfinite(v)}, detail
