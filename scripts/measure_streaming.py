"""The page against the engine alone, side by side in one run: does streaming hold the engine back?

For each prompt (both sides first warmed by a short answer to it, then interleaved, fastest of --repeats), the
engine alone (`metasd.generate`, consumed in this process with the page's torch threads: the prefill's, then the
rounds') and the app's `/generate` over HTTP exactly as a browser receives it (the raw event stream): tokens/s,
time to the first visible token, frames drawn, rounds, and bytes streamed. Then the same frame loop on a tiny random model whose
rounds take a few milliseconds (like a GPU), to show that frames stay bounded while many rounds go by.

    .venv/bin/python scripts/measure_streaming.py [--repeats 2] [--max-new-tokens 128] [--long 512]

The app runs as users start it (`python app.py`, a separate process, on the offline preset); the
engine-alone runs happen in this process while the server idles.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import metasd  # noqa: E402
from metasd.core.events import Summary  # noqa: E402

PROMPTS = {  # the page's opening example first, then other kinds of prompt from the examples
    "rag (page default)": 8,
    "summarization": 2,
    "translation": 0,
    "qa": 4,
    "code": 10,
}


def via_engine(bundle, prompt: str, n: int, policy: str, threads: tuple[int, int] | None = None) -> dict:
    """The engine alone in this process's main thread; with `threads` = (prefill, rounds), torch's threads as
    the page's worker sets them (metasd.serving.streaming.EngineStream), else torch's default threads (as the CLI)."""
    import torch

    if threads:
        torch.set_num_threads(threads[0])
    t0 = time.perf_counter()
    first = None
    summary = None
    for ev in metasd.generate(bundle, prompt, max_new_tokens=n, policy=policy):
        if threads:
            torch.set_num_threads(threads[1])
        if isinstance(ev, Summary):
            summary = ev
        elif first is None and ev.emitted:
            first = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    return {"tokens": summary.new_tokens, "wall": wall, "tps": summary.new_tokens / wall, "first": first or wall}


def generate_fn_index(url: str) -> int:
    config = httpx.get(f"{url}config", timeout=30).json()
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == "generate")


def via_page(url: str, fn_index: int, drafters: list[str], prompt: str, n: int, policy: str) -> dict:
    """One /generate call through gradio's queue, reading the server-sent events as the page does."""
    session = uuid.uuid4().hex[:11]
    # generate_view's inputs in order (metasd/ui/generate.py): ..., seed, full_info, cold, baselines.
    data = [prompt, "offline", drafters, policy, "bd", 4, n, 0.0, 1.0, 0, False, False, {}]
    t0 = time.perf_counter()
    r = httpx.post(f"{url}gradio_api/queue/join", json={"data": data, "fn_index": fn_index, "session_hash": session,
                                                        "event_data": None, "trigger_id": None}, timeout=30)
    r.raise_for_status()
    nbytes, frames, first, last, final, answered = 0, 0, None, None, None, None
    with httpx.stream("GET", f"{url}gradio_api/queue/data", params={"session_hash": session}, timeout=600) as s:
        for line in s.iter_lines():
            nbytes += len(line) + 1
            if not line.startswith("data:"):
                continue
            msg = json.loads(line[5:])
            if msg.get("msg") in ("process_generating", "process_completed"):
                frames += msg.get("msg") == "process_generating"
                if first is None and ('class=\\"tok ' in line or 'class="tok ' in line):
                    first = time.perf_counter() - t0
                last = time.perf_counter() - t0
                # The answer is complete with the frame carrying its final status; the drafter lanes follow in
                # later frames (computed after the answer), which the user does not wait for to read it.
                if answered is None and re.search(r"(?:done|stopped after): ?\d+ tokens", line):
                    answered = last
                if msg.get("msg") == "process_completed":
                    final = msg
                    break
    out = (final or {}).get("output", {}).get("data") or []  # the final message carries whole values
    done = re.search(r"(?:done|stopped after): ?(\d+) tokens", str(out[0])) if out else None
    inside = re.search(r"([\d.]+) tokens/s \(engine clock\)", str(out[0])) if out else None
    drew = re.search(r"drew (\d+) frames for (\d+) rounds", str(out[3])) if len(out) > 3 else None
    return {"wall": answered or last, "lanes_s": last - (answered or last), "first": first, "frames": frames,
            "bytes": nbytes, "tokens": int(done.group(1)) if done else None,
            "rounds": int(drew.group(2)) if drew else None, "inside": float(inside.group(1)) if inside else None}


