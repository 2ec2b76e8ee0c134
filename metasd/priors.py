"""Informed priors: what the benchmark already knows about each arm, as pseudo-observations.

A cold bandit spends its first rounds pulling every arm at least once; on a 40-token answer with five
arms that exploration never pays back. A preset may carry a priors file (assets/priors/<preset>.json)
measured on prompts the page and the benchmark's default subset do not use: per reward kind, each
arm's mean reward under full information (every arm scored on every verified chunk, so the means are
not biased by which arms a policy happened to pull), and each drafter's cost per drafted token. A
request starts from `weight` pseudo-observations per arm at those means, then learns as usual: a
prompt on which an arm does better or worse than its prior moves the mean within a few rounds.
`priors=False` (the page's "start cold", the CLI's and bench's `--cold`) is the paper's setting.

    python -m metasd priors --preset offline --prompts ../shared/specbench/question.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PRIORS_DIR = Path(__file__).resolve().parent.parent / "assets" / "priors"
PRIORS_FORMAT = "metasd-priors-1"
DEFAULT_WEIGHT = 3.0  # pseudo-rounds per arm: a prior worth three real rounds, so a prompt overrides it quickly
PRIOR_REWARDS = ("bd", "be")  # throughput depends on the machine's timings: it starts cold


@dataclass(frozen=True)
class Priors:
    preset: str
    weight: float
    means: dict[str, dict[str, float]]  # reward kind -> arm -> mean reward
    ms_per_token: dict[str, float] = field(default_factory=dict)  # measured drafting cost per arm
    device: str = "cpu"  # where the costs were measured (they are not used elsewhere)
    meta: dict[str, Any] = field(default_factory=dict)

    def arm_means(self, reward: str, arms: list[str]) -> list[float | None]:
        """The prior mean of each arm for this reward kind (None: no prior, the arm starts cold)."""
        table = self.means.get(reward, {})
        return [table.get(a) for a in arms]


def load_priors(preset: str, directory: Path | None = None) -> Priors | None:
    """The preset's priors, or None when it has no priors file."""
    path = (directory or PRIORS_DIR) / f"{preset}.json"
    if not path.is_file():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("format") != PRIORS_FORMAT:
        raise ValueError(f"{path}: not a {PRIORS_FORMAT} file")
    return Priors(preset=doc["preset"], weight=float(doc["weight"]), means=doc["means"],
                  ms_per_token=doc.get("ms_per_token", {}), device=doc.get("device", "cpu"), meta=doc.get("meta", {}))


def measure(bundle: Any, prompts: list[Any], max_new_tokens: int, weight: float = DEFAULT_WEIGHT,
            progress: bool = True) -> dict[str, Any]:
    """Run every prompt with full information once per reward kind and average each arm's reward."""
    from tqdm.auto import tqdm

    from metasd.bench import prompt_ids
    from metasd.engine import run

    arms = bundle.default_drafters
    sums = {r: dict.fromkeys(arms, 0.0) for r in PRIOR_REWARDS}
    counts = {r: dict.fromkeys(arms, 0) for r in PRIOR_REWARDS}
    costs: dict[str, list[float]] = {a: [] for a in arms}
    jobs = [(r, p) for r in PRIOR_REWARDS for p in prompts]
    for reward, p in tqdm(jobs, desc="priors", unit="run", file=sys.stderr, disable=not progress):
        ids = prompt_ids(bundle, p.text, True)
        rounds, summary = run(bundle, ids, drafters=arms, policy="metasd-ucb", reward=reward, full_info=True,
                              max_new_tokens=max_new_tokens, priors=False)
        for ev in rounds:
            for a, x in ev.rewards.items():
                if x is not None:
                    sums[reward][a] += x
                    counts[reward][a] += 1
        for d in summary.drafters:
            if d.drafted:
                costs[d.name].append(1000 * d.draft_s / d.drafted)
    return {
        "format": PRIORS_FORMAT, "preset": bundle.preset.name, "weight": weight,
        "means": {r: {a: round(sums[r][a] / counts[r][a], 4) for a in arms if counts[r][a]} for r in PRIOR_REWARDS},
        "ms_per_token": {a: round(sorted(c)[len(c) // 2], 3) for a, c in costs.items() if c},
        "device": bundle.device.type,
        "meta": {"prompts": [str(p.question_id) for p in prompts], "max_new_tokens": max_new_tokens,
                 "date": time.strftime("%Y-%m-%d"), "command": " ".join(["python -m metasd priors", *sys.argv[2:]])},
    }


def add_priors_args(sub: argparse._SubParsersAction) -> None:
    from metasd.presets import DEFAULT_PRESET

    p = sub.add_parser("priors", help="measure a preset's informed priors (assets/priors/<preset>.json)")
    p.add_argument("--preset", default=DEFAULT_PRESET)
    p.add_argument("--prompts", required=True, help="Spec-Bench JSONL (question_id, category, turns)")
    p.add_argument("--skip-per-category", type=int, default=3,
                   help="leave out the first N of each category: the benchmark's default subset (default: %(default)s)")
    p.add_argument("--per-category", type=int, default=2, help="prompts per category after those (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="default: %(default)s")
    p.add_argument("--weight", type=float, default=DEFAULT_WEIGHT, help="pseudo-rounds per arm (default: %(default)s)")
    p.add_argument("--out", default=None, help="default: assets/priors/<preset>.json")


def cmd_priors(a: argparse.Namespace) -> int:
    from metasd.bench import load_prompts
    from metasd.models import load_bundle
    from metasd.validation import first_per_category

    everything = load_prompts(a.prompts, spec_bench_tasks=True)
    skipped = set(id(p) for p in first_per_category(everything, a.skip_per_category, category=lambda p: p.category))
    rest = [p for p in everything if id(p) not in skipped]
    prompts = first_per_category(rest, a.per_category, category=lambda p: p.category)
    bundle = load_bundle(a.preset)
    doc = measure(bundle, prompts, a.max_new_tokens, a.weight)
    out = Path(a.out) if a.out else PRIORS_DIR / f"{a.preset}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}: {json.dumps(doc['means'])}")
    return 0
