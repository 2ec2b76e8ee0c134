"""Sampled runs priced by the clock against runs priced from assets/drafters/costs.json (docs/DESIGN.md §3): how
fast each is, and whether a seed gives the same text every time.

The cost-aware policies (metasd-ucb-cost, metasd-tree, the throughput reward) plan from milliseconds; under sampling
the emitted text depends on the plan, so with the clock's prices one seed gives other text run after run. Each prompt
runs every (policy, prices) pair `--repeats` times under one seed, interleaved, one process; a pair's tokens/s is
its tokens over its wall time, summed over prompts and repeats. Run it on an idle machine.

    .venv/bin/python scripts/seed_repeats.py --spec-bench-tasks --per-category 1 --temperature 0.7
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metasd.benchmark.bench import load_prompts, prompt_ids  # noqa: E402
from metasd.decoding.engine import run  # noqa: E402
from metasd.decoding.loading import load_bundle  # noqa: E402

PRICES = ("measured", "fixed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default="../shared/specbench/question.jsonl", help="Spec-Bench JSONL, or `examples`")
    ap.add_argument("--spec-bench-tasks", action="store_true", help="MT-Bench's sub-categories as one task")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--policies", default="metasd-ucb-cost,metasd-tree,metasd-ucb/throughput",
                    help="comma-separated policy[/reward]")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each pair on each prompt, under the one seed")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    bundle = load_bundle("offline", progress=lambda m: print(m, file=sys.stderr))
    prompts = load_prompts(a.prompts, per_category=a.per_category, spec_bench_tasks=a.spec_bench_tasks)
    pairs = [(p, prices) for p in a.policies.split(",") if p for prices in PRICES]
    tokens, wall, calls = defaultdict(int), defaultdict(float), defaultdict(int)
    texts: dict[tuple[str, str, int], set[tuple[int, ...]]] = defaultdict(set)
    bar = tqdm(total=len(prompts) * a.repeats * len(pairs), desc="runs", file=sys.stderr)
    for i, pr in enumerate(prompts):
        ids = prompt_ids(bundle, pr.text, True)
        for _ in range(a.repeats):
            for policy, prices in pairs:
                name, _, reward = policy.partition("/")
                _, s = run(bundle, ids, policy=name, reward=reward or "bd", temperature=a.temperature, seed=a.seed,
                           max_new_tokens=a.max_new_tokens, prices=prices)
                key = (policy, prices)
                tokens[key] += s.new_tokens
                wall[key] += s.wall_s
                calls[key] += s.target_calls
                texts[(policy, prices, i)].add(s.token_ids)
                bar.update()
    bar.close()
    print(f"{len(prompts)} prompts, {a.repeats} runs each, temperature {a.temperature:g}, seed {a.seed}, "
          f"{a.max_new_tokens} new tokens, {a.threads} thread(s)\n")
    print("| policy | prices | tokens/s | target calls | tokens a call | prompts whose runs all gave one text |")
    print("|---|---|---:|---:|---:|---:|")
    for policy, prices in pairs:
        key = (policy, prices)
        same = sum(len(texts[(policy, prices, i)]) == 1 for i in range(len(prompts)))
        print(f"| {policy} | {prices} | {tokens[key] / wall[key]:.2f} | {calls[key]} | "
              f"{tokens[key] / max(calls[key], 1):.2f} | {same} of {len(prompts)} |")


if __name__ == "__main__":
    main()
