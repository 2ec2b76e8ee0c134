"""Where torch's threads pay on this CPU: the engine on the main thread or in a worker thread, 1 or 2 threads.

The page runs every generation in a worker thread (metasd.serving.streaming), the CLI and `bench` on the main
thread. Each configuration runs in a fresh process (OpenMP keeps per-thread state), loads the offline
preset on the main thread as the app does, then times the page's default policy on one example prompt,
3 times (tokens/s each).

    .venv/bin/python scripts/measure_threads.py [--example ex-rag-1] [--tokens 128]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# "worker-lean-main": the main thread loads the model with one torch thread (no OpenMP team of its own),
# as the server does (app.main).
CONFIGS = [("main", 1), ("main", 2), ("worker", 1), ("worker", 2), ("worker-lean-main", 2)]
LABELS = {"main": "main thread", "worker": "worker thread (the main thread loaded the model with 2)",
          "worker-lean-main": "worker thread (the main thread loaded the model with 1, as the server now does)"}


def child(where: str, threads: int, example: str, tokens: int) -> list[float]:
    sys.path.insert(0, str(ROOT))
    import torch

    import metasd
    from metasd.core.events import Summary
    from metasd.ui.config import EXAMPLES, PAGE_POLICY

    if where == "worker-lean-main":
        torch.set_num_threads(1)
    bundle = metasd.load_bundle("offline")
    prompt = next(e["turns"][0] for e in EXAMPLES if e["question_id"] == example)
    speeds: list[float] = []

    def once() -> None:
        torch.set_num_threads(threads)  # in the thread that runs the model: OpenMP's setting is per thread
        t0 = time.perf_counter()
        for ev in metasd.generate(bundle, prompt, max_new_tokens=tokens, policy=PAGE_POLICY):
            if isinstance(ev, Summary):
                speeds.append(round(ev.new_tokens / (time.perf_counter() - t0), 1))

    for _ in metasd.generate(bundle, prompt, max_new_tokens=8, policy=PAGE_POLICY):  # warm-up
        pass
    for _ in range(3):
        if where == "main":
            once()
        else:  # a fresh thread per request, as the page starts one per generation
            t = threading.Thread(target=once)
            t.start()
            t.join()
    return speeds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--example", default="ex-rag-1")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]), a.example, a.tokens)))
        return
    print("| where the engine runs | torch threads | tokens/s |")
    print("|---|---:|---|")
    for where, threads in CONFIGS:
        out = subprocess.run([sys.executable, __file__, "--example", a.example, "--tokens", str(a.tokens),
                              "--child", where, str(threads)], capture_output=True, text=True, cwd=ROOT, check=True)
        speeds = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {LABELS[where]} | {threads} | {' / '.join(f'{s:.1f}' for s in speeds)} |", flush=True)


if __name__ == "__main__":
    main()
