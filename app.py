"""MetaSD Studio: the live visualizer. Only the Gradio layer over the engine's event stream.

Every view is a pure function in metasd/viz.py (events -> HTML, figures, tables); this file
builds the page, keeps the loaded models, and wires engine events to components.

    python app.py            # http://127.0.0.1:7860 (0.0.0.0:$PORT where the host sets PORT / SPACE_ID)
"""

import argparse
import atexit
import gc
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

# The app never phones home: gradio reads this at import time (Blocks also gets analytics_enabled=False).
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"

import gradio as gr  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from gradio.components.plot import PlotData  # noqa: E402

from metasd import viz
from metasd.engine import encode_prompt, generate, target_greedy
from metasd.engine import run as engine_run
from metasd.events import Summary
from metasd.models import Bundle, cache_root, load_bundle
from metasd.playground import SynthDrafter, compare, expected_speedup, expected_tokens
from metasd.policies import POLICIES, POLICY_HELP
from metasd.presets import DEFAULT_PRESET, PRESETS
from metasd.registry import load_plugins
from metasd.runfile import MAX_BYTES as RUN_MAX_BYTES
from metasd.runfile import Replay, parse_run, run_document
from metasd.streaming import EngineStream, FairSlots  # noqa: E402
from metasd.validation import (
    MAX_PROMPT_CHARS,
    PROMPT_SET_MAX_BYTES,
    InvalidInput,
    clean_prompt,
    number,
    parse_prompt_set,
    validate_playground,
)

try:  # ZeroGPU on Hugging Face Spaces: a GPU is attached only inside decorated calls.
    import spaces

    def gpu(fn):
        return spaces.GPU(duration=120)(fn)
except ImportError:  # anywhere else: a no-op

    def gpu(fn):
        return fn


