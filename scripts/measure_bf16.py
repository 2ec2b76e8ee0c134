"""How far bfloat16 moves greedy outputs, on the offline preset (docs/DESIGN.md §5; metasd/decoding/numerics.py).

For each prompt, three greedy outputs of the same length:

- ours: the engine in bf16 (several tokens verified per forward pass);
- target bf16: the target's own greedy decoding (`target_greedy`, one token per step) in bf16;
- target fp32: the same in fp32, the exact reference.

For each pair: identical or not, the first position where they part, and the target's top-two logit gap
there (one forward pass over the shared prefix: in bf16 for ours vs target bf16, in fp32 for the pairs
with the fp32 reference). For context it also records, over every generated position of the fp32
reference, how often the fp32 top-two gap is that small. Prints a markdown table; writes JSON.

    .venv/bin/python scripts/measure_bf16.py                       # 14 page examples + 6 Spec-Bench prompts
    .venv/bin/python scripts/measure_bf16.py --specbench 0 --max-new-tokens 128 --out bench-out/bf16.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from metasd.decoding.engine import encode_prompt, run, target_greedy  # noqa: E402
from metasd.decoding.loading import Bundle, load_bundle  # noqa: E402
from metasd.decoding.numerics import NEAR_TIE, Divergence, first_divergence  # noqa: E402

PAIRS = (("ours", "target_bf16"), ("target_bf16", "target_fp32"), ("ours", "target_fp32"))


def prompts(n_specbench: int, examples: bool) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if examples:
        for e in json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8")):
            out.append((e["question_id"], e["turns"][0]))
    if n_specbench:
        for p in (ROOT / "shared" / "specbench" / "question.jsonl", ROOT.parent / "shared" / "specbench" / "question.jsonl"):
            if p.exists():
                with p.open(encoding="utf-8") as f:
                    for line, _ in zip(f, range(n_specbench), strict=False):
                        q = json.loads(line)
                        out.append((f"sb-{q['question_id']}", q["turns"][0]))
                break
        else:
            print("measure_bf16: no Spec-Bench question.jsonl found; page examples only", file=sys.stderr)
    return out


@torch.inference_mode()
def position_gaps(fp: Bundle, bf: Bundle, prompt_ids: list[int], out: list[int]) -> list[tuple[float, float]]:
    """At every generated position of `out`: the fp32 target's top-two gap, and how far the bf16 target's gap
    between the same two tokens is from it (one forward pass of each over the same ids)."""
    ids = torch.tensor([[*prompt_ids, *out]], device=fp.device)
    where = slice(len(prompt_ids) - 1, len(prompt_ids) - 1 + len(out))
    exact = fp.target(input_ids=ids).logits[0, where].float()
    rounded = bf.target(input_ids=ids).logits[0, where].float()
    top = torch.topk(exact, 2, dim=-1)
    gap = top.values[:, 0] - top.values[:, 1]
    gap_bf = rounded.gather(1, top.indices[:, :1])[:, 0] - rounded.gather(1, top.indices[:, 1:])[:, 0]
    return list(zip(gap.tolist(), (gap_bf - gap).abs().tolist(), strict=True))


def _quantile(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def record(d: Divergence | None) -> dict:
    """A divergence as JSON; `near_tie` against bf16's bound whatever dtype measured the gap (every pair here
    has a bf16 side), and the page's sentence where the gap was measured in bf16."""
    if d is None:
        return {"identical": True}
    out = {"identical": False, "position": d.position, "ours": d.ours, "reference": d.reference,
           "top_two": list(d.top_two), "gap": d.gap, "top_logit": d.top_logit, "spread": d.spread,
           "near_tie": d.spread <= NEAR_TIE[torch.bfloat16], "dtype": str(d.dtype)}
    if d.dtype == torch.bfloat16:
        out["explain"] = d.explain()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--specbench", type=int, default=6, help="first N Spec-Bench prompts (0: none)")
    ap.add_argument("--no-examples", action="store_true", help="leave out the page's 14 examples")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--policy", default="metasd-ucb")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench-out/bf16.json")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    quiet = lambda m: None  # noqa: E731
    bf = load_bundle("offline", dtype="bfloat16", progress=quiet)
    fp = load_bundle("offline", dtype="float32", progress=quiet)
    items = prompts(a.specbench, not a.no_examples)
    rows: list[dict] = []
    positions: list[tuple[float, float]] = []  # (fp32 top-two gap, |bf16 gap - fp32 gap|) at every position
    t0 = time.perf_counter()
    for qid, text in tqdm(items, desc="prompts", unit="prompt"):
        ids = encode_prompt(bf, text, True)
        _, summary = run(bf, text, policy=a.policy, max_new_tokens=a.max_new_tokens, gamma=bf.preset.gamma)
        outs = {"ours": list(summary.token_ids), "target_bf16": target_greedy(bf, ids, a.max_new_tokens),
                "target_fp32": target_greedy(fp, ids, a.max_new_tokens)}
        row: dict = {"question_id": qid, "prompt_tokens": len(ids), "outputs": outs}
        for x, y in PAIRS:
            judge = bf if (x, y) == ("ours", "target_bf16") else fp  # the gap in the reference's own dtype
            row[f"{x}_vs_{y}"] = record(first_divergence(judge, ids, outs[x], outs[y]))
        d = row["ours_vs_target_bf16"]
        if not d["identical"]:  # the same position, measured by the fp32 model: the true margin there
            exact = first_divergence(fp, ids, outs["ours"], outs["target_bf16"])
            d["gap_fp32"] = exact.gap if exact else None
        here = position_gaps(fp, bf, ids, outs["target_fp32"])
        positions += here
        row["fp32_gap_median"] = statistics.median(g for g, _ in here) if here else None
        rows.append(row)
    elapsed = time.perf_counter() - t0

    def rate(key: str) -> float:
        return sum(r[key]["identical"] for r in rows) / len(rows) if rows else 0.0

    parted = [r[f"{x}_vs_{y}"] for r in rows for x, y in PAIRS if not r[f"{x}_vs_{y}"]["identical"]]
    summary_out = {
        "prompts": len(rows), "max_new_tokens": a.max_new_tokens, "policy": a.policy, "seconds": round(elapsed, 1),
        "identity": {f"{x}_vs_{y}": rate(f"{x}_vs_{y}") for x, y in PAIRS},
        "max_gap_at_divergence": {f"{x}_vs_{y}": max((r[f"{x}_vs_{y}"]["gap"] for r in rows
                                                       if not r[f"{x}_vs_{y}"]["identical"]), default=None)
                                  for x, y in PAIRS},
        "max_fp32_gap_where_bf16_runs_part": max((r["ours_vs_target_bf16"]["gap_fp32"] for r in rows
                                                  if not r["ours_vs_target_bf16"]["identical"]), default=None),
        "all_divergences_near_ties": all(p["near_tie"] for p in parted),
        "top_logit_range_at_divergences": [min((p["top_logit"] for p in parted), default=None),
                                           max((p["top_logit"] for p in parted), default=None)],
        "positions": len(positions),
        "near_tie_bound_bf16": NEAR_TIE[torch.bfloat16],
        "fp32_gap_median_all_positions": statistics.median(g for g, _ in positions) if positions else None,
        "fp32_share_of_positions_with_gap_at_most": {str(x): sum(g <= x for g, _ in positions) / len(positions)
                                                     for x in (0.125, 0.25, 0.5, 1.0)} if positions else {},
        "bf16_gap_error": {q: _quantile([e for _, e in positions], v) for q, v in
                           (("median", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))},
    }
    doc = {"summary": summary_out, "rows": rows,
           "software": {"torch": torch.__version__, "python": platform.python_version(), "cpu": platform.processor()
                        or platform.machine(), "threads": a.threads}}
    out = ROOT / a.out if not Path(a.out).is_absolute() else Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    print(markdown(rows, summary_out))
    print(f"\nwrote {out}", file=sys.stderr)
    return 0


