"""Measure the retrieval drafter on the offline preset: alone, against prompt lookup, and as a bandit arm.

    PYTHONPATH=. .venv/bin/python scripts/measure_retrieval.py --out bench-retrieval

Runs metasd.benchmark.bench (interleaved methods, one process, greedy, speed-ups against the target alone measured in
the same run) twice: on the page's examples (assets/examples.json, all of them) and on Spec-Bench
(../shared/specbench/question.jsonl, the first --per-category prompts of each category). The methods:
the target alone, `single:retrieval`, `single:prompt-lookup`, and each bandit policy of --policies over
the preset's default arms without `retrieval` (`<policy>-retrieval`) and with it (`<policy>+retrieval`),
whether or not the preset already counts it among its default arms.
Each run writes bench's files (summary.md, results.csv, report.html, ...) to OUT/examples and
OUT/specbench and prints its summary.md.

The retrieval drafter is also registered here (metasd.drafting.retrieval.register; the preset's own spec takes
precedence where it has one), so the script runs on a preset without it too.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WITH, WITHOUT = "+retrieval", "-retrieval"


def arms_by_name(run):
    """bench's `run` (metasd.decoding.engine.run), reading a policy named `<policy>+retrieval` or `<policy>-retrieval`
    as that policy over the preset's default arms with or without the retrieval drafter."""

    def wrapped(bundle, prompt, *, policy: str = "metasd-ucb", drafters=None, **kwargs):
        for suffix in (WITH, WITHOUT):
            if policy.endswith(suffix):
                policy = policy[: -len(suffix)]
                drafters = [d for d in bundle.default_drafters if d != "retrieval"]
                drafters += ["retrieval"] if suffix == WITH else []
        return run(bundle, prompt, policy=policy, drafters=drafters, **kwargs)

    return wrapped


def examples_jsonl(path: Path) -> Path:
    """assets/examples.json (a list) as a Spec-Bench-style JSONL file for bench.load_prompts."""
    rows = json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))
    path.write_text("".join(json.dumps({k: r[k] for k in ("question_id", "category", "turns")}) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench-retrieval")
    ap.add_argument("--specbench", default=str(ROOT.parent / "shared" / "specbench" / "question.jsonl"))
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--policies", default="metasd-ucb,metasd-ucb-cost", help="bandits run without and with the arm")
    ap.add_argument("--only", choices=["examples", "specbench"], help="run one of the two prompt sets")
    a = ap.parse_args(argv)

    import torch
    import transformers

    from metasd.benchmark import bench
    from metasd.decoding.loading import load_bundle
    from metasd.drafting.retrieval import datastore_for, register

    torch.set_num_threads(a.threads)
    transformers.logging.set_verbosity_error()
    register("retrieval")
    bench.run = arms_by_name(bench.run)
    bundle = load_bundle("offline")
    ds = datastore_for(bundle)
    print(f"[measure] datastore: {'none' if ds is None else f'{len(ds):,} tokens in {ds.documents} answers'}; "
          f"default arms: {', '.join(bundle.default_drafters)}", file=sys.stderr)
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    methods = bench.parse_methods(["baseline", "single:retrieval", "single:prompt-lookup"], bundle.drafter_names,
                                  list(bundle.models))
    methods += [bench.Method(p + s, "engine", policy=p + s, reward="bd") for p in policies for s in (WITHOUT, WITH)]
    with tempfile.TemporaryDirectory() as tmp:
        sets = {"examples": (examples_jsonl(Path(tmp) / "examples.jsonl"), None),
                "specbench": (Path(a.specbench), a.per_category or None)}
        for name, (path, per_category) in sets.items():
            if a.only and name != a.only:
                continue
            prompts = bench.load_prompts(path, per_category=per_category)
            print(f"[measure] {name}: {len(prompts)} prompts x {len(methods)} methods, {a.max_new_tokens} new tokens, "
                  f"{a.threads} torch thread(s)", file=sys.stderr, flush=True)
            out = Path(a.out) / name
            result = bench.run_bench(bundle, prompts, methods, max_new_tokens=a.max_new_tokens,
                                     on_prompt=lambda partial, out=out: bench.write_outputs(partial, out, html=False))
            paths = bench.write_outputs(result, out)
            print(f"\n## {name}\n")
            print(paths["summary.md"].read_text(encoding="utf-8"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
