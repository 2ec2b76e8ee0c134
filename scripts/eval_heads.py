"""Teacher-forced acceptance of the white-box heads on Spec-Bench answers, per draft position and domain.

    PYTHONPATH=. .venv/bin/python scripts/eval_heads.py --prompts ../shared/specbench/question.jsonl \
        --per-category 6 --max-new-tokens 128 --out eval-heads

The target answers Spec-Bench prompts greedily through its chat template (these prompts are never in the
heads' training data); each head then reads the target's hidden states along those answers. Position 1 is
the head's prediction from the target's own features (the first drafted token of every round); position s
reads the head's own states for the s - 1 tokens before, as drafting s tokens does, with those tokens right
(training-time test). Agreement = the head's top-1 equals the target's greedy token. Writes OUT/heads.json
and OUT/heads.md and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from metasd.core.validation import first_per_category, parse_prompt_set
from metasd.decoding.loading import load_bundle
from metasd.drafting.whitebox import load_head
from metasd.training.train import answer_examples, encode_chat
from metasd.training.train_whitebox import evaluate, with_features

# Which Spec-Bench categories belong to each head's domain.
DOMAINS = {"code": ["coding"], "math": ["math", "math_reasoning"],
           "chat": ["writing", "roleplay", "humanities", "stem", "reasoning", "qa"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default="../shared/specbench/question.jsonl")
    ap.add_argument("--per-category", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--unroll", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="eval-heads")
    ap.add_argument("--head", action="append", default=[], metavar="FILE",
                    help="also score this head file (e.g. one trained with --resume before it replaces a shipped one)")
    ap.add_argument("--categories", default="", help="comma-separated Spec-Bench categories (default: every domain's)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    bundle = load_bundle("offline", progress=lambda m: print(m, file=sys.stderr))
    heads = {n: bundle.models[n] for n, s in bundle.specs.items() if s.kind == "white-box"}
    for f in a.head:
        heads[f"{Path(f).stem} ({Path(f).parent.name})"] = load_head(f, bundle.target, bundle.device, torch.float32)
    rows = parse_prompt_set(Path(a.prompts).read_bytes(), max_bytes=1 << 26, max_lines=1 << 20)
    results: dict[str, dict] = {}
    wanted = [c for c in a.categories.split(",") if c]
    for cat in sorted({c for cats in DOMAINS.values() for c in cats if not wanted or c in wanted}):
        chosen = first_per_category([r for r in rows if r["category"] == cat], a.per_category)
        if not chosen:
            continue
        ids = encode_chat(bundle.tokenizer, [r["prompt"] for r in chosen])
        ex = answer_examples(bundle.target, ids, a.max_new_tokens, bundle.eos_ids, desc=f"{cat}: target answers")
        seqs = with_features(bundle.target, ex, next(iter(heads.values())).c.feature_layers, max_len=4096,
                             desc=f"{cat}: features")
        results[cat] = {"prompts": len(chosen), "positions": sum(len(s.pos) for s in seqs),
                        **{n: evaluate(h, seqs, a.unroll)["agreement"] for n, h in heads.items()}}
        print(cat, json.dumps(results[cat]), file=sys.stderr)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "heads.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    names = list(heads)
    lines = ["| category (domain) | prompts | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for cat, r in results.items():
        dom = next(d for d, cats in DOMAINS.items() if cat in cats)
        cells = [("**" if n.startswith(dom) else "") + " / ".join(f"{x:.2f}" for x in r[n])
                 + ("**" if n.startswith(dom) else "") for n in names]
        lines.append(f"| {cat} ({dom}) | {r['prompts']} | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    (out / "heads.md").write_text(table, encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
