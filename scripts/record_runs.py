"""Record the Replay tab's gallery: every example prompt on the offline preset, with the page's defaults.

    .venv/bin/python scripts/record_runs.py [--out assets/runs] [--max-new-tokens 128]

Each run is written as a run file (metasd.core.runfile), with its drafter lanes (metasd.decoding.lanes),
named by the example's question_id, so that `?run=<question_id>` opens it. The engine runs with the app's
torch threading (one thread on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "assets" / "runs"))
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--lanes-only", action="store_true",
                    help="keep the recorded runs, add their drafter lanes (computed from their rounds: run-file version 2)")
    a = ap.parse_args()
    import torch
    from tqdm import tqdm

    from metasd.core.runfile import run_document
    from metasd.decoding.engine import run
    from metasd.decoding.lanes import lanes_for
    from metasd.ui import viz
    from metasd.ui.bundles import Presets
    from metasd.ui.config import EXAMPLES, PAGE_POLICY, TORCH_THREADS

    torch.set_num_threads(TORCH_THREADS)
    bundle = Presets().get("offline")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {"policy": PAGE_POLICY, "reward": "bd", "gamma": bundle.preset.gamma, "max_new_tokens": a.max_new_tokens,
                "temperature": 0.0, "top_p": 1.0, "seed": 0, "full_info": False}
    if a.lanes_only:
        return add_lanes(bundle, out)
    for ex in tqdm(EXAMPLES, desc="recording"):
        rounds, summary = run(bundle, ex["turns"][0], policy=PAGE_POLICY, max_new_tokens=a.max_new_tokens)
        lanes, _ = lanes_for(bundle, summary.prompt, rounds, summary.config)
        doc = run_document(ex["turns"][0], rounds, summary, preset="offline", target=bundle.preset.target,
                           drafters=bundle.default_drafters, colors=viz.drafter_colors(bundle.drafter_names),
                           settings=settings, lanes=lanes)
        (out / f"{ex['question_id']}.json").write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")),
                                                       encoding="utf-8")


def add_lanes(bundle, out: Path) -> None:
    """Upgrade recorded runs in place: the same rounds, plus the lanes every drafter has on their answer."""
    from metasd.core.runfile import VERSION, parse_run
    from metasd.decoding.lanes import lanes_for

    for path in sorted(out.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        run = parse_run(path.read_bytes())
        config = {**(run.summary.config if run.summary else {}), "drafters": run.drafters}
        lanes, secs = lanes_for(bundle, run.summary.prompt if run.summary else run.prompt, run.rounds, config)
        doc.update(version=VERSION, lanes={d: [round(x, 4) for x in v] for d, v in lanes.items()})
        path.write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
        print(f"{path.name}: {len(lanes)} lanes x {len(run.summary.token_ids) if run.summary else '?'} tokens, "
              f"{secs:.2f} s", flush=True)


if __name__ == "__main__":
    main()
