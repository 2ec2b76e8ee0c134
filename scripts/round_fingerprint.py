"""Fingerprint every method's rounds on a fixed prompt set: a before/after check for refactors.

For each (prompt, method) it records the generated ids, the number of target calls, and per round
the drafter, the draft length and the accepted count. Timing feeds two decisions (the cost-aware
policy's plan and the throughput reward), so the measured clocks are replaced by a fixed cost model
here: each drafter costs a constant per drafted token and a verification of n ids costs 40 + 6 n ms.
Two runs of the same code then give identical files, and a refactor that keeps behaviour does too, except
for the throughput reward: it charges a round the drafting time measured in that round, so its runs
differ from one run of the script to the next even on the same code (`--only throughput` twice shows it).

    python scripts/round_fingerprint.py --out before.json
    python scripts/round_fingerprint.py --out after.json --compare before.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from metasd.bandits.policies import POLICIES, single_method  # noqa: E402
from metasd.core.validation import Settings  # noqa: E402
from metasd.decoding import engine  # noqa: E402
from metasd.decoding.loading import load_bundle  # noqa: E402
from metasd.drafting.drafters import Drafter  # noqa: E402

FAKE_MS = {"prompt-lookup": 0.01, "token-recycling": 0.01}  # model drafters: 3 ms a token


def freeze_costs() -> None:
    """Replace measured times by a fixed cost model (see the module docstring)."""
    engine.VerifyCost.add = lambda self, fed, ms: None
    engine.VerifyCost.__call__ = lambda self, fed: 40.0 + 6.0 * fed
    Drafter.record_time = lambda self, seconds, tokens: None
    Drafter.ms_per_token = property(lambda self: FAKE_MS.get(self.name, 3.0))


def methods(drafters: list[str]) -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = [(p, {}) for p in POLICIES if p != "hedge"]
    out += [("hedge", {"full_info": True}), ("metasd-ucb-full", {"policy": "metasd-ucb", "full_info": True})]
    out += [(f"metasd-ucb/{r}", {"policy": "metasd-ucb", "reward": r}) for r in ("be", "throughput")]
    out += [("metasd-ucb-cost/throughput", {"policy": "metasd-ucb-cost", "reward": "throughput"})]
    out += [("metasd-ucb/no-sleep", {"policy": "metasd-ucb", "sleeping": False, "adaptive": False, "free_feedback": False})]
    out += [("metasd-ucb/sampled", {"policy": "metasd-ucb", "temperature": 0.8, "top_p": 0.95, "seed": 3})]
    out += [(single_method(d), {}) for d in drafters]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", default=None, help="an earlier fingerprint file: report every difference")
    ap.add_argument("--examples", default="ex-translation-1,ex-summarization-1,ex-math-1,ex-code-1,ex-rag-1")
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--only", default="", help="only methods whose name contains this")
    a = ap.parse_args()
    torch.set_num_threads(1)
    freeze_costs()
    bundle = load_bundle("offline")
    examples = {e["question_id"]: e for e in json.loads((ROOT / "assets/examples.json").read_text())}
    names = bundle.default_drafters
    result: dict[str, dict] = {}
    jobs = [(q, m, kw) for q in a.examples.split(",") for m, kw in methods(names) if a.only in m]
    # Informed priors are a feature of their own: the fingerprint compares the cold bandit.
    cold = {"priors": False} if "priors" in {f.name for f in fields(Settings)} else {}
    for q, m, kw in tqdm(jobs, desc="fingerprint"):
        kw = {"policy": m, "drafters": names, **cold, **kw}
        rounds, summary = engine.run(bundle, examples[q]["turns"][0], max_new_tokens=a.max_new_tokens, **kw)
        result[f"{q} {m}"] = {
            "tokens": list(summary.token_ids), "target_calls": summary.target_calls,
            "rounds": [[ev.drafter, len(ev.draft), ev.accepted] for ev in rounds],
        }
    Path(a.out).write_text(json.dumps(result, indent=0))
    if a.compare:
        old = json.loads(Path(a.compare).read_text())
        diff = [k for k in sorted(set(old) | set(result)) if old.get(k) != result.get(k)]
        for k in diff:
            print("DIFFERENT:", k)
        print(f"{len(result) - len(diff)} of {len(result)} runs identical")
        return 1 if diff else 0
    print(f"{len(result)} runs fingerprinted")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
