"""A class pressing Run at once: N gradio_client users against the app started as a Space starts it.

The app runs as `python app.py` with SPACE_ID and PORT set (so: every core per generation, as hosted),
bound to 127.0.0.1 only. Each user is a gradio_client Client of its own (its own session) that presses
Run on /generate (greedy, --max-new-tokens) at the same moment as the others and reads its stream to the
end. Per N: aggregate tokens/s, each user's tokens/s, time to the first token (p50, p95), how many were
served / told their place in line / told the class is full (and how soon after Run), whether every
answer equals the engine's solo answer on the same prompt, and the server's RSS before and after.

    .venv/bin/python scripts/load_users.py --users 1 8 32 64 [--max-new-tokens 64] [--batching off]
    .venv/bin/python scripts/load_users.py --users 1 8 32 --engine-only   # the same, no web server
    .venv/bin/python scripts/load_users.py --users 4 --engine-only --drafters retrieval,math-eagle  # other arms

`--engine-only` runs the same users on the engine's shared rounds in this process (no server, no frames):
the gap between its rows and the server's is what serving the page costs. `--beside thread|process` puts
plain Python work beside it, busy `--beside-share` of one core (a thread of this process holding the
interpreter lock, or a process of its own), and `--engine-threads` sets the rounds' torch threads: what
a server's own work costs the engine, and which part of that is the shared interpreter.

Bounded: at most --max-users users, each run at most --timeout seconds; the server is always killed.
The solo answers are computed in this process before the server starts (greedy is deterministic).
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_app_api import parse  # noqa: E402  (the token view's output text, as the page shows it)
from tests.test_start import free_port, scrubbed_env, started  # noqa: E402


@dataclass
class UserRun:
    """What one user saw: when (seconds after Run) the first token, a place in line, or 'full' came."""

    prompt: str
    policy: str = ""  # "" for the page's policy
    first_token: float | None = None
    told_place: float | None = None
    told_full: float | None = None
    wall: float | None = None
    tokens: int = 0
    text: str = ""
    error: str = ""
    statuses: list[str] = field(default_factory=list)


def _patch_in_place(value: Any, edits: list) -> Any:
    """A stream message's edits applied to the last output itself. gradio_client deep-copies every output for
    every message before editing it, which for 64 users on this 2-core machine took 40% of the CPU the server
    was being measured on; a browser on a student's own machine pays that cost, not the server. Same edits,
    same result: replace/append at a path, add/delete in a list or dict."""
    for action, path, new in edits:
        if not path:
            value = new if action == "replace" else value + new
            continue
        parent = value
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        if action == "replace":
            parent[key] = new
        elif action == "append":
            parent[key] += new
        elif action == "add":
            if isinstance(parent, list):
                parent.insert(int(key), new)
            else:
                parent[key] = new
        elif action == "delete":
            del parent[int(key) if isinstance(parent, list) else key]
        else:
            raise ValueError(f"unknown stream edit {action!r}")
    return value


def light_client() -> None:
    """gradio_client, with stream edits applied in place (the load generator shares the server's cores)."""
    import gradio_client.utils

    gradio_client.utils.apply_diff = _patch_in_place


def one_user(url: str, prompt: str, n: int, go: threading.Event, timeout: float, preset: str = "offline",
             policy: str | None = None, drafters: list[str] | None = None) -> UserRun:
    from gradio_client import Client

    run = UserRun(prompt, policy or "")
    more: dict[str, Any] = {"policy": policy} if policy else {}
    if drafters:
        more["drafters"] = drafters
    try:
        client = Client(url, verbose=False)
        go.wait(timeout)
        t0 = time.perf_counter()
        job = client.submit(prompt, preset=preset, max_new_tokens=n, temperature=0.0, api_name="/generate", **more)
        last, seen = None, 0
        # Polled 20 times a second, not iterated: gradio_client's iterator checks for news every millisecond in
        # each user's thread (64 of them took a core from the server), and waits forever if its reader died.
        while True:
            finished = job.done()
            outs = job.outputs()
            t = time.perf_counter() - t0
            for out in outs[seen:]:
                html = str(out[0]) + " " + str(out[3])
                if run.told_place is None and " in line, about " in html:
                    run.told_place = t
                if run.told_full is None and "the class is full" in html:
                    run.told_full = t
                if run.first_token is None and 'class="tok ' in str(out[0]):
                    run.first_token = t
                last = out
            seen = len(outs)
            if finished:
                if job.exception() is not None:
                    run.error = f"stream failed: {type(job.exception()).__name__}: {job.exception()}"[:200]
                break
            if t > timeout:
                job.cancel()
                run.error = "timed out"
                break
            time.sleep(0.05)
        run.wall = time.perf_counter() - t0
        done = re.search(r"done: (\d+) tokens", str(last[0])) if last is not None else None
        if done:
            run.text = "".join(parse(str(last[0])).out)
            run.tokens = int(done.group(1))
        elif not run.error and run.told_full is None:
            def text(html: object) -> str:
                return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", str(html))).strip()
            said = f"{text(last[0])[:100]} / {text(last[3])[:100]}".replace("|", "/") if last is not None else "none"
            run.error = f"ended without an answer (last frame: {said})"
    except Exception as e:  # noqa: BLE001  (a user's failure is a result, reported)
        run.error = f"{type(e).__name__}: {e}"[:200]
    return run


@functools.cache
def the_bundle(preset: str, device: str | None) -> Any:
    """The preset's models in this process: the page's own load for the offline preset, else load_bundle (a
    hub preset on a GPU, or on the CPU against stand-ins: scripts/gpu_bench.sh --dry-run)."""
    if preset == "offline" and device is None:
        from metasd.ui.bundles import Presets

        return Presets().get("offline")
    from metasd.decoding.loading import load_bundle

    return load_bundle(preset, device=device)


def solo_answers(prompts: list[str], n: int, preset: str = "offline", device: str | None = None,
                 drafters: list[str] | None = None) -> dict[str, tuple[str, int]]:
    """Each prompt's answer alone (the page's policy; greedy output is the target's): from the engine where the
    server's passes are unblocked; where they run in blocks of rows (a GPU's, or a CPU's fallback), from the shared
    rounds' blocked pass holding that request alone (the computation the server's page runs take, alone or in
    company: docs/DESIGN.md §7), so that "answers = solo" shows what company does."""
    from metasd.decoding.engine import collect, generate, prepare, steps
    from metasd.serving.batch import Rounds
    from metasd.ui.config import PAGE_POLICY

    bundle = the_bundle(preset, device)
    block = server_block(bundle)
    rounds = Rounds(bundle.target, max_batch=1, idle_s=1.0, share=True, block=block) if block else None
    out = {}
    arms = {"drafters": drafters} if drafters else {}
    for p in dict.fromkeys(prompts):
        if rounds is not None:
            req = prepare(bundle, p, max_new_tokens=n, policy=PAGE_POLICY, **arms)
            events = rounds.submit(req, steps(req, None))
        else:
            events = generate(bundle, p, max_new_tokens=n, policy=PAGE_POLICY, **arms)
        rounds_of, summary = collect(events)
        out[p] = ("".join("".join(ev.emitted_text) for ev in rounds_of), summary.new_tokens)
    return out


def server_block(bundle: Any) -> int | None:
    """The rows per row-wise call the server's shared passes take on this machine (start_rounds' choice), said
    on stderr: 0 (any: the target is row-invariant), the operator's or a GPU's $METASD_PASS_BLOCK, or the CPU's
    fallback, the smallest block that gives a row the same bits in any company."""
    from metasd.serving.batch import pass_block
    from metasd.ui.config import PASS_BLOCK

    block = pass_block(bundle.target, asked=PASS_BLOCK)
    said = ("none: passes not shared" if block is None else "calls of any size (row-invariant)" if not block
            else f"blocks of {block} rows")
    print(f"# shared passes on this machine: {said}", file=sys.stderr, flush=True)
    return block


def rss_mb(pid: int) -> float:
    """The server's memory with its children's (the shared rounds' process): proportional set sizes, so the
    weights the two share are counted once."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return sum(p.memory_full_info().pss for p in procs) / 2**20


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def drive(url: str, pid: int, users: int, prompts: list[str], solo: dict, a: argparse.Namespace) -> str:
    go = threading.Event()
    runs: list[UserRun | None] = [None] * users
    mine = [prompts[i % len(prompts)] for i in range(users)]

    trees = set(range(users - min(a.tree_users, users), users))  # the last --tree-users ask for metasd-tree

    def user(i: int) -> None:
        runs[i] = one_user(url, mine[i], a.max_new_tokens, go, a.timeout, a.preset,
                           "metasd-tree" if i in trees else a.policy, a.drafters)

    threads = [threading.Thread(target=user, args=(i,), daemon=True) for i in range(users)]
    for t in threads:
        t.start()
    time.sleep(min(30.0, 2.0 + 0.3 * users))  # every Client has fetched the page's config
    before = rss_mb(pid)
    t0 = time.perf_counter()
    go.set()
    deadline = time.perf_counter() + a.timeout + 60
    for t in threads:  # one deadline for all: a user that never returns is counted as lost, not waited for again
        t.join(max(0.0, deadline - time.perf_counter()))
    wall = time.perf_counter() - t0
    after = rss_mb(pid)
    done = [r for r in runs if r is not None]
    served = [r for r in done if r.tokens and not r.error]
    tokens = sum(r.tokens for r in served)
    same = sum(r.text == solo[r.prompt][0] for r in served)
    firsts = [r.first_token for r in served if r.first_token is not None]
    per_user = [r.tokens / r.wall for r in served if r.wall]
    place = [r.told_place for r in done if r.told_place is not None]
    full = [r.told_full for r in done if r.told_full is not None]
    errors = [r.error for r in done if r.error] + ["never returned"] * (users - len(done))
    for e in sorted(set(errors)):
        print(f"# {users} users, error x{errors.count(e)}: {e}", file=sys.stderr, flush=True)
    if trees:  # the chain runs' own aggregate, to set beside a class of chain runs only
        chains = [r for r in served if r.policy != "metasd-tree"]
        print(f"# {users} users with {len(trees)} metasd-tree: chain runs' aggregate "
              f"{sum(r.tokens for r in chains) / wall:.1f} tok/s over {len(chains)} runs; tree runs served "
              f"{sum(r.policy == 'metasd-tree' for r in served)}, their answers solo: "
              f"{sum(r.text == solo[r.prompt][0] for r in served if r.policy == 'metasd-tree')}", flush=True)
    said = [min(x for x in (r.told_place, r.told_full, r.first_token) if x is not None) for r in done
            if any(x is not None for x in (r.told_place, r.told_full, r.first_token))]
    return (f"| {users} | {a.batching} | {tokens / wall:.1f} | {statistics.median(per_user) if per_user else float('nan'):.1f} "
            f"| {pct(firsts, 0.5):.1f} s / {pct(firsts, 0.95):.1f} s | {len(served)} / {len(place)} / {len(full)} "
            f"| {pct(said, 1.0):.1f} s | {same} of {len(served)} | {before:.0f} -> {after:.0f} MB | {wall:.0f} s "
            f"| {len(errors)}{(': ' + errors[0]) if errors else ''} |")


def busy(share: float, done: Callable[[], bool] = lambda: False, period_s: float = 0.02) -> None:
    """Plain Python work, `share` of each period (the interpreter lock held throughout), asleep the rest."""
    while not done():
        t = time.perf_counter()
        while time.perf_counter() - t < share * period_s:
            pass
        time.sleep((1 - share) * period_s)


def engine_only(users: int, prompts: list[str], solo: dict, a: argparse.Namespace) -> str:
    """The same class on the engine alone, in this process: one Rounds driver as the server builds it, N
    threads submitting at the same moment, no web server, no frames (what the server adds is the gap)."""
    import torch

    from metasd.decoding.engine import prepare, steps
    from metasd.decoding.prefix import PrefixStore
    from metasd.serving.batch import Rounds
    from metasd.ui.config import PAGE_POLICY, PREFIX_MB

    bundle = the_bundle(a.preset, a.device)
    cores = a.engine_threads or os.cpu_count() or 1  # default: every core, as a hosted server's rounds get them
    torch.set_num_threads(cores)
    block = server_block(bundle)  # as start_rounds chooses
    rounds = Rounds(bundle.target, max_batch=users, threads=cores, share=block is not None, block=block or 0,
                    prefixes=PrefixStore(PREFIX_MB * 2**20), share_drafts=a.draft_batching == "on")
    go = threading.Event()
    runs = [UserRun(prompts[i % len(prompts)]) for i in range(users)]

    def user(r: UserRun) -> None:
        req = prepare(bundle, r.prompt, max_new_tokens=a.max_new_tokens, policy=a.policy or PAGE_POLICY,
                      **({"drafters": a.drafters} if a.drafters else {}))
        go.wait()
        t0 = time.perf_counter()
        for ev in rounds.submit(req, steps(req, None)):
            if r.first_token is None:
                r.first_token = time.perf_counter() - t0
            if hasattr(ev, "emitted_text"):
                r.text += "".join(ev.emitted_text)
            else:
                r.tokens = ev.new_tokens
        r.wall = time.perf_counter() - t0

    threads = [threading.Thread(target=user, args=(r,), daemon=True) for r in runs]
    for t in threads:
        t.start()
    time.sleep(1.0)
    done = threading.Event()
    work = None
    if a.beside == "thread":
        threading.Thread(target=busy, args=(a.beside_share, done.is_set), daemon=True).start()
    elif a.beside == "process":
        work = subprocess.Popen([sys.executable, __file__, "--busy", str(a.beside_share)])
    t0 = time.perf_counter()
    go.set()
    for t in threads:
        t.join(a.timeout)
    wall = time.perf_counter() - t0
    done.set()
    if work is not None:
        work.kill()
        work.wait()
    firsts = [r.first_token for r in runs if r.first_token is not None]
    same = sum(r.text == solo[r.prompt][0] for r in runs)
    per_user = statistics.median(r.tokens / r.wall for r in runs if r.wall)
    what = "engine only" + (f", {a.policy}" if a.policy else "")
    what += ("" if rounds.share else ", passes not shared (rows not invariant)") + (
        f", {a.engine_threads} torch thread(s)" if a.engine_threads else "") + (
        f", {a.beside} beside ({a.beside_share:.0%} of a core)" if a.beside != "none" else "")
    return (f"| {users} | {what} | {sum(r.tokens for r in runs) / wall:.1f} | {per_user:.1f} "
            f"| {pct(firsts, 0.5):.1f} s / {pct(firsts, 0.95):.1f} s | {users} / - / - | - | {same} of {users} "
            f"| - | {wall:.0f} s | 0 |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--preset", default="offline", help="the preset the users ask for (a hub preset on a GPU)")
    ap.add_argument("--device", default=None,
                    help="where this process runs the solo answers and --engine-only (default: the preset's own)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--drafters", type=lambda v: [x.strip() for x in v.split(",") if x.strip()], default=None,
                    help="comma-separated arms every user plays (default: the preset's default arms)")
    ap.add_argument("--policy", default=None, help="the policy every user asks for (default: the page's)")
    ap.add_argument("--tree-users", type=int, default=0,
                    help="this many of the users (the last) ask for metasd-tree; the others --policy")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a user waits at most for its answer")
    ap.add_argument("--max-users", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=4, help="distinct page examples the users cycle through")
    ap.add_argument("--distinct", action="store_true",
                    help="every user's prompt its own (\"Student N asks: \" before the example): no prompt is read twice")
    ap.add_argument("--batching", choices=["on", "off"], default="on",
                    help="$METASD_BATCH for the server (rounds of many requests in one pass)")
    ap.add_argument("--draft-batching", choices=["on", "off"], default="on",
                    help="$METASD_BATCH_DRAFTS: every request's model-drafter forwards in one pass per drafter")
    ap.add_argument("--engine-only", action="store_true",
                    help="the same users on the engine's shared rounds in this process, without the web server")
    ap.add_argument("--engine-threads", type=int, default=0, help="--engine-only: the rounds' torch threads (0: every core)")
    ap.add_argument("--beside", choices=["none", "thread", "process"], default="none",
                    help="--engine-only: Python work beside the engine, in a thread of this process or a process of its own")
    ap.add_argument("--beside-share", type=float, default=0.25, help="how busy that work keeps one core (0-1)")
    ap.add_argument("--busy", type=float, default=None, help=argparse.SUPPRESS)  # the --beside process itself
    ap.add_argument("--server-env", nargs="*", default=[], metavar="NAME=VALUE",
                    help="more METASD_* (or OpenMP) settings for the server (e.g. METASD_FRAME_FPS=2)")
    a = ap.parse_args()
    if a.busy is not None:  # the process beside: it ends with its parent, whatever happens to that
        parent = os.getppid()
        return busy(a.busy, lambda: os.getppid() != parent)
    if not 0 < a.beside_share < 1:
        ap.error("--beside-share is a share of one core, between 0 and 1")
    if a.beside != "none" and not a.engine_only:
        ap.error("--beside is for --engine-only (a server brings its own work)")
    if max(a.users) > a.max_users:
        ap.error(f"at most --max-users={a.max_users} users")
    from metasd.ui.config import EXAMPLES

    prompts = [e["turns"][0] for e in EXAMPLES][: a.prompts]
    if a.distinct:
        prompts = [f"Student {i + 1} asks: {prompts[i % len(prompts)]}" for i in range(max(a.users))]
    solo = solo_answers(prompts, a.max_new_tokens, a.preset, a.device, a.drafters)
    light_client()
    if a.engine_only:
        print("| users | server | aggregate tok/s | user tok/s (median) | first token p50 / p95 | served | - "
              "| answers = solo | - | wall | errors |\n|---:|---|---:|---:|---|---|---|---|---|---:|---|")
        for n in a.users:
            print(engine_only(n, prompts, solo, a), flush=True)
        return
    port = free_port()
    env = scrubbed_env(SPACE_ID="local/metasd-load", PORT=str(port), METASD_BATCH="1" if a.batching == "on" else "0",
                       METASD_BATCH_DRAFTS="1" if a.draft_batching == "on" else "0", METASD_PRESET=a.preset)
    env.pop("OMP_NUM_THREADS")  # a Space sets none
    # Where the hub models are, and which GPU: as this process was told.
    env.update({k: v for k, v in os.environ.items() if k.startswith(("HF_", "TRANSFORMERS_", "CUDA_"))})
    for item in a.server_env:
        name, _, value = item.partition("=")
        if not name.startswith(("METASD_", "OMP_", "GOMP_")) or not value:
            ap.error(f"--server-env takes METASD_NAME=VALUE (or OpenMP's OMP_/GOMP_ settings), not {item!r}")
        env[name] = value
    env["PYTHONPATH"] = str(ROOT)
    print(f"# {os.cpu_count()} cores; server: python app.py --host 127.0.0.1 (SPACE_ID, PORT={port} set)")
    print("| users | batching | aggregate tok/s | user tok/s (median) | first token p50 / p95 | served / told place / "
          "told full | slowest first word after Run | answers = solo | server PSS before -> after | wall | errors |")
    print("|---:|---|---:|---:|---|---|---:|---|---|---:|---|")
    with started([sys.executable, "app.py", "--host", "127.0.0.1"], env, port, timeout_s=300) as served:
        for line in served.output().splitlines():
            if "shared rounds" in line or "serving:" in line:
                print("#", line.split(":", 2)[-1].strip() if line.startswith("INFO:") else line)
        for n in a.users:
            print(drive(served.url, served.proc.pid, n, prompts, solo, a), flush=True)
        for line in served.output().splitlines():  # runs the server gave up on (their clients read too slowly)
            if "stream was not read" in line:
                print("# server:", line.strip(), file=sys.stderr)


if __name__ == "__main__":
    main()
