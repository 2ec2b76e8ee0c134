"""The `bench` and `priors` command lines, kept apart from the runner (metasd/benchmark/bench.py).

Building the parser imports neither torch nor transformers, so `python -m metasd --help` and a
mistyped flag answer at once; metasd.cli imports the runner only when a command runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from metasd.bandits.policies import POLICIES, single_method
from metasd.bandits.priors import DEFAULT_WEIGHT
from metasd.core.validation import REWARDS
from metasd.models.presets import DEFAULT_PRESET, PRESETS

DEFAULT_KERNELS = "baseline:default-kernels"  # the target alone with torch's default kernels (bench.py)


def default_methods(drafter_names: Sequence[str]) -> list[str]:
    return ["baseline", DEFAULT_KERNELS, "hf-pld", *map(single_method, drafter_names), "metasd-ucb", "metasd-ucb-cost",
            "metasd-tree", "oracle"]


def method_help() -> str:
    return (f"comma-separated, from: baseline, {DEFAULT_KERNELS}, hf-pld[:N], hf-assisted:<model drafter>, single:<drafter>, "
            f"<policy>[/<reward>][+<drafter>...][~<drafter>...][@cold] with policy in {', '.join(POLICIES)} and reward "
            f"in {', '.join(REWARDS)} (+<drafter>: an arm besides the preset's default ones; ~<drafter>: a default arm "
            "left out; @cold: without the preset's informed priors), oracle")


def add_bench_args(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="benchmark methods side by side on Spec-Bench-style prompts")
    b.add_argument("--prompts", required=True,
                   help="JSONL with question_id, category, turns (Spec-Bench's format), or `examples`: the page's own")
    b.add_argument("--categories", default=None, help="comma-separated categories (default: all in the file)")
    b.add_argument("--per-category", type=int, default=3, help="first N prompts of each category (0: all; default 3)")
    b.add_argument("--max-new-tokens", type=int, default=128)
    b.add_argument("--methods", default=None, help=method_help() + "; default: "
                   + ", ".join(default_methods(["<drafter>"])).replace("single:<drafter>", "every single:<drafter>"))
    b.add_argument("--out", required=True, help="output folder (results.csv, summary.md, report.html, ...)")
    b.add_argument("--preset", default=DEFAULT_PRESET, help=f"one of {', '.join(PRESETS)}")
    b.add_argument("--device", default=None, help="override the preset's device (cpu, cuda, ...)")
    b.add_argument("--dtype", default=None, help="override the preset's dtype")
    b.add_argument("--gamma", type=int, default=None, help="draft length of our engine (default: the preset's)")
    b.add_argument("--reward", default="bd", help="reward of policies named without /<reward>: bd, be or throughput")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--no-chat-template", action="store_true", help="feed prompts as plain text")
    b.add_argument("--no-warmup", action="store_true", help="skip the unmeasured warm-up run of each method")
    b.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    b.add_argument("--repeats", type=int, default=1,
                   help="run each prompt's methods N times (interleaved) and keep each method's fastest run")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.add_argument("--cold", action="store_true",
                   help="every engine method starts cold (no informed priors); per method: <method>@cold")
    b.add_argument("--spec-bench-tasks", action="store_true",
                   help="group MT-Bench's eight sub-categories into one, mt_bench: Spec-Bench's six tasks")


def add_priors_args(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("priors", help="measure a preset's informed priors (assets/priors/<preset>.json)")
    p.add_argument("--preset", default=DEFAULT_PRESET)
    p.add_argument("--prompts", required=True, help="Spec-Bench JSONL (question_id, category, turns)")
    p.add_argument("--skip-per-category", type=int, default=3,
                   help="leave out the first N of each category: the benchmark's default subset (default: %(default)s)")
    p.add_argument("--per-category", type=int, default=2, help="prompts per category after those (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="default: %(default)s")
    p.add_argument("--weight", type=float, default=DEFAULT_WEIGHT, help="pseudo-rounds per arm (default: %(default)s)")
    p.add_argument("--drafters", default="",
                   help="comma-separated arms to measure, every default arm among them, so that a request that "
                        "names others starts informed too (default: the preset's default arms)")
    p.add_argument("--out", default=None, help="default: assets/priors/<preset>.json")