log = logging.getLogger("metasd.app")
# Operator plugins (metasd.registry): modules named by whoever runs the server, never by the page. Their
# drafters join every preset's list, each with a colour of its own.
PLUGIN_DRAFTERS = load_plugins(os.environ.get("METASD_PLUGINS"))
ROOT = Path(__file__).resolve().parent
ASSETS = ROOT / "assets"
HAS_CUDA = torch.cuda.is_available()
# Generations that may run at once (each one holds the model): 1 on a CPU, 2 on a GPU.
GEN_CONCURRENCY = int(os.environ.get("METASD_CONCURRENCY", "2" if HAS_CUDA else "1"))
QUEUE_SIZE = int(os.environ.get("METASD_QUEUE_SIZE", "32"))
# torch threads per generation on a CPU. Measured on the offline preset (2 cores): one thread runs the
# engine as fast as two do from the main thread (11.8 vs 12.0 tokens/s), while two threads from a
# worker thread, where the server runs every request, fall to 10.0. One thread also leaves a core to
# the web server and the renderer. Larger machines get their cores shared out between generations.
TORCH_THREADS = int(os.environ.get("METASD_TORCH_THREADS", "0")) or max(1, (os.cpu_count() or 2) // (GEN_CONCURRENCY + 1))
# The prompt's prefill is one large batch, where more threads do pay: every core's share for it.
PREFILL_THREADS = max(TORCH_THREADS, (os.cpu_count() or 2) // GEN_CONCURRENCY)
MAX_NEW_TOKENS = 1024 if HAS_CUDA else 512
COMPARE_MAX_NEW_TOKENS = 256
COMPARE_MAX_PROMPTS = 40 if HAS_CUDA else 21
TMP = Path(tempfile.mkdtemp(prefix="metasd-app-"))  # the app's own temp dir (mode 0700): run logs only
atexit.register(shutil.rmtree, TMP, True)
TMP_MAX_AGE_S = 3600  # run logs older than this are deleted (gradio serves its own copy meanwhile)
TMP_MAX_FILES = 400

EXAMPLES: list[dict[str, Any]] = json.loads((ASSETS / "examples.json").read_text(encoding="utf-8"))
TASKS = list(dict.fromkeys(e["category"] for e in EXAMPLES))
TASK_TITLES = {"translation": "Translation", "summarization": "Summarization", "qa": "QA", "math": "Math",
               "rag": "RAG", "code": "Code", "chat": "Chat"}
# The page's defaults. Measured on this 2-core CPU with the engine's one torch thread (target alone vs the
# engine, fastest of 2, 128 new tokens): the cost-aware bandit beat the paper's MetaSD-UCB on all 14
# examples (e.g. QA 0.96x vs 0.75x, translation 1.23x vs 0.99x), because here a rejected draft costs more
# than a plain step; the paper's policy stays one click away. The RAG example opens the page: it shows
# prompt lookup copying from the context (1.16x).
PAGE_POLICY = "metasd-ucb-cost"
PAGE_EXAMPLE = next(i for i, e in enumerate(EXAMPLES) if e["question_id"] == "ex-rag-1")
REWARD_CHOICES = [("block divergence (bd)", "bd"), ("block efficiency (be)", "be"), ("throughput", "throughput")]


# ----------------------------------------------------------------------------------------------
# Models: only PRESETS names, each loaded once and shared by every request.


def available_presets() -> list[str]:
    """Hub presets need a CUDA GPU; on a CPU only the offline preset is offered."""
    return [n for n, p in PRESETS.items() if HAS_CUDA or "gpu" not in p.tags]


def default_preset() -> str:
    want = os.environ.get("METASD_PRESET") or DEFAULT_PRESET
    return want if want in available_presets() else DEFAULT_PRESET


# The model, shared by every request: Generate holds it for a whole answer, Compare one run at a time,
# first come first served, so nobody waits for a whole prompt set.
MODEL = FairSlots(GEN_CONCURRENCY)

_bundles: dict[str, Bundle] = {}
_bundle_lock = threading.Lock()


def get_bundle(name: Any) -> Bundle:
    """The loaded preset (loading it the first time). Anything but an offered preset name is refused."""
    if not isinstance(name, str) or name not in available_presets():
        raise InvalidInput(f"unknown preset {name!r}; this machine offers {', '.join(available_presets())}")
    with _bundle_lock:
        if name not in _bundles:
            bundle = load_bundle(name)
            _warm_up(bundle)
            _bundles[name] = bundle
        return _bundles[name]


def _warm_up(bundle: Bundle) -> None:
    """One short pass through both code paths, so the first timed request is not a cold start."""
    ids = encode_prompt(bundle, "Hello!", True)
    target_greedy(bundle, ids, 4)
    engine_run(bundle, "Hello!", max_new_tokens=8)


def _bundle(name: Any) -> Bundle:
    try:
        return get_bundle(name)
    except InvalidInput as e:
        raise _refused(e) from None


def _drafters_of(name: str) -> list[str]:
    """The drafters a preset really has once loaded (a distilled drafter without weights is left out)."""
    return get_bundle(name).drafter_names


def _example_label(example: dict[str, Any], width: int = 58) -> str:
    text = " ".join(example["turns"][0].split())
    return f"{TASK_TITLES.get(example['category'], example['category'])} \u00b7 " + (
        text if len(text) <= width else text[: width - 1] + "\u2026")


def _policy_choices(drafters: list[str]) -> list[str]:
    return list(POLICIES) + [f"single:{d}" for d in drafters]


def _preset_info(name: str) -> str:
    if len(available_presets()) == 1:
        return f"{PRESETS[name].target.split('/')[-1]} on the CPU (hub presets need a CUDA GPU)"
    return "; ".join(f"{n}: {PRESETS[n].hardware}" for n in available_presets())


def _policy_info(name: str) -> str:
    if isinstance(name, str) and name.startswith("single:"):
        return f"**{name}**: {name.split(':', 1)[1]} alone, plain speculative decoding without a bandit"
    return f"**{name}**: {POLICY_HELP.get(name, 'unknown policy')}"


# ----------------------------------------------------------------------------------------------
# Generate: one page update per engine round.

# session -> the stop signals of its running generations (a session may run several through the API)
_stops: dict[str, set[threading.Event]] = {}
_stops_lock = threading.Lock()


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "api"


def _start_run(key: str, stop: threading.Event) -> None:
    with _stops_lock:
        _stops.setdefault(key, set()).add(stop)


def _end_run(key: str, stop: threading.Event) -> None:
    stop.set()
    with _stops_lock:
        runs = _stops.get(key)
        if runs is not None:
            runs.discard(stop)
            if not runs:
                del _stops[key]


def _refused(e: InvalidInput) -> gr.Error:
    """Bad input: its message, for the user (not a server fault, so no traceback in the log either)."""
    return gr.Error(str(e), print_exception=False)


def _failure(e: BaseException) -> gr.Error:
    """A message for the user about an unexpected fault; the log keeps the traceback. Out of memory
    frees what the failed request held, so the shared models serve the next request normally."""
    log.error("request failed", exc_info=e)
    # The traceback's frames hold the failed request's KV caches and drafters: let them go now (the
    # gr.Error raised from here keeps `e` as its context), so that out of memory can really be freed.
    traceback.clear_frames(e.__traceback__)
    e.__traceback__ = None
    if isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower():
        _free_memory()
        return gr.Error("Out of memory on this machine: try fewer new tokens, a shorter prompt, or again in a moment.",
                        print_exception=False)
    return gr.Error(f"Generation failed ({type(e).__name__}). Try a shorter prompt or fewer tokens.", print_exception=False)


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _checked(bundle: Bundle, prompt: Any, limit: int, **settings: Any) -> str:
    """Validate a request exactly as the engine will (metasd.validation, context length included)
    without running it; returns the cleaned prompt. Raises InvalidInput."""
    text = clean_prompt(prompt)
    generate(bundle, text, max_new_tokens_limit=limit, **settings).close()  # validates eagerly, runs nothing
    return text


def _baseline_key(preset: str, prompt: str, n: int) -> str:
    return json.dumps([preset, prompt, n])


STREAM_PLACEHOLDER = "prefill: reading the prompt ..."  # shared by live runs and replays: same final HTML
SPEEDUP_HINT = ("Speed-up needs the target alone on this prompt: press \u201cMeasure target alone\u201d "
                "or tick auto-measure.")
PLOT_INTERVAL_S = 0.5  # figures and the table refresh at most twice a second; the tokens up to FRAME_FPS
FRAME_FPS = float(os.environ.get("METASD_FRAME_FPS", "8"))  # frames a second at most (the token view)


def _stats(view: viz.LiveView, record: dict[str, Any], baselines: dict[str, Any] | None, note: str = "") -> str:
    """The stat cards: the engine's numbers, the speed-up against the target alone where measured, and
    how many frames the page drew for how many rounds."""
    base = (baselines or {}).get(_baseline_key(record["preset"], record["prompt"], view.new_tokens)) if view.rounds else None
    frames = record.get("frames")
    drawn = f" The page drew {frames[0]} frames for {frames[1]} rounds (several rounds per frame when the engine is fast)." \
        if frames else ""
    return viz.stats_html(view.stats(base["tokens_per_s"] if base else None),
                          (note or (base["note"] if base else SPEEDUP_HINT)) + drawn)


def _frame(view: viz.LiveView, record: dict[str, Any], baselines: dict[str, Any] | None, status: str | None,
           note: str = "") -> tuple:
    """Every view at once: token view, the two figures, the numbers, the per-drafter table, the plain text."""
    return (view.tokens_html(status), _plot(view.arm_json()), _plot(view.regret_json()),
            _stats(view, record, baselines, note), view.table(), view.text())


def _final_status(s: Summary) -> str:
    if s.stop_reason == "stopped":
        return f"stopped after {s.new_tokens} tokens ({s.target_calls} rounds): you pressed Stop"
    return (f"done: {s.new_tokens} tokens, {s.target_calls} target calls, {s.tokens_per_s:.1f} tokens/s "
            f"(engine clock), stopped by {s.stop_reason}")


@gpu
def generate_view(prompt: str, preset: str = DEFAULT_PRESET, drafters: list[str] | None = None,
                  policy: str = "metasd-ucb", reward: str = "bd", gamma: int = 4, max_new_tokens: int = 128,
                  temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, full_info: bool = False,
                  baselines: dict | None = None, request: gr.Request = None):
    """Stream a generation. The engine runs at full speed in its own worker (metasd.streaming); the page
    draws the latest state at most FRAME_FPS times a second (figures and table at most every
    PLOT_INTERVAL_S) and always ends on one complete final frame. Outputs: token view, arm
    probabilities, regret, numbers, per-drafter table, the answer as plain text, the run record."""
    bundle = _bundle(preset)
    names = bundle.drafter_names
    if drafters is not None and not isinstance(drafters, list | tuple | str):
        raise gr.Error("drafters must be a list of drafter names")
    if drafters is not None and len(drafters) == 0:
        raise gr.Error("Tick at least one drafter.")
    if (isinstance(drafters, list) and not set(drafters) <= set(names)
            and list(drafters) == _drafters_of(default_preset())):
        drafters = None  # the page's default list was sent along with another preset: use all of its drafters
    stop = threading.Event()
    try:
        text = clean_prompt(prompt)
        events = generate(bundle, text, drafters=list(drafters) if isinstance(drafters, list | tuple) else drafters,
                          policy=policy, reward=reward, gamma=gamma, max_new_tokens=max_new_tokens,
                          temperature=temperature, top_p=top_p, seed=seed, full_info=full_info, stop=stop,
                          max_new_tokens_limit=MAX_NEW_TOKENS)
    except InvalidInput as e:
        raise _refused(e) from None
    except Exception as e:  # e.g. the tokenizer failing on something validation let through
        raise _failure(e) from None
    key = _session(request)
    _start_run(key, stop)  # registered only now: a refused request leaves nothing behind
    record: dict[str, Any] = {"preset": bundle.preset.name, "prompt": text, "rounds": [], "summary": None,
                              "all_drafters": names, "drafters": list(drafters) if drafters else names,
                              "settings": {"policy": policy, "reward": reward, "gamma": gamma,
                                           "max_new_tokens": max_new_tokens, "temperature": temperature,
                                           "top_p": top_p, "seed": seed, "full_info": full_info}}
    view = viz.LiveView(viz.drafter_colors(names), record["drafters"], placeholder=STREAM_PLACEHOLDER)
    stream: EngineStream | None = None
    held = False
    plotted_at, plotted_rounds = -1e9, -1
    try:
        # At once: the previous answer goes and the page shows that this one has started (or waits).
        def start() -> EngineStream:  # the engine starts before the first frame is drawn: prefill runs meanwhile
            return EngineStream(events, stop, max_fps=FRAME_FPS, torch_threads=None if HAS_CUDA else TORCH_THREADS,
                                prefill_threads=None if HAS_CUDA else PREFILL_THREADS)

        held = MODEL.try_acquire()
        if held:
            stream = start()
        note = ("starting: prefill ..." if held else
                "waiting for the model: another user's Compare run has it for one more step ...")
        yield (*_frame(view, record, baselines, None, note), None)
        if not held:
            MODEL.acquire()
            held = True
            stream = start()
        assert stream is not None
        for batch, done in stream.batches():
            t_frame = time.perf_counter()
            for item in batch:
                view.add(item.event, item.t)
            record["frames"] = (stream.frames, stream.rounds)
            if done:
                record = {**record, "rounds": view.rounds, "summary": view.summary}
                status = _final_status(view.summary) if view.summary else "ended"
                yield (*_frame(view, record, baselines, status), record)
                break
            # The tokens go out every frame (appended text); the figures, numbers and table, which are
            # re-sent whole, at most every PLOT_INTERVAL_S, and less often as they grow.
            skip = gr.skip()
            slow: tuple[Any, ...] = (skip, skip, skip, skip)
            if t_frame - plotted_at >= PLOT_INTERVAL_S * (1 + len(view.rounds) / 100) and len(view.rounds) != plotted_rounds:
                note = f"round {len(view.rounds)} \u00b7 {view.new_tokens} tokens \u00b7 streaming ..."
                slow = (_plot(view.arm_json()), _plot(view.regret_json()), _stats(view, record, baselines, note), view.table())
                plotted_at, plotted_rounds = t_frame, len(view.rounds)
            yield (view.tokens_html(), *slow, view.text(), skip)
            stream.frame_cost(time.perf_counter() - t_frame)
    except InvalidInput as e:
        raise _refused(e) from None
    except Exception as e:  # shown as a message, never a traceback; the log keeps the details
        raise _failure(e) from None
    finally:
        if stream is not None:
            stream.close()  # the worker ends within a round and frees the drafters' and the target's caches
        else:
            events.close()
        if held:
            MODEL.release()
        _end_run(key, stop)


def _plot(figure_json: str) -> PlotData:
    return PlotData(type="plotly", plot=figure_json)


def _running():
    return gr.update(value="Running \u2026", interactive=False), gr.update(interactive=True)


def _idle():
    return gr.update(value="Run", interactive=True), gr.update(interactive=False)


HOW_TO_READ = """
- **Coloured, underlined token**: a drafter proposed it and the target accepted it. Each drafter has its own
  colour *and* underline style (legend above the tokens); hover a token for the drafter, p, q and min(1, p/q).
- **Plain token** (no colour): the target's own token. Every round ends with one: the correction after the first
  rejected draft token, or the **bonus token** when every drafted token was accepted.
- **Struck-through token**: drafted but rejected (or discarded after the first rejection). It is not part of the
  answer; untick *Show rejected draft tokens* to hide them.
- **\u2205**: a drafted token with no text of its own (a special token, or part of a character); **\u21b5**: a newline.
- **Accepted / call**: drafted tokens kept per target forward pass; each call also adds one token of the target's.
- **Arm probabilities**: how likely the bandit was to pick each drafter before each round. A drafter with nothing
  to propose that round (no match) is *asleep*: probability 0.
- **Regret**: tokens lost so far against always using the drafter that turned out best; *measured* with
  full-information feedback, *estimated* otherwise.
- **Speed-up**: the engine's tokens/s over the target alone on the same prompt, both measured here.
"""


def _signal(key: str) -> None:
    """Set the stop signal of every run registered under `key` (a session, or a session's Compare/Replay)."""
    with _stops_lock:
        runs = list(_stops.get(key, ()))
    for ev in runs:
        ev.set()


def stop_generation(request: gr.Request = None) -> None:
    """Stop button, or the tab closed: the session's running generations end at the next round. The
    stream then draws its final frame, so the page keeps everything generated so far."""
    _signal(_session(request))


def _private_stem(*parts: Any) -> Path:
    """`metasd-<part>-...-<timestamp>` inside a fresh directory with a random name: files are named by what
    they hold, and nobody can guess where they are (a run log holds the user's prompt)."""
    folder = TMP / uuid.uuid4().hex
    folder.mkdir(mode=0o700)
    names = [re.sub(r"[^A-Za-z0-9_-]+", "-", str(x)).strip("-") or "run" for x in parts]
    return folder / "-".join(["metasd", *names, time.strftime("%Y%m%d-%H%M%S")])


def write_logs(record: dict[str, Any] | None):
    """The per-round log as CSV and JSON, in the app's own temp dir, for the download buttons."""
    if not record or not record.get("rounds"):
        return gr.update(value=None, interactive=False), gr.update(value=None, interactive=False)
    _prune_tmp()
    stem = _private_stem(record["preset"], record["settings"].get("policy", "run"))
    viz.rounds_frame(record["rounds"]).to_csv(stem.with_suffix(".csv"), index=False)
    obj = run_document(record["prompt"], record["rounds"], record.get("summary"), preset=record["preset"],
                       target=PRESETS[record["preset"]].target if record["preset"] in PRESETS else "",
                       drafters=record.get("drafters") or list(record["rounds"][0].probabilities),
                       colors=viz.drafter_colors(record.get("all_drafters") or list(record["rounds"][0].probabilities)),
                       settings=record["settings"])
    stem.with_suffix(".json").write_text(json.dumps(obj, ensure_ascii=False, indent=1), encoding="utf-8")
    return (gr.update(value=str(stem.with_suffix(".csv")), interactive=True),
            gr.update(value=str(stem.with_suffix(".json")), interactive=True))


def _prune_tmp() -> None:
    """Keep the app's temp dir bounded over a long session: drop old entries (a run's folder of downloads,
    or a file), then the oldest beyond the cap."""
    max_age, max_files = TMP_MAX_AGE_S, TMP_MAX_FILES
    try:
        entries = sorted((e.stat().st_mtime, e) for e in TMP.iterdir())
    except OSError:
        return
    now = time.time()
    for i, (mtime, e) in enumerate(entries):
        if now - mtime > max_age or i < len(entries) - max_files:
            if e.is_dir():
                shutil.rmtree(e, ignore_errors=True)
            else:
                e.unlink(missing_ok=True)


def _measure_target(bundle: Bundle, prompt: str, n: int) -> tuple[list[int], float]:
    """The target alone, timed under the same torch threading as the engine's worker (a fair ratio)."""
    if not HAS_CUDA:
        torch.set_num_threads(TORCH_THREADS)
    ids = encode_prompt(bundle, prompt, True)
    with MODEL.hold():
        t = time.perf_counter()
        out = target_greedy(bundle, ids, n)
        return out, time.perf_counter() - t


@gpu
def measure_baseline(record: dict[str, Any] | None, baselines: dict | None, auto: bool = True, forced: bool = False):
    """The target alone on the same prompt and token count, timed in this session (cached per prompt)."""
    baselines = dict(baselines or {})
    if not record or not record.get("rounds") or not (auto or forced):
        return gr.skip(), baselines
    rounds = record["rounds"]
    n = rounds[-1].new_tokens
    key = _baseline_key(record["preset"], record["prompt"], n)
    if key not in baselines or forced:
        bundle = _bundle(record["preset"])
        try:
            out, secs = _measure_target(bundle, record["prompt"], n)
        except Exception as e:
            raise _failure(e) from None
        ours = [t for ev in rounds for t in ev.emitted]
        note = f"Target alone measured on this prompt in this session: {len(out)} tokens in {secs:.2f} s."
        if record["settings"]["temperature"] == 0:
            same = out[: len(ours)] == ours
            note += (" Output identical to the target's own greedy decoding \u2713" if same else
                     " Output differs from the target's greedy decoding (check for tied logits).")
        baselines[key] = {"tokens_per_s": len(out) / secs if secs > 0 else 0.0, "note": note}
    view = viz.LiveView(viz.drafter_colors(record["all_drafters"]), record["drafters"])
    for ev in [*rounds, record["summary"]]:
        if ev is not None:
            view.add(ev, 0.0)
    return _stats(view, record, baselines), baselines


# ----------------------------------------------------------------------------------------------
# Compare: drafters alone vs the bandit, on one prompt or a prompt set.


class Cancelled(Exception):
    """The Compare run was cancelled (its Cancel button, or the tab closed)."""


def _method_runs(bundle: Bundle, prompt: str, methods: list[str], max_new_tokens: int,
                 progress: Any, label: str, done: int, total: int,
                 cancel: threading.Event | None = None, started: float | None = None) -> tuple[dict[str, Any], float, list[int]]:
    """The target alone, then each method, on one prompt. Each run takes the model on its own (a Generate
    request can go in between), and the progress line says how long the rest will take at this pace."""
    started = time.perf_counter() if started is None else started

    def step(i: int, what: str) -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled
        left = ""
        if done + i > 0:
            per_run = (time.perf_counter() - started) / (done + i)
            left = f" \u00b7 about {per_run * (total - done - i):.0f} s left"
        progress((done + i, total), desc=f"{label}: {what}{left}")

    step(0, "target alone")
    ids, secs = _measure_target(bundle, prompt, max_new_tokens)
    base_tps = len(ids) / secs if secs > 0 else 0.0
    out: dict[str, Any] = {}
    for i, m in enumerate(methods, 1):
        step(i, m)
        drafters = [m.split(":", 1)[1]] if m.startswith("single:") else None
        with MODEL.hold():
            out[m] = engine_run(bundle, prompt, drafters=drafters, policy=m, max_new_tokens=max_new_tokens)
    return out, base_tps, ids


def _compare_key(request: gr.Request | None) -> str:
    return f"{_session(request)}#compare"


def _replay_key(request: gr.Request | None) -> str:
    return f"{_session(request)}#replay"


def cancel_compare(request: gr.Request = None) -> None:
    """Cancel: the session's Compare run ends before its next run, keeping the results so far."""
    _signal(_compare_key(request))


@gpu
def compare_prompt(prompt: str, preset: str, policy: str, max_new_tokens: int,
                   progress=gr.Progress(), request: gr.Request = None):  # noqa: B008  (gradio injects a tracker per call)
    """One prompt under each drafter alone and under the bandit, side by side."""
    bundle = _bundle(preset)
    names = bundle.drafter_names
    methods = [f"single:{d}" for d in names] + [policy]
    cancel = threading.Event()
    key = _compare_key(request)
    try:
        max_new_tokens = int(number("max_new_tokens", max_new_tokens, True, (1, COMPARE_MAX_NEW_TOKENS)))
        prompt = _checked(bundle, prompt, COMPARE_MAX_NEW_TOKENS, policy=policy, max_new_tokens=max_new_tokens)
        _start_run(key, cancel)
        runs, base_tps, ref = _method_runs(bundle, prompt, methods, max_new_tokens, progress, "prompt", 0,
                                           len(methods) + 1, cancel)
    except InvalidInput as e:
        raise _refused(e) from None
    except Cancelled:
        raise gr.Error("Cancelled.", print_exception=False) from None
    except Exception as e:
        raise _failure(e) from None
    finally:
        _end_run(key, cancel)
    colors = viz.drafter_colors(names)
    rows = [{"method": "target alone", "new_tokens": len(ref), "tokens_per_s": round(base_tps, 2), "speedup": 1.0,
             "identical_to_target": True}]
    cells = []
    for m, (rounds, s) in runs.items():
        rows.append(viz.method_row(m, s, base_tps, list(s.token_ids) == ref[: len(s.token_ids)], "this prompt"))
        cells.append(f"<div><h4>{viz._esc(m)} \u2014 {s.tokens_per_s:.1f} tok/s, "
                     f"{s.tokens_per_s / base_tps:.2f}\u00d7</h4>"
                     f"{viz.token_html(rounds, colors, legend=False)}</div>")
    df = pd.DataFrame(rows)
    grid = viz.legend_html(colors) + '<div class="cmp-grid">' + "".join(cells) + "</div>"
    shown = df[["method", "new_tokens", "tokens_per_s", "speedup", "mean_accepted", "acceptance_rate", "target_calls",
                "identical_to_target"]]
    return shown, grid, viz.speedup_bars(df.assign(category="this prompt"), colors)


@gpu
def compare_set(source: str, upload: Any, per_category: int, preset: str, policy: str, max_new_tokens: int,
                progress=gr.Progress(), request: gr.Request = None):  # noqa: B008  (gradio injects a tracker per call)
    """A prompt set: each drafter alone and the bandit on every prompt; acceptance heatmap and speed-up bars,
    updated after every prompt. Cancel ends it before its next run and keeps what it measured."""
    bundle = _bundle(preset)
    try:
        per_category = int(number("per_category", per_category, True))
        max_new_tokens = int(number("max_new_tokens", max_new_tokens, True, (1, COMPARE_MAX_NEW_TOKENS)))
        # The settings once, on a short prompt: policy and max new tokens are the same for every prompt.
        _checked(bundle, "settings check", COMPARE_MAX_NEW_TOKENS, policy=policy, max_new_tokens=max_new_tokens)
        if source == "upload":
            items = parse_prompt_set(_read_upload(upload))
        elif source == "examples":
            items = [{"question_id": e["question_id"], "category": e["category"], "prompt": e["turns"][0]} for e in EXAMPLES]
        else:
            raise InvalidInput(f"unknown prompt source {source!r}; choose examples or upload")
    except InvalidInput as e:
        raise _refused(e) from None
    items = viz.pick_per_category(items, per_category)
    if len(items) > COMPARE_MAX_PROMPTS:
        gr.Warning(f"Using the first {COMPARE_MAX_PROMPTS} of {len(items)} prompts.")
        items = items[:COMPARE_MAX_PROMPTS]
    methods = [f"single:{d}" for d in bundle.drafter_names] + [policy]
    per = len(methods) + 1
    colors = viz.drafter_colors(bundle.drafter_names)
    rows: list[dict[str, Any]] = []
    cancel = threading.Event()
    key = _compare_key(request)
    _start_run(key, cancel)
    started = time.perf_counter()
    cancelled_at = None
    try:
        for k, it in enumerate(items):
            try:
                runs, base_tps, ref = _method_runs(bundle, it["prompt"], methods, max_new_tokens, progress,
                                                   f"{it['category']} {k + 1}/{len(items)}", k * per, len(items) * per,
                                                   cancel, started)
            except InvalidInput as e:  # e.g. a prompt longer than the model's context
                gr.Warning(f"Skipped {it['question_id']}: {e}")
                continue
            except Cancelled:
                cancelled_at = k
                break
            except Exception as e:
                raise _failure(e) from None
            for m, (_, s) in runs.items():
                rows.append(viz.method_row(m, s, base_tps, list(s.token_ids) == ref[: len(s.token_ids)],
                                           it["category"], it["question_id"]))
            if k + 1 < len(items):  # the results so far, while the rest runs
                df = pd.DataFrame(rows)
                yield viz.acceptance_heatmap(df), viz.speedup_bars(df, colors), df, gr.skip()
    finally:
        _end_run(key, cancel)
    if not rows:
        raise gr.Error("Cancelled before the first prompt finished." if cancelled_at is not None
                       else "No prompt of the set could be run (see the warnings).", print_exception=False)
    if cancelled_at is not None:
        gr.Warning(f"Cancelled: results for {cancelled_at} of {len(items)} prompts.")
    df = pd.DataFrame(rows)
    _prune_tmp()
    path = _private_stem("compare", preset).with_suffix(".csv")
    df.to_csv(path, index=False)
    yield viz.acceptance_heatmap(df), viz.speedup_bars(df, colors), df, gr.update(value=str(path), interactive=True)


def _read_upload(upload: Any) -> bytes:
    """The bytes of the file gradio stored for this request (it accepts only its own uploads), size-checked
    before reading."""
    path = getattr(upload, "path", None) or getattr(upload, "name", None) or upload
    if not path or not isinstance(path, str | os.PathLike):
        raise InvalidInput("Upload a JSONL file (question_id, category, turns) first.")
    try:
        size = os.stat(path).st_size
        if size > PROMPT_SET_MAX_BYTES:
            raise InvalidInput(f"the prompt file has {size:,} bytes; the limit is {PROMPT_SET_MAX_BYTES:,}")
        with open(path, "rb") as f:
            return f.read(PROMPT_SET_MAX_BYTES + 1)
    except OSError:
        raise InvalidInput("the uploaded file could not be read; upload it again") from None


# ----------------------------------------------------------------------------------------------
# Replay: a saved run (the CLI's --json, the page's JSON download, or the gallery) streamed like a live one.

RUNS_DIR = ASSETS / "runs"


def gallery() -> list[tuple[str, str]]:
    """(label, name) of every recorded run in assets/runs/, the examples' task first."""
    titles = {e["question_id"]: f"{TASK_TITLES.get(e['category'], e['category'])} \u00b7 {e['question_id']}" for e in EXAMPLES}
    return [(titles.get(p.stem, p.stem), p.stem) for p in sorted(RUNS_DIR.glob("*.json"))]


def _replay_source(run_file: Any, name: Any) -> tuple[Replay, str]:
    """The run to replay: an uploaded run file, else a gallery entry by name (only names the gallery lists)."""
    if run_file:
        path = getattr(run_file, "path", None) or getattr(run_file, "name", None) or run_file
        if not isinstance(path, str | os.PathLike):
            raise InvalidInput("upload a run file (JSON)")
        try:
            if os.stat(path).st_size > RUN_MAX_BYTES:
                raise InvalidInput(f"the run file has {os.stat(path).st_size:,} bytes; the limit is {RUN_MAX_BYTES:,}")
            with open(path, "rb") as f:
                return parse_run(f.read(RUN_MAX_BYTES + 1)), Path(path).name
        except OSError:
            raise InvalidInput("the uploaded file could not be read; upload it again") from None
    names = [n for _, n in gallery()]
    if not name:
        raise InvalidInput("choose a recorded run or upload a run file")
    if name not in names:
        raise InvalidInput(f"no recorded run named {name!r}")
    return parse_run((RUNS_DIR / f"{name}.json").read_bytes()), str(name)


def _replay_setup(run: Replay) -> tuple[viz.LiveView, dict[str, Any]]:
    names = list(dict.fromkeys([*run.drafters, *(ev.drafter for ev in run.rounds)]))
    view = viz.LiveView(run.colors or viz.drafter_colors(names), run.drafters, placeholder=STREAM_PLACEHOLDER)
    record = {"preset": run.preset, "prompt": run.prompt}
    return view, record


def _replay_note(run: Replay, label: str) -> str:
    return (f"Replay of {label}: recorded on the {run.preset or 'unknown'} preset; the numbers are the recording's "
            f"(engine clock), not this machine's.")


def replay_view(run_file: Any = None, name: str = "", speed: float = 2.0, request: gr.Request = None):
    """Stream a saved run as /generate streams a live one, paced by its recorded round times / speed."""
    try:
        speed = float(number("speed", speed, False, (0.25, 64.0)))
        run, label = _replay_source(run_file, name)
    except InvalidInput as e:
        raise _refused(e) from None
    stop = threading.Event()
    key = _replay_key(request)
    _start_run(key, stop)
    view, record = _replay_setup(run)
    note = _replay_note(run, label)
    try:
        yield _frame(view, record, None, None, note)
        t0, clock, shown = time.perf_counter(), 0.0, -1.0
        for ev in run.rounds:
            if stop.is_set():
                break
            clock += (ev.draft_ms + ev.verify_ms + ev.overhead_ms) / 1000.0
            wait = t0 + clock / speed - time.perf_counter()
            if wait > 0:
                stop.wait(wait)
            view.add(ev, clock)
            if time.perf_counter() - shown >= 1.0 / FRAME_FPS:
                shown = time.perf_counter()
                yield (view.tokens_html(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), view.text())
        if len(view.rounds) == len(run.rounds) and run.summary is not None:
            view.add(run.summary, run.summary.wall_s)
            status = _final_status(run.summary)  # exactly the status line the live run ended on
        else:
            status = f"replay stopped at round {len(view.rounds)} of {len(run.rounds)}"
        yield _frame(view, record, None, status, note)
    finally:
        _end_run(key, stop)


def replay_at(run_file: Any, name: str, k: Any):
    """The replay's state after round k (the round slider): every view as it was then."""
    try:
        run, label = _replay_source(run_file, name)
        k = int(number("round", k, True, (0, len(run.rounds))))
    except InvalidInput as e:
        raise _refused(e) from None
    view, record = _replay_setup(run)
    for ev in run.rounds[:k]:
        view.add(ev, view.engine_s + (ev.draft_ms + ev.verify_ms + ev.overhead_ms) / 1000.0)
    status = None
    if k == len(run.rounds) and run.summary is not None:
        view.add(run.summary, run.summary.wall_s)
        status = _final_status(run.summary)
    return _frame(view, record, None, status if status else f"round {k} of {len(run.rounds)}", _replay_note(run, label))


def replay_rounds(run_file: Any, name: str):
    """The round slider's range for the chosen run."""
    try:
        run, _ = _replay_source(run_file, name)
    except InvalidInput:
        return gr.update(maximum=1, value=0)
    return gr.update(maximum=len(run.rounds), value=len(run.rounds))


def stop_replay(request: gr.Request = None) -> None:
    _signal(_replay_key(request))


def open_link(request: gr.Request):
    """`?run=<name>` opens the Replay tab on that recorded run (only names the gallery lists)."""
    name = (getattr(request, "query_params", None) or {}).get("run") if request else None
    if name and name in {n for _, n in gallery()}:
        return gr.Tabs(selected="replay"), gr.update(value=name)
    return gr.skip(), gr.skip()


# ----------------------------------------------------------------------------------------------
# Bandit playground: synthetic drafters, thousands of rounds, no model.

PLAYGROUND_DRAFTERS = pd.DataFrame(
    [["prompt lookup", 0.45, 0.0], ["token recycling", 0.55, 0.02], ["small LM", 0.75, 0.08], ["large LM", 0.9, 0.35]],
    columns=["drafter", "acceptance", "cost"],
)


def run_playground(table: pd.DataFrame, policies: list[str], gamma: int, rounds: int, reward: str, full_info: bool,
                   spread: float, seed: int):
    try:
        rows = table.to_dict("records") if isinstance(table, pd.DataFrame) else table
        st = validate_playground(rows, policies, gamma, rounds, reward, full_info, spread, seed)
    except InvalidInput as e:
        raise gr.Error(f"Playground settings: {e}") from None
    drafters = [SynthDrafter(name, acc, cost) for name, acc, cost in st.drafters]
    gamma = st.gamma
    try:
        results = compare(list(st.policies), drafters, gamma=st.gamma, rounds=st.rounds, reward=st.reward,
                          full_info=st.full_info, spread=st.spread, seed=st.seed)
    except (ValueError, TypeError, KeyError) as e:
        raise gr.Error(f"Playground settings: {e}") from None
    colors = viz.drafter_colors([d.name for d in drafters])
    best = results[0].best
    lines = ["| drafter | E[tokens / call] | speed-up E[tokens]/(\u03b3c+1) |", "|---|---|---|"]
    for i, d in enumerate(drafters):
        mark = " **(best)**" if i == best else ""
        lines.append(f"| {d.name}{mark} | {expected_tokens(d.acceptance, int(gamma)):.2f} | "
                     f"{expected_speedup(d.acceptance, int(gamma), d.cost):.2f}\u00d7 |")
    return (viz.playground_probability_figure(results, colors), viz.playground_regret_figure(results),
            viz.playground_table(results), "\n".join(lines))


EXPLAIN = r"""
### Speculative decoding
A cheap **drafter** proposes $\gamma$ tokens; the **target** checks them all in one forward pass.
Draft token $x$ (drafter probability $q(x)$, target probability $p(x)$) is accepted with probability
$$\min\left(1, \frac{p(x)}{q(x)}\right)$$
At the first rejection a replacement is sampled from $\mathrm{norm}(\max(0, p - q))$; if all $\gamma$ pass, the
target adds a **bonus token**. The output has exactly the target's distribution (lossless). Per position the
acceptance rate is $\beta = \sum_x \min(p(x), q(x)) = 1 - \mathrm{TV}(p, q)$, and with i.i.d. acceptance $\alpha$
$$\mathbb{E}[\text{tokens per target call}] = \frac{1 - \alpha^{\gamma + 1}}{1 - \alpha}, \qquad
\text{speed-up} = \frac{1 - \alpha^{\gamma + 1}}{(1 - \alpha)(\gamma c + 1)}$$
where $c$ is the cost of one drafter step relative to one target step.

### The bandit
Each drafter is an **arm**; every round a policy picks one and observes a **reward** in $[0, 1]$.
MetaSD's block divergence uses the target's distributions at every drafted position,
$$r_{BD} = \frac{1}{\gamma} \sum_{j=1}^{\gamma} \left(1 - \mathrm{TV}(p_j, q_j)\right),$$
far less noisy than the block efficiency $r_{BE} = \text{accepted} / \gamma$. MetaSD-UCB pulls every arm once, then
$$a_t = \arg\max_i \; \hat{\mu}_i + \beta \sqrt{\frac{2 \ln t}{n_i}}$$
With **full-information feedback** every drafter is scored on every verified chunk, and Hedge plays
$P(i) \propto \exp(\eta \sum_s r_{i,s})$, whose regret grows with $\log K$ rather than $K$.
Neither $r_{BD}$ nor $r_{BE}$ sees the drafter's cost; the **throughput** reward does.

### Regret
Tokens lost against the best drafter in hindsight. Here, with known rates: in the time $\tau_{a_t} = \gamma c_{a_t} + 1$
the chosen drafter used, the best one would have produced $v^* \tau_{a_t}$ tokens ($v_i$ = expected tokens per target step), so
$$R_T = \sum_{t=1}^{T} \left( v^* \tau_{a_t} - \mathbb{E}[\text{tokens}_{a_t}] \right)$$
Good policies bend the curve flat (logarithmic); a cost-blind reward with an expensive, accurate drafter keeps it rising.
"""


# ----------------------------------------------------------------------------------------------
# The page


def _as_sent(payload: Any) -> Any:
    return payload


def _take_as_sent(*components: gr.components.Component) -> None:
    """Numbers reach the handlers as sent: metasd.validation checks their type and range, and its message
    names the setting (gradio's own check says only "Value 99 is greater than maximum value 16", and a
    wrong type gets no message at all). Set on the instance: a gradio subclass would write a .pyi file."""
    for c in components:
        c.preprocess = _as_sent


def build_demo() -> gr.Blocks:
    presets = available_presets()
    preset0 = default_preset()
    drafters0 = _drafters_of(preset0)
    gamma0 = PRESETS[preset0].gamma
    # delete_cache: gradio's copies of served files (run logs hold prompts) go after an hour.
    # analytics_enabled=False in code: the app never phones home, whatever the host's environment says.
    with gr.Blocks(title="MetaSD Studio", delete_cache=(TMP_MAX_AGE_S, TMP_MAX_AGE_S), analytics_enabled=False) as demo:
        baselines = gr.State({})
        record = gr.State(None)
        gr.HTML(
            '<div id="hero"><h1>MetaSD Studio <span class="pill">'
            + ("GPU" if HAS_CUDA else "CPU \u00b7 offline")
            + "</span></h1><p>Multi-drafter speculative decoding: a bandit picks, round by round, which drafter "
            "proposes the next tokens; the target verifies them losslessly. Every token is coloured by the drafter "
            "that proposed it.</p></div>"
        )
        with gr.Tabs(elem_id="tabs") as tabs:
            # ---------------------------------------------------------------- Generate
            with gr.Tab("Generate", id="generate"):
                with gr.Row(equal_height=False, elem_id="gen-row"):
                    # Left: what to run. Only the prompt, Run/Stop and the two most used settings are open,
                    # so that at projector size (1280x720) the answer on the right is on the first screen.
                    with gr.Column(scale=4, min_width=300, elem_id="controls"):
                        prompt = gr.Textbox(label="Prompt", lines=4, max_lines=10, elem_id="prompt",
                                            info=f"Up to {MAX_PROMPT_CHARS:,} characters. Ctrl+Enter runs, Esc stops.",
                                            placeholder="Ask something, or pick an example below",
                                            value=EXAMPLES[PAGE_EXAMPLE]["turns"][0])
                        with gr.Row():
                            run_btn = gr.Button("Run", variant="primary", elem_id="run", scale=3)
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="stop", scale=1, interactive=False)
                        with gr.Row():
                            max_new_tokens = gr.Slider(8, MAX_NEW_TOKENS, value=128, step=8, label="Max new tokens",
                                                       elem_id="max-new-tokens", scale=1, min_width=140)
                            policy = gr.Dropdown(_policy_choices(drafters0), value=PAGE_POLICY, label="Policy", scale=1,
                                                 allow_custom_value=True, min_width=140)
                        policy_help = gr.Markdown(_policy_info(PAGE_POLICY), elem_classes="compact-md")
                        # One list, each example named by its task; page 1 holds one example of every task.
                        shown = sorted(EXAMPLES, key=lambda e: ([x for x in EXAMPLES if x["category"] == e["category"]].index(e),
                                                                TASKS.index(e["category"])))
                        gr.Examples([[e["turns"][0]] for e in shown], inputs=[prompt], label="Examples",
                                    example_labels=[_example_label(e) for e in shown], examples_per_page=len(TASKS),
                                    elem_id="examples")
                        with gr.Accordion("More settings: preset, drafters, reward, \u03b3, sampling", open=False,
                                          elem_id="settings"):
                            preset = gr.Dropdown(presets, value=preset0, label="Preset", info=_preset_info(preset0),
                                                 interactive=len(presets) > 1)
                            drafters = gr.CheckboxGroup(drafters0, value=get_bundle(preset0).default_drafters,
                                                        label="Drafters (tick any subset)")
                            reward = gr.Radio(REWARD_CHOICES, value="bd", label="Reward")
                            with gr.Row():
                                gamma = gr.Slider(1, 16, value=gamma0, step=1, label="Draft length \u03b3")
                                seed = gr.Number(0, label="Seed", precision=0, minimum=0, maximum=2**32 - 1, min_width=90)
                            with gr.Row():
                                temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
                                top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
                            full_info = gr.Checkbox(False, label="Full-information feedback: score every drafter on every "
                                                    "verified chunk (measured regret; Hedge needs it)")
                    # Right: the answer, its numbers, and how to read them.
                    with gr.Column(scale=6, min_width=320, elem_id="answer"):
                        empty = viz.LiveView(viz.drafter_colors(drafters0), drafters0,
                                             placeholder="Press Run (or Ctrl+Enter) to stream tokens here.")
                        tokens = gr.HTML(empty.tokens_html(""), elem_id="tokens", js_on_load=None)
                        stats = gr.HTML(viz.stats_html(viz.live_stats([], 0.0)), elem_id="stats", js_on_load=None)
                        with gr.Row():
                            show_rejected = gr.Checkbox(True, label="Show rejected draft tokens", scale=0, min_width=220)
                            auto_base = gr.Checkbox(True, label="Measure the target alone after each run",
                                                    scale=0, min_width=300)
                            measure_btn = gr.Button("Measure target alone", size="sm", scale=0, min_width=170)
                        with gr.Accordion("The answer as plain text", open=False):
                            answer_text = gr.Textbox(show_label=True, label="Answer", lines=4, max_lines=12,
                                                     interactive=False, buttons=["copy"], elem_id="answer-text")
                        with gr.Accordion("How to read this", open=False, elem_id="how-to-read"):
                            gr.Markdown(HOW_TO_READ, elem_classes="compact-md")
                        # The plots under the answer, in the same column: at 1920x1080 answer and plots fit at once.
                        with gr.Row(equal_height=False):
                            with gr.Column(min_width=300):
                                arm_plot = gr.Plot(_plot(empty.arm_json()), elem_id="arm-probabilities", show_label=False)
                                gr.Markdown("The policy's probability of choosing each drafter before every round "
                                            "(stacked); the ticks below mark the drafter it pulled.", elem_classes="caption")
                            with gr.Column(min_width=300):
                                regret_plot = gr.Plot(_plot(empty.regret_json()), elem_id="regret", show_label=False)
                                gr.Markdown("Tokens lost so far against always using the drafter that was best in "
                                            "hindsight; a curve that flattens means the bandit found it.",
                                            elem_classes="caption")
                with gr.Row():
                    table = gr.DataFrame(viz.drafter_table([], drafters0), label="Per drafter", interactive=False,
                                         elem_id="drafter-table", scale=4)
                    with gr.Column(scale=1, min_width=200):
                        gr.Markdown("**Per-round log** (also of a stopped run)", elem_classes="compact-md")
                        csv_btn = gr.DownloadButton("CSV", size="sm", interactive=False)
                        json_btn = gr.DownloadButton("JSON", size="sm", interactive=False)

                gen_inputs = [prompt, preset, drafters, policy, reward, gamma, max_new_tokens, temperature, top_p, seed,
                              full_info, baselines]
                gen_outputs = [tokens, arm_plot, regret_plot, stats, table, answer_text, record]
                # Run: the buttons say at once that something runs (no queue round trip), then the stream.
                busy = gr.on([run_btn.click, prompt.submit], _running, None, [run_btn, stop_btn], queue=False,
                             api_visibility="private", trigger_mode="once")
                gen = busy.then(generate_view, gen_inputs, gen_outputs, api_name="generate",
                                concurrency_limit=GEN_CONCURRENCY, concurrency_id="model", show_progress="full",
                                show_progress_on=[tokens])
                # A refused request (gr.Error) ends the chain in the browser: give the buttons back there too.
                gen.failure(_idle, None, [run_btn, stop_btn], api_visibility="private", queue=False)
                after = gen.then(_idle, None, [run_btn, stop_btn], api_visibility="private", queue=False)
                after = after.then(write_logs, record, [csv_btn, json_btn], api_visibility="private", queue=False)
                after.then(measure_baseline, [record, baselines, auto_base], [stats, baselines], api_visibility="private",
                           concurrency_limit=GEN_CONCURRENCY, concurrency_id="model", show_progress="minimal")
                # Stop only signals the engine: the stream then ends on its own final frame and keeps the answer
                # (a gradio `cancels` would throw the frame away and reset the outputs).
                stop_btn.click(stop_generation, None, None, api_visibility="private", queue=False)
                measure_btn.click(lambda r, b: measure_baseline(r, b, True, True), [record, baselines], [stats, baselines],
                                  api_visibility="private", concurrency_limit=GEN_CONCURRENCY, concurrency_id="model")
                show_rejected.change(None, show_rejected, None,
                                     js="(v) => { document.getElementById('tokens').classList.toggle('hide-rejected', !v); }")

                def on_preset(name: str):
                    if name not in presets:
                        raise gr.Error(f"unknown preset {name!r}")
                    names = _drafters_of(name)
                    return (gr.update(choices=names, value=get_bundle(name).default_drafters),
                            gr.update(choices=_policy_choices(names), value=PAGE_POLICY),
                            gr.update(value=PRESETS[name].gamma))

                policy.change(_policy_info, policy, policy_help, api_visibility="private", queue=False)
                preset.change(on_preset, preset, [drafters, policy, gamma], api_visibility="private",
                              concurrency_limit=1, concurrency_id="load")

            # ---------------------------------------------------------------- Compare
            with gr.Tab("Compare", id="compare"):
                gr.Markdown("Each drafter alone (`single:<name>`) and the bandit, greedy, against the target alone measured "
                            "in the same run. Speed-ups are measured, never computed from formulas.", elem_classes="compact-md")
                with gr.Row():
                    c_preset = gr.Dropdown(presets, value=preset0, label="Preset", scale=1)
                    c_policy = gr.Dropdown([n for n in POLICIES], value="metasd-ucb", label="Bandit policy", scale=1)
                    c_tokens = gr.Slider(8, COMPARE_MAX_NEW_TOKENS, value=64, step=8, label="Max new tokens", scale=2,
                                         elem_id="compare-max-new-tokens")
                with gr.Accordion("One prompt, side by side", open=True):
                    c_prompt = gr.Textbox(label="Prompt", lines=3, value=EXAMPLES[2]["turns"][0])
                    c_btn = gr.Button("Compare drafters on this prompt", variant="primary")
                    c_table = gr.DataFrame(label="Methods (greedy; speed-up against the target alone, measured here)",
                                           interactive=False)
                    c_bars = gr.Plot(viz.empty_figure("Speed-up over the target alone", "compare to see the bars"),
                                     show_label=False)
                    c_views = gr.HTML(js_on_load=None)
                    c_btn.click(compare_prompt, [c_prompt, c_preset, c_policy, c_tokens], [c_table, c_views, c_bars],
                                api_name="compare", concurrency_limit=1, concurrency_id="compare")
                with gr.Accordion("A prompt set: acceptance by drafter and task", open=True):
                    with gr.Row():
                        s_source = gr.Radio([("built-in examples", "examples"), ("uploaded JSONL", "upload")],
                                            value="examples", label="Prompts")
                        s_file = gr.File(label="Spec-Bench JSONL (question_id, category, turns)", file_types=[".jsonl", ".json"])
                        s_per = gr.Slider(1, 10, value=1, step=1, label="Prompts per category")
                    with gr.Row():
                        s_btn = gr.Button("Run the prompt set", variant="primary", scale=3, elem_id="compare-run")
                        s_cancel = gr.Button("Cancel", variant="stop", scale=1, elem_id="compare-cancel")
                    gr.Markdown("Runs share the model with the Generate tab one step at a time: other users' answers are "
                                "served between the steps. Cancel keeps the results so far.", elem_classes="compact-md")
                    with gr.Row():
                        s_heat = gr.Plot(viz.acceptance_heatmap(pd.DataFrame()), show_label=False)
                        s_bars = gr.Plot(viz.empty_figure("Speed-up over the target alone", "run a prompt set"),
                                         show_label=False)
                    s_table = gr.DataFrame(pd.DataFrame(columns=["method", "question_id", "category", "tokens_per_s",
                                                                 "speedup", "acceptance_rate"]),
                                           label="Results (one row per method and prompt)", interactive=False, max_height=320)
                    s_csv = gr.DownloadButton("Download results.csv", size="sm", interactive=False)
                    s_btn.click(compare_set, [s_source, s_file, s_per, c_preset, c_policy, c_tokens],
                                [s_heat, s_bars, s_table, s_csv], api_name="compare_set",
                                concurrency_limit=1, concurrency_id="compare")
                    s_cancel.click(cancel_compare, None, None, api_visibility="private", queue=False)

            # ---------------------------------------------------------------- Replay
            with gr.Tab("Replay", id="replay"):
                gr.Markdown("Replay a recorded run at any speed, without a model: prepare runs before class (on a GPU "
                            "too), then play them here, or step through them round by round. Share one with a link: "
                            "`?run=<name>`. Upload the JSON from *Per-round log* or `python -m metasd generate --json`.",
                            elem_classes="compact-md")
                runs = gallery()
                with gr.Row(equal_height=False):
                    with gr.Column(scale=4, min_width=300):
                        r_name = gr.Dropdown(runs, value=runs[0][1] if runs else None, label="Recorded runs",
                                             elem_id="replay-run")
                        r_file = gr.File(label="... or a run file (JSON)", file_types=[".json"], elem_id="replay-file")
                        r_speed = gr.Slider(0.25, 16, value=2, step=0.25, label="Speed \u00d7 (1 = as recorded)",
                                            elem_id="replay-speed")
                        with gr.Row():
                            r_play = gr.Button("Play", variant="primary", elem_id="replay-play", scale=3)
                            r_stop = gr.Button("Stop", variant="stop", elem_id="replay-stop", scale=1)
                        r_round = gr.Slider(0, 1, value=0, step=1, label="Round (drag to step through the run)",
                                            elem_id="replay-round")
                    with gr.Column(scale=6, min_width=320):
                        r_tokens = gr.HTML(empty.tokens_html(""), elem_id="replay-tokens", js_on_load=None)
                        r_stats = gr.HTML(viz.stats_html(viz.live_stats([], 0.0)), elem_id="replay-stats", js_on_load=None)
                        with gr.Accordion("The answer as plain text", open=False):
                            r_text = gr.Textbox(label="Answer", lines=4, max_lines=12, interactive=False, buttons=["copy"])
                        with gr.Row(equal_height=False):
                            r_arm = gr.Plot(_plot(empty.arm_json()), show_label=False, min_width=300)
                            r_regret = gr.Plot(_plot(empty.regret_json()), show_label=False, min_width=300)
                        r_table = gr.DataFrame(viz.drafter_table([], drafters0), label="Per drafter", interactive=False)
                r_outputs = [r_tokens, r_arm, r_regret, r_stats, r_table, r_text]
                played = r_play.click(replay_view, [r_file, r_name, r_speed], r_outputs, api_name="replay",
                                      concurrency_limit=8, concurrency_id="replay", show_progress="hidden")
                played.then(replay_rounds, [r_file, r_name], r_round, api_visibility="private", queue=False)
                r_stop.click(stop_replay, None, None, api_visibility="private", queue=False)
                # Dragging or typing a round: the latest position wins, the others are dropped on the way.
                r_round.input(replay_at, [r_file, r_name, r_round], r_outputs, api_visibility="private",
                              concurrency_limit=8, concurrency_id="replay", trigger_mode="always_last",
                              show_progress="hidden")
                demo.load(open_link, None, [tabs, r_name], api_visibility="private", queue=False)

            # ---------------------------------------------------------------- Playground
            with gr.Tab("Bandit playground", id="playground"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=5):
                        p_table = gr.DataFrame(PLAYGROUND_DRAFTERS, interactive=True,
                                               label="Synthetic drafters (edit: acceptance \u03b1 in [0, 1], "
                                               "cost c = drafter step / target step)",
                                               datatype=["str", "number", "number"], row_count=4)
                        p_policies = gr.CheckboxGroup(list(POLICIES), value=["metasd-ucb", "exp3", "thompson", "hedge"],
                                                      label="Policies, side by side")
                        with gr.Row():
                            p_reward = gr.Radio(REWARD_CHOICES, value="throughput", label="Reward",
                                                info="try block divergence: it ignores cost and picks the large LM")
                            p_full = gr.Checkbox(False, label="Full-information feedback for all")
                        with gr.Row():
                            p_gamma = gr.Slider(1, 16, value=4, step=1, label="\u03b3")
                            p_rounds = gr.Slider(100, 20000, value=3000, step=100, label="Rounds")
                            p_spread = gr.Slider(0.5, 50, value=8, step=0.5, label="Context spread \u03ba")
                            p_seed = gr.Number(0, label="Seed", precision=0, minimum=0)
                        p_btn = gr.Button("Simulate", variant="primary")
                        p_values = gr.Markdown()
                    with gr.Column(scale=5, elem_classes="explain"):
                        gr.Markdown(EXPLAIN, latex_delimiters=[{"left": "$$", "right": "$$", "display": True},
                                                               {"left": "$", "right": "$", "display": False}])
                p_regret = gr.Plot(show_label=False)
                p_probs = gr.Plot(show_label=False)
                p_summary = gr.DataFrame(label="Policies", interactive=False)
                p_inputs = [p_table, p_policies, p_gamma, p_rounds, p_reward, p_full, p_spread, p_seed]
                p_btn.click(run_playground, p_inputs, [p_probs, p_regret, p_summary, p_values], api_name="playground",
                            concurrency_limit=4)
                demo.load(run_playground, p_inputs, [p_probs, p_regret, p_summary, p_values], api_visibility="private")
        # A closed tab ends its generation (gradio also drops the run when the page's stream closes).
        demo.unload(stop_generation)
        demo.unload(cancel_compare)
        demo.unload(stop_replay)
        _take_as_sent(gamma, max_new_tokens, temperature, top_p, seed, c_tokens, s_per, p_gamma, p_rounds, p_spread, p_seed,
                      r_speed, r_round)
    return demo


# Fonts as gradio Font objects, never plain strings: launch() compares the theme with the built-in
# ones and a plain string breaks that comparison. System fonts only: the page loads nothing from outside.
THEME = gr.themes.Soft(primary_hue="indigo", neutral_hue="slate",
                       font=[gr.themes.Font(f) for f in ("Inter", "ui-sans-serif", "system-ui", "sans-serif")],
                       font_mono=[gr.themes.Font(f) for f in ("ui-monospace", "JetBrains Mono", "Menlo", "monospace")]).set(
    # WCAG AA contrast (4.5:1): the Soft theme's indigo-500 labels, buttons and tabs and its slate-400 hints
    # fall short (axe-core counts 8+ findings on a bare page); one or two shades darker pass.
    block_label_text_color="*primary_700", block_title_text_color="*primary_700", color_accent="*primary_600",
    body_text_color_subdued="*neutral_600", input_placeholder_color="*neutral_500",
    button_primary_background_fill="*primary_600", button_primary_background_fill_hover="*primary_700",
    button_primary_border_color="*primary_600", button_primary_border_color_hover="*primary_700",
    checkbox_label_background_fill_selected="*primary_600", slider_color="*primary_600",
)
CSS = (ASSETS / "style.css").read_text(encoding="utf-8")
# Keyboard: Ctrl+Enter (Cmd+Enter) runs, Esc stops. Captured before the text box sees the keys, so a
# Ctrl+Enter in the prompt does not also submit it a second time.
HEAD = """<script>
// On a narrow screen the answer sits below the settings: bring it into view when a run starts.
const showAnswer = () => setTimeout(() => {
  const t = document.getElementById("tokens");
  if (t && t.getBoundingClientRect().top > window.innerHeight * 0.6) t.scrollIntoView({behavior: "smooth", block: "start"});
}, 50);
document.addEventListener("click", (e) => { if (e.target.closest && e.target.closest("#run")) showAnswer(); }, true);
document.addEventListener("keydown", (e) => {
  const click = (id) => {
    const b = document.getElementById(id);
    if (b && !b.disabled) { b.click(); return true; }
    return false;
  };
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
    if (click("run")) { e.preventDefault(); e.stopPropagation(); showAnswer(); }
  }
  else if (e.key === "Escape") { click("stop"); }
}, true);
</script>"""


def server_address() -> tuple[str, int]:
    """127.0.0.1 by default; 0.0.0.0 where the host says so ($GRADIO_SERVER_NAME, $PORT, $SPACE_ID)."""
    hosted = bool(os.environ.get("PORT") or os.environ.get("SPACE_ID"))
    host = os.environ.get("GRADIO_SERVER_NAME") or ("0.0.0.0" if hosted else "127.0.0.1")
    port = int(os.environ.get("PORT") or os.environ.get("GRADIO_SERVER_PORT") or 7860)
    return host, port


def launch(demo: gr.Blocks | None = None, host: str | None = None, port: int | None = None, **kwargs: Any):
    """Queue (bounded) and serve the page; returns what Blocks.launch returns."""
    demo = demo or build_demo()
    h, p = server_address()
    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=GEN_CONCURRENCY)
    kwargs.setdefault("share", False)  # no public share link unless the caller asks for one
    # Files are served only from the app's temp dir (and gradio's own upload/cache dirs); the source
    # tree and the model cache are blocked outright, whatever else is configured.
    served = [TMP.resolve(), Path(gr.utils.get_upload_folder()).resolve()]
    blocked = [str(d.resolve()) for d in (ROOT, cache_root()) if not any(x.is_relative_to(d.resolve()) for x in served)]
    return demo.launch(server_name=host or h, server_port=port or p, theme=THEME, css=CSS, head=HEAD, footer_links=["api"],
                       allowed_paths=[str(TMP)], blocked_paths=blocked, max_file_size=PROMPT_SET_MAX_BYTES, **kwargs)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="MetaSD Studio: the live visualizer")
    ap.add_argument("--host", default=None, help="bind address (default 127.0.0.1, or 0.0.0.0 when hosted)")
    ap.add_argument("--port", type=int, default=None, help="port (default $PORT or 7860)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    get_bundle(default_preset())  # models load once, at start-up
    launch(host=a.host, port=a.port)


if __name__ == "__main__":
    main()
