"""Where the target's time goes when it decodes alone, one id a pass: its packed linear layers
(metasd/models/cpu_linear.py) against torch's default kernels on the same weights (`default_kernels`), per
product and per token, from torch's profiler. Greedy decoding of Spec-Bench prompts, both kernels interleaved per
prompt; each prompt is also timed without the profiler. Run it on an idle machine.

    .venv/bin/python scripts/profile_one_id.py                       # 4 prompts x 48 tokens, one thread
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metasd.core.kvcache import new_cache  # noqa: E402
from metasd.decoding.loading import load_bundle  # noqa: E402
from metasd.models.cpu_linear import default_kernels  # noqa: E402

PRODUCTS = ("mkldnn::_linear_pointwise", "aten::mm")  # a packed layer's product; a default-kernel one's


def decode_ms(model, ids: list[int], tokens: int, watch: Callable[[], Any] = contextlib.nullcontext) -> float:
    """Milliseconds a token over `tokens` greedy one-id passes after the prompt's prefill (only the passes run
    within `watch()`)."""
    cache = new_cache()
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True, logits_to_keep=1)
        with watch():
            t = time.perf_counter()
            for _ in range(tokens):
                nxt = out.logits[0, -1].argmax().view(1, 1)
                out = model(input_ids=nxt, past_key_values=cache, use_cache=True, logits_to_keep=1)
            return 1000 * (time.perf_counter() - t) / tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default="../shared/specbench/question.jsonl")
    ap.add_argument("--count", type=int, default=4, help="the file's first N prompts")
    ap.add_argument("--tokens", type=int, default=48, help="one-id passes timed per prompt")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    bundle = load_bundle("offline", progress=lambda m: print(m, file=sys.stderr))
    model, tok = bundle.target, bundle.tokenizer
    rows = [json.loads(line) for line in Path(a.prompts).read_text(encoding="utf-8").splitlines() if line.strip()]
    prompts = [tok.apply_chat_template([{"role": "user", "content": r["turns"][0]}], add_generation_prompt=True,
                                       return_dict=False) for r in rows[: a.count]]
    decode_ms(model, prompts[0], 4)  # warm-up
    ops = {k: Counter() for k in ("packed", "default")}  # microseconds per product
    calls = {k: Counter() for k in ops}
    plain: dict[str, list[float]] = {k: [] for k in ops}

    def timed(kind: str, ids: list[int], watch: Callable[[], Any] = contextlib.nullcontext) -> float:
        if kind == "packed":
            return decode_ms(model, ids, a.tokens, watch)
        with default_kernels(model):
            return decode_ms(model, ids, a.tokens, watch)

    for ids in tqdm(prompts, desc="prompts", file=sys.stderr):
        for kind in ops:
            prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
            timed(kind, ids, lambda prof=prof: prof)
            for e in prof.key_averages(group_by_input_shape=True):
                # A product is named by its input's width and, for torch's own, the weight's shape too.
                key = f"{e.key} {e.input_shapes[:2]}" \
                    if e.key in PRODUCTS else "other ops"
                ops[kind][key] += e.self_cpu_time_total
                calls[kind][key] += e.count
            plain[kind].append(timed(kind, ids))
    n = a.tokens * len(prompts)
    print(f"# one id a pass, {len(prompts)} prompts x {a.tokens} tokens, {a.threads} thread(s)")
    for kind, ms in plain.items():
        print(f"{kind}: {sum(ms) / len(ms):.1f} ms a token without the profiler ({', '.join(f'{x:.1f}' for x in ms)})")
    print("\n| kernel | product (input shape) | calls a token | ms a token |\n|---|---|---:|---:|")
    for kind, c in ops.items():
        for key, us in c.most_common():
            per = "" if key == "other ops" else f"{calls[kind][key] / n:.0f}"
            print(f"| {kind} | {key} | {per} | {us / 1000 / n:.2f} |")


if __name__ == "__main__":
    main()
