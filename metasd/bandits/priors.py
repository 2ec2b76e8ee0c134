"""Informed priors: what the benchmark already knows about each arm, as pseudo-observations.

A cold bandit spends its first rounds pulling every arm at least once; on a 40-token answer with five
arms that exploration never pays back. A preset may carry a priors file (assets/priors/<preset>.json)
measured on prompts the page and the benchmark's default subset do not use: per reward kind, each
arm's mean reward under full information (every arm scored on every verified chunk, so the means are
not biased by which arms a policy happened to pull; a model-free arm with no match scores 0 there). A
request starts from `weight` pseudo-observations per arm at those means, then learns as usual: a
prompt on which an arm does better or worse than its prior moves the mean within a few rounds.
`priors=False` (the page's "start cold", the CLI's and bench's `--cold`) is the paper's setting.

    python -m metasd priors --preset offline --prompts ../shared/specbench/question.jsonl

(the command lives in metasd/benchmark/bench.py: it runs the engine, which reads this module.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metasd import paths

PRIORS_DIR = paths.PRIORS_DIR
PRIORS_FORMAT = "metasd-priors-1"
DEFAULT_WEIGHT = 3.0  # pseudo-rounds per arm: a prior worth three real rounds, so a prompt overrides it quickly
PRIOR_REWARDS = ("bd", "be")  # throughput depends on the machine's timings: it starts cold


@dataclass(frozen=True)
class Priors:
    preset: str
    weight: float
    means: dict[str, dict[str, float]]  # reward kind -> arm -> mean reward
    meta: dict[str, Any] = field(default_factory=dict)

    def arm_means(self, reward: str, arms: list[str]) -> list[float | None]:
        """The prior mean of each arm for this reward kind (None: no prior, the arm starts cold)."""
        table = self.means.get(reward, {})
        return [table.get(a) for a in arms]


_cache: dict[Path, tuple[float, Priors]] = {}


def load_priors(preset: str, directory: Path | None = None) -> Priors | None:
    """The preset's priors, or None when it has no priors file. Read once per file and kept while the file's
    modification time stays the same (every request asks)."""
    path = (directory or PRIORS_DIR) / f"{preset}.json"
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    hit = _cache.get(path)
    if hit is not None and hit[0] == mtime:
        return hit[1]
    pri = _read(path)
    _cache[path] = (mtime, pri)
    return pri


def _read(path: Path) -> Priors:
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("format") != PRIORS_FORMAT:
        raise ValueError(f"{path}: not a {PRIORS_FORMAT} file")
    return Priors(preset=doc["preset"], weight=float(doc["weight"]), means=doc["means"], meta=doc.get("meta", {}))
