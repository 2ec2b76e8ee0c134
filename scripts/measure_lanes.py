"""What the drafter lanes cost on the offline preset: the after-the-answer pass (ms per token), the lanes
from full-information scores, and the live tokens/s with the engine's lane scores recorded and without.

    .venv/bin/python scripts/measure_lanes.py [--prompts 4] [--max-new-tokens 128] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    import torch

    from metasd.decoding import engine, lanes
    from metasd.decoding.engine import run
    from metasd.ui.bundles import Presets
    from metasd.ui.config import EXAMPLES, PAGE_POLICY, TORCH_THREADS

    torch.set_num_threads(TORCH_THREADS)
    bundle = Presets().get("offline")
    examples = EXAMPLES[:: max(1, len(EXAMPLES) // a.prompts)][: a.prompts]
    real = lanes.round_scores
    tps: dict[str, list[float]] = {"with": [], "without": []}
    post_ms, full_ms = [], []
    for ex in examples:
        prompt = ex["turns"][0]
        for _ in range(a.repeats):
            for mode in ("without", "with"):  # without: the engine records no lane scores at all
                engine.lanes.round_scores = real if mode == "with" else (lambda names, r: {})
                rounds, s = run(bundle, prompt, policy=PAGE_POLICY, max_new_tokens=a.max_new_tokens)
                tps[mode].append(s.tokens_per_s)
        engine.lanes.round_scores = real
        rounds, s = run(bundle, prompt, policy=PAGE_POLICY, max_new_tokens=a.max_new_tokens)
        t = time.perf_counter()
        lanes.lanes_for(bundle, s.prompt, rounds, s.config)
        post_ms.append(1000 * (time.perf_counter() - t) / s.new_tokens)
        rounds, s = run(bundle, prompt, policy=PAGE_POLICY, max_new_tokens=a.max_new_tokens, full_info=True)
        t = time.perf_counter()
        lanes.lanes_for(bundle, s.prompt, rounds, s.config)
        full_ms.append(1000 * (time.perf_counter() - t) / s.new_tokens)
        print(f"{ex['question_id']}: {s.new_tokens} tokens; after the answer {post_ms[-1]:.2f} ms/token, "
              f"full information {full_ms[-1]:.2f} ms/token", flush=True)
    med = statistics.median
    print(f"live tokens/s (median of {len(tps['with'])}): with lane scores {med(tps['with']):.1f}, "
          f"without {med(tps['without']):.1f}")
    print(f"lanes after the answer: median {med(post_ms):.2f} ms/token (max {max(post_ms):.2f}); "
          f"with full information: median {med(full_ms):.2f} ms/token")


if __name__ == "__main__":
    main()
