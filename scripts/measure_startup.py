"""How long `python app.py` takes to serve, started as a user or a host starts it.

For each kind of start (local; hosted, as a Space starts it with $SPACE_ID and $PORT; fresh, a
first start on a machine, whose model cache is empty so the offline target is converted), `--repeats` times: the
seconds from the command to the page answering (GET / 200), and to the end of a first short answer asked for
the moment the page answered (gradio_client, 8 new tokens), with what that run was shown first while the models
loaded. Each start is a separate process with an environment built from scratch (tests/test_start.py).

    .venv/bin/python scripts/measure_startup.py [--repeats 2] [--kinds local,hosted,fresh]
"""

from __future__ import annotations

import argparse
import html
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_start import free_port, http_status, scrubbed_env  # noqa: E402

PROMPT = "Name three colours of the rainbow."


def first_answer(url: str) -> tuple[float, str]:
    """Seconds to a first short answer from /generate, and the status line of its first frame."""
    from gradio_client import Client

    t0 = time.monotonic()
    client = Client(url, verbose=False)
    first = ""
    for out in client.submit(PROMPT, max_new_tokens=8, api_name="/generate"):
        status = re.search(r'class="tok-status"[^>]*>([^<]*)<', str(out[0]))
        if not first and status:
            first = html.unescape(status.group(1))
    client.close()
    return time.monotonic() - t0, first


def one_start(kind: str, fresh: bool) -> dict:
    import subprocess

    port = free_port()
    env = scrubbed_env()
    env.pop("OMP_NUM_THREADS")  # torch's own default, as for a user
    if kind == "hosted":
        env.update({"SPACE_ID": "local/metasd-startup", "PORT": str(port)})
    cache = tempfile.TemporaryDirectory(prefix="metasd-cache-") if fresh else None
    if cache is not None:
        env["METASD_CACHE"] = cache.name
    argv = [sys.executable, "app.py", "--port", str(port)]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=Path(__file__).resolve().parents[1], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while http_status(f"http://127.0.0.1:{port}/", timeout=2) != 200:
            if proc.poll() is not None:
                raise SystemExit(f"the app exited with status {proc.returncode}")
            if time.monotonic() - t0 > 600:
                raise SystemExit("the app did not answer within 600 s")
            time.sleep(0.2)
        served = time.monotonic() - t0
        answer_s, shown = first_answer(f"http://127.0.0.1:{port}/")
        return {"kind": kind + (", fresh cache" if fresh else ""), "served": served, "answered": served + answer_s,
                "shown": shown}
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        if cache is not None:
            cache.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--kinds", default="local,hosted",
                    help="starts to time, in turn: local, hosted, fresh (local on an empty model cache: converts)")
    a = ap.parse_args()
    known = {"local": ("local", False), "hosted": ("hosted", False), "fresh": ("local", True)}
    kinds = [known[k] for k in a.kinds.split(",")]
    rows = []
    for r in range(a.repeats):
        for kind, fresh in kinds:
            row = one_start(kind, fresh)
            print(f"[{r + 1}/{a.repeats}] {row['kind']}: page served after {row['served']:.1f} s, first answer done "
                  f"after {row['answered']:.1f} s (its first status line: {row['shown']!r})", flush=True)
            rows.append(row)
    print("\n| start | page served (s) | first answer done (s) |\n|---|---:|---:|")
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == kind]
        served = ", ".join(f"{r['served']:.1f}" for r in mine)
        answered = ", ".join(f"{r['answered']:.1f}" for r in mine)
        print(f"| {kind} | {served} | {answered} |")


if __name__ == "__main__":
    main()
