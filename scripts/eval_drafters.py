"""Each drafter alone on Spec-Bench: mean accepted tokens per target call and tokens/s, by category.

    PYTHONPATH=. .venv/bin/python scripts/eval_drafters.py --prompts /work/shared/specbench/question.jsonl \
        --per-category 2 --max-new-tokens 64 --out eval-drafters

Greedy, chat template, policy single:<drafter> through metasd.run. Also measures each model
drafter's cost c = (one drafter step) / (one target step) at a 200-token context, timed
interleaved in the same process. Writes OUT/results[-TAG].jsonl (one line per drafter and
prompt) and OUT/table.md (from every results*.jsonl in OUT, so several processes with --tag and
--drafters can share the work), and prints the table. --resume skips runs already recorded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from transformers import DynamicCache

from metasd import load_bundle, run


def read_prompts(path: str, categories: list[str] | None, per_category: int) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    seen: dict[str, int] = defaultdict(int)
    out = []
    for r in rows:
        cat = r["category"]
        if (categories and cat not in categories) or seen[cat] >= per_category:
            continue
        seen[cat] += 1
        out.append({"question_id": r["question_id"], "category": cat, "prompt": r["turns"][0]})
    return out


@torch.inference_mode()
def step_ms(model, ctx: int = 200, steps: int = 12) -> float:
    """Median time of one single-token step with a KV cache of `ctx` tokens."""
    ids = torch.randint(0, model.get_input_embeddings().weight.shape[0], (1, ctx + steps))
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :ctx], past_key_values=cache, use_cache=True, logits_to_keep=1)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        model(input_ids=ids[:, ctx + i : ctx + i + 1], position_ids=torch.tensor([[ctx + i]]), past_key_values=cache,
              use_cache=True, logits_to_keep=1)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def measure_costs(bundle, rounds: int = 3) -> dict[str, float]:
    """c per model drafter: drafter step / target step, interleaved so that load hits both alike."""
    ratios: dict[str, list[float]] = defaultdict(list)
    for _ in range(rounds):
        for name, model in bundle.models.items():
            t = step_ms(bundle.target)
            d = step_ms(model)
            ratios[name].append(d / t)
            ratios["_target_ms"].append(t)
            ratios[f"_{name}_ms"].append(d)
    return {k: statistics.median(v) for k, v in ratios.items()}


def table(rows: list[dict], drafters: list[str]) -> str:
    by = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by[r["category"]][r["drafter"]].append(r)
    cats = sorted(by)
    head = "| category | " + " | ".join(drafters) + " | best |"
    lines = ["Mean accepted tokens per target call (tokens/s in brackets); **bold** = best by accepted.", "",
             head, "|" + "---|" * (len(drafters) + 2)]
    wins: dict[str, list[str]] = defaultdict(list)
    for cat in [*cats, "ALL"]:
        cells, scores = [], {}
        for d in drafters:
            rs = [r for c in (cats if cat == "ALL" else [cat]) for r in by[c][d]]
            if not rs:
                cells.append("-")
                continue
            acc = sum(r["accepted"] for r in rs) / max(1, sum(r["target_calls"] for r in rs))
            tps = sum(r["new_tokens"] for r in rs) / sum(r["wall_s"] for r in rs)
            scores[d] = acc
            cells.append(f"{acc:.2f} ({tps:.1f})")
        best = max(scores, key=scores.get) if scores else "-"
        if cat != "ALL":
            wins[best].append(cat)
        cells = [f"**{c}**" if d == best else c for d, c in zip(drafters, cells, strict=True)]
        lines.append(f"| {cat} | " + " | ".join(cells) + f" | {best} |")
    lines += ["", "Categories won: " + "; ".join(f"{d}: {', '.join(ws)}" for d, ws in wins.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default="/work/shared/specbench/question.jsonl")
    ap.add_argument("--categories", default="", help="comma-separated; default all")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=None)
    ap.add_argument("--drafters", default="", help="comma-separated; default every drafter of the preset")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="eval-drafters")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--no-costs", action="store_true")
    ap.add_argument("--tag", default="", help="suffix of this process's results file")
    ap.add_argument("--table-only", action="store_true", help="only rebuild table.md from OUT")
    a = ap.parse_args(argv)

    out = Path(a.out)
    if a.table_only:
        print(write_table(out))
        return 0
    torch.set_num_threads(a.threads)
    bundle = load_bundle("offline", progress=lambda m: print(m, file=sys.stderr))
    drafters = a.drafters.split(",") if a.drafters else bundle.drafter_names
    prompts = read_prompts(a.prompts, a.categories.split(",") if a.categories else None, a.per_category)
    out.mkdir(parents=True, exist_ok=True)
    res_path = out / f"results{'-' + a.tag if a.tag else ''}.jsonl"
    rows = [json.loads(x) for x in res_path.read_text().splitlines()] if a.resume and res_path.exists() else []
    done = {(r["drafter"], r["question_id"]) for r in rows}
    if not a.resume:
        res_path.write_text("")

    if not a.no_costs:
        costs = measure_costs(bundle)
        (out / "costs.json").write_text(json.dumps(costs, indent=1))
        print("c (drafter step / target step):", json.dumps(costs), file=sys.stderr, flush=True)

    for i, q in enumerate(prompts):
        for d in drafters:
            if (d, q["question_id"]) in done:
                continue
            _, s = run(bundle, q["prompt"], policy=f"single:{d}", max_new_tokens=a.max_new_tokens, gamma=a.gamma)
            row = {"drafter": d, "question_id": q["question_id"], "category": q["category"],
                   "new_tokens": s.new_tokens, "target_calls": s.target_calls,
                   "accepted": round(s.mean_accepted * s.target_calls), "mean_accepted": round(s.mean_accepted, 3),
                   "wall_s": round(s.wall_s, 3), "tokens_per_s": round(s.tokens_per_s, 2),
                   "token_ids": list(s.token_ids)}
            rows.append(row)
            with res_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"[{i + 1}/{len(prompts)}] {q['category']:>14} q{q['question_id']:<4} {d:>16}: "
                  f"accepted/call {s.mean_accepted:.2f}  {s.tokens_per_s:.1f} tok/s", file=sys.stderr, flush=True)
    print(write_table(out))
    return 0


def write_table(out: Path) -> str:
    """table.md from every results*.jsonl in `out`; checks that all drafters gave the same output."""
    rows = [json.loads(x) for p in sorted(out.glob("results*.jsonl")) for x in p.read_text().splitlines() if x.strip()]
    # Compare drafters on the same prompts only: those every drafter has run.
    ran: dict[str, set[int]] = defaultdict(set)
    for r in rows:
        ran[r["drafter"]].add(r["question_id"])
    common = set.intersection(*ran.values()) if ran else set()
    rows = [r for r in rows if r["question_id"] in common]
    order = ["code-drafter", "math-drafter", "chat-drafter", "prompt-lookup", "token-recycling", "layer-skip"]
    present = {r["drafter"] for r in rows}
    drafters = [d for d in order if d in present] + sorted(present - set(order))
    md = table(rows, drafters)
    outputs: dict[int, set[tuple[int, ...]]] = defaultdict(set)
    for r in rows:
        outputs[r["question_id"]].add(tuple(r["token_ids"]))
    same = sum(len(v) == 1 for v in outputs.values())
    per_cat = defaultdict(set)
    for r in rows:
        per_cat[r["category"]].add(r["question_id"])
    md += ("\n\nPrompts per category: " + ", ".join(f"{c} {len(q)}" for c, q in sorted(per_cat.items()))
           + f". Greedy outputs identical across drafters on {same}/{len(outputs)} prompts.")
    costs = out / "costs.json"
    if costs.exists():
        c = json.loads(costs.read_text())
        md += "\n\nc (drafter step / target step, 200-token context): " + ", ".join(
            f"{k} {v:.3f}" for k, v in c.items() if not k.startswith("_")) + f"; target step {c['_target_ms']:.0f} ms."
    (out / "table.md").write_text(md + "\n")
    return md


if __name__ == "__main__":
    raise SystemExit(main())
