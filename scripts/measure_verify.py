"""What one verification costs by the number of ids fed, with torch's default linear kernels and with
the oneDNN-packed ones (metasd/models/cpu_linear.py), on the offline target (docs/DESIGN.md §4).

Each measurement: prefill a context of --context tokens, then time one forward pass of k ids on
its KV cache (the engine's verification). Both models run interleaved, every k in turn, and the
median of --repeats is kept. Also reports the largest logit difference between the two.

    .venv/bin/python scripts/measure_verify.py                  # 1 thread, k = 1..9
    .venv/bin/python scripts/measure_verify.py --threads 2 --out bench-out/verify.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metasd.core.kvcache import new_cache  # noqa: E402
from metasd.decoding.loading import load_causal_lm, offline_target_dir  # noqa: E402
from metasd.models.cpu_linear import ENV, pack_linears  # noqa: E402


def forward_ms(model, ids: torch.Tensor, context: int, k: int) -> tuple[float, torch.Tensor]:
    cache = new_cache()  # the engine's kind of cache (metasd/core/kvcache.py)
    with torch.no_grad():
        model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True, logits_to_keep=1)
        t = time.perf_counter()
        out = model(input_ids=ids[:, context:context + k], past_key_values=cache, use_cache=True, logits_to_keep=k)
        return (time.perf_counter() - t) * 1000, out.logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--max-ids", type=int, default=9)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    src = offline_target_dir(progress=print)
    if src is None:
        sys.exit("the offline model is not installed (make setup)")
    import os

    os.environ[ENV] = "0"
    plain = load_causal_lm(str(src), torch.device("cpu"), torch.float32)
    os.environ[ENV] = "1"
    packed = copy.deepcopy(plain)
    if not pack_linears(packed):
        sys.exit("packing is unavailable with this torch")
    ids = torch.randint(100, 20000, (1, a.context + a.max_ids), generator=torch.Generator().manual_seed(0))
    times: dict[str, dict[int, list[float]]] = {"default": {}, "packed": {}}
    diff = 0.0
    for _ in tqdm(range(a.repeats), desc="verify cost"):
        for k in range(1, a.max_ids + 1):
            t0, l0 = forward_ms(plain, ids, a.context, k)
            t1, l1 = forward_ms(packed, ids, a.context, k)
            times["default"].setdefault(k, []).append(t0)
            times["packed"].setdefault(k, []).append(t1)
            diff = max(diff, (l0 - l1).abs().max().item())
    med = {name: {k: statistics.median(v) for k, v in d.items()} for name, d in times.items()}
    print(f"\n{a.threads} thread(s), context {a.context}, median of {a.repeats}; largest logit difference {diff:.1e}\n")
    print("| ids fed | default ms | / one id | packed ms | / one id |")
    print("|---:|---:|---:|---:|---:|")
    for k in range(1, a.max_ids + 1):
        d, p = med["default"][k], med["packed"][k]
        print(f"| {k} | {d:.1f} | {d / med['default'][1]:.2f} | {p:.1f} | {p / med['packed'][1]:.2f} |")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"threads": a.threads, "context": a.context, "repeats": a.repeats,
                                     "max_logit_diff": diff, "median_ms": med}, indent=1))


if __name__ == "__main__":
    main()