def tiny_frames(max_new_tokens: int = 400) -> str:
    """The app's frame loop (EngineStream + LiveView) on a tiny random model: rounds of a few ms."""
    import threading

    from metasd.serving.streaming import EngineStream
    from metasd.ui import viz
    from tests.tiny import tiny_bundle

    bundle = tiny_bundle(vocab=64)
    stop = threading.Event()
    ids = [3, 7, 1, 4, 9, 3, 7, 1, 4, 9, 3, 7, 2, 5]
    stream = EngineStream(metasd.generate(bundle, ids, chat_template=False, max_new_tokens=max_new_tokens, stop=stop,
                                          policy="metasd-ucb"), stop)
    view = viz.LiveView(viz.drafter_colors(bundle.drafter_names), bundle.drafter_names)
    t0 = time.perf_counter()
    render = 0.0
    for batch, done in stream.batches():
        t = time.perf_counter()
        for item in batch:
            view.add(item.event, item.t)
        view.tokens_html("end" if done else None)
        view.arm_json()
        view.regret_json()
        render += time.perf_counter() - t
        stream.frame_cost(time.perf_counter() - t)
        if done:
            break
    stream.close()
    wall = time.perf_counter() - t0
    s = view.summary
    return (f"tiny model: {len(view.rounds)} rounds in {wall:.2f} s ({1000 * wall / max(1, len(view.rounds)):.1f} ms a round), "
            f"{stream.frames} frames ({stream.frames / wall:.1f} frames/s), {s.new_tokens} tokens, "
            f"rendering {1000 * render / max(1, stream.frames):.1f} ms a frame")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--long", type=int, default=512, help="also one long answer, for the bytes streamed (0: skip)")
    ap.add_argument("--default-threads", action="store_true",
                    help="the engine alone with torch's default threads (as the CLI) instead of the page's")
    ap.add_argument("--space", action="store_true",
                    help="start the app as a Space starts it (SPACE_ID and PORT set; still bound to 127.0.0.1)")
    a = ap.parse_args()
    if a.space:  # before metasd.ui is imported: its thread settings are read once, at import
        os.environ["SPACE_ID"] = "local/metasd-measure"
    from metasd.ui.bundles import Presets
    from tests.test_start import free_port, scrubbed_env, started

    bundle = Presets().get("offline")
    env = scrubbed_env()
    env.pop("OMP_NUM_THREADS")  # torch's own default, as for a user
    env.update({k: v for k, v in os.environ.items() if k.startswith("METASD_")})  # e.g. METASD_FRAME_FPS to compare
    port = free_port()
    cmd = [sys.executable, "app.py", "--port", str(port)]
    if a.space:
        env.update({"SPACE_ID": "local/metasd-measure", "PORT": str(port)})
        cmd += ["--host", "127.0.0.1"]
    with started(cmd, env, port) as served:
        report(served.url, generate_fn_index(served.url), bundle, a)
    print(tiny_frames())


def report(url: str, fn_index: int, bundle, a: argparse.Namespace) -> None:
    from metasd.ui.config import EXAMPLES, PAGE_POLICY, PREFILL_THREADS, TORCH_THREADS

    print("| prompt | tokens | engine tok/s | page tok/s | page / engine | engine tok/s inside the page | "
          "first token, page | frames / rounds | kB streamed | lanes after the answer |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratios = []
    cold = None
    for name, idx in PROMPTS.items():
        prompt = EXAMPLES[idx]["turns"][0]
        # Both sides warmed alike, with a short answer to the same prompt: the engine in this process, the page
        # in the server (whose rounds' processes start cold: their first answer after start-up is timed apart).
        via_engine(bundle, prompt, 8, PAGE_POLICY)
        warm = via_page(url, fn_index, bundle.default_drafters, prompt, 8, PAGE_POLICY)
        cold = cold or warm
        eng, page = [], []
        for _ in range(a.repeats):
            eng.append(via_engine(bundle, prompt, a.max_new_tokens, PAGE_POLICY,
                                  None if a.default_threads else (PREFILL_THREADS, TORCH_THREADS)))
            page.append(via_page(url, fn_index, bundle.default_drafters, prompt, a.max_new_tokens, PAGE_POLICY))
        e = max(eng, key=lambda r: r["tps"])
        p = min(page, key=lambda r: r["wall"])
        p_tps = e["tokens"] / p["wall"]
        ratios.append(p_tps / e["tps"])
        rounds = p["rounds"]
        print(f"| {name} | {e['tokens']} | {e['tps']:.1f} | {p_tps:.1f} | {p_tps / e['tps']:.0%} | {p['inside']} | "
              f"{p['first']:.2f} s | {p['frames']} / {rounds} | {p['bytes'] / 1000:.0f} | {p['lanes_s']:.2f} s |")
    print(f"\nmean page / engine: {sum(ratios) / len(ratios):.1%}")
    print(f"the server's first answer after start-up (8 tokens, untimed above): first token {cold['first']:.2f} s, "
          f"{cold['wall']:.2f} s in all")
    if a.long:
        long_prompt = "Write a long, detailed story about a lighthouse keeper and a storm, in many paragraphs."
        p = via_page(url, fn_index, bundle.default_drafters, long_prompt, a.long, PAGE_POLICY)
        print(f"long answer: {p['tokens']} tokens, {p['frames']} frames, {p['bytes'] / 1000:.0f} kB streamed "
              f"({p['bytes'] / max(1, p['tokens']):.0f} bytes per token), {p['wall']:.1f} s")


if __name__ == "__main__":
    main()