def _cell(d: dict, key: str = "gap") -> tuple[str, str]:
    if d["identical"]:
        return "yes", "–"
    return f"no (token {d['position'] + 1})", f"{d[key]:.3f}" if d.get(key) is not None else "–"


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


def _gaps(d: dict) -> str:
    return ", ".join(f"{k.replace('_vs_', ' vs ')} {_num(v)}" for k, v in d.items())


def markdown(rows: list[dict], s: dict) -> str:
    lines = ["| prompt | ours bf16 = target bf16 | gap there (bf16 / fp32) | target bf16 = target fp32 | gap (fp32) "
             "| ours bf16 = target fp32 | gap (fp32) | fp32 median gap |",
             "|---|---|---:|---|---:|---|---:|---:|"]
    for r in rows:
        a, b, c = r["ours_vs_target_bf16"], r["target_bf16_vs_target_fp32"], r["ours_vs_target_fp32"]
        a_same, a_gap = _cell(a)
        if not a["identical"]:
            a_gap += f" / {a['gap_fp32']:.3f}" if a.get("gap_fp32") is not None else ""
        b_same, b_gap = _cell(b)
        c_same, c_gap = _cell(c)
        med = f"{r['fp32_gap_median']:.2f}" if r["fp32_gap_median"] is not None else "–"
        lines.append(f"| {r['question_id']} | {a_same} | {a_gap} | {b_same} | {b_gap} | {c_same} | {c_gap} | {med} |")
    idn = s["identity"]
    lines += ["", f"{s['prompts']} prompts, {s['max_new_tokens']} new tokens, policy {s['policy']}, {s['seconds']} s.",
              f"Identical: ours bf16 = target bf16 {idn['ours_vs_target_bf16']:.0%}; target bf16 = target fp32 "
              f"{idn['target_bf16_vs_target_fp32']:.0%}; ours bf16 = target fp32 {idn['ours_vs_target_fp32']:.0%}.",
              f"Largest top-two gap at a divergence: {_gaps(s['max_gap_at_divergence'])}; the fp32 model's gap "
              f"where ours bf16 and target bf16 part: at most {_num(s['max_fp32_gap_where_bf16_runs_part'])}.",
              f"Every divergence a near-tie (both tokens within {s['near_tie_bound_bf16']} logit of the best): "
              f"{s['all_divergences_near_ties']}; best logits there between {_num(s['top_logit_range_at_divergences'][0])} "
              f"and {_num(s['top_logit_range_at_divergences'][1])}.",
              f"Over all {s['positions']} generated positions of the fp32 reference: median top-two gap "
              f"{_num(s['fp32_gap_median_all_positions'])}; share with a gap at most 0.125 / 0.25 / 0.5 / 1: "
              + " / ".join(_pct(v) for v in s["fp32_share_of_positions_with_gap_at_most"].values()) + "; "
              "a bf16 forward's top-two gap off fp32's by (median / p90 / p99 / max) "
              + " / ".join(_num(v) for v in s["bf16_gap_error"].values()) + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
