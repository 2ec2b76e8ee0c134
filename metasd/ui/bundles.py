"""The models: only PRESETS names, each loaded (and warmed up) once and shared by every request, and
MODEL, the fair slots through which requests take turns on them."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from metasd.core.engine import encode_prompt, target_greedy
from metasd.core.engine import run as engine_run
from metasd.core.streaming import FairSlots, ThreadPlan, in_fresh_thread
from metasd.core.validation import InvalidInput
from metasd.models.loading import Bundle, default_drafters, drafter_names, load_bundle, present_specs, to_stderr
from metasd.models.presets import DEFAULT_PRESET, PRESETS, get_preset
from metasd.ui.config import GEN_CONCURRENCY, HAS_CUDA, MAX_WAITING, PREFILL_THREADS, TORCH_THREADS
from metasd.ui.errors import free_memory, refused

# The model, shared by every request: Generate holds it for a whole answer, Compare one run at a time,
# first come first served, so nobody waits for a whole prompt set; at most MAX_WAITING page runs in line.
MODEL = FairSlots(GEN_CONCURRENCY, max_waiting=MAX_WAITING)

# Loaded presets, least recently used first. At most MAX_BUNDLES stay loaded (the least recently used beyond
# that is unloaded); the lock guards only these dicts, never a load, so no request waits for another's load.
MAX_BUNDLES = int(os.environ.get("METASD_MAX_BUNDLES", "2" if HAS_CUDA else "1"))
# On a CPU the only preset is the offline one, loaded at start-up: a request that finds it still loading waits
# for it (as handlers called before start-up did). On a GPU a hub preset loads in the background instead.
WAIT_IN_REQUESTS = not HAS_CUDA
LOAD_WAIT_S = 1800.0  # the longest a caller that must have the model (start-up, the CLI, tests) waits for a load
_bundles: OrderedDict[str, Bundle] = OrderedDict()
_loading: dict[str, threading.Event] = {}
_load_errors: dict[str, str] = {}
_load_steps: dict[str, str] = {}  # a loading preset's latest step ("loading target ...")
_load_started: dict[str, float] = {}
_bundle_lock = threading.Lock()
log = logging.getLogger("metasd.app")


class Loading(InvalidInput):
    """The preset is loading in the background: the one who asked is told to come back in a moment."""


def available_presets() -> list[str]:
    """Hub presets need a CUDA GPU; on a CPU only the offline preset is offered."""
    return [n for n, p in PRESETS.items() if HAS_CUDA or "gpu" not in p.tags]


def default_preset() -> str:
    want = os.environ.get("METASD_PRESET") or DEFAULT_PRESET
    return want if want in available_presets() else DEFAULT_PRESET


def _load(name: str, done: threading.Event) -> None:
    """Load and warm up one preset (in a thread of its own), then keep at most MAX_BUNDLES loaded."""
    def progress(line: str) -> None:  # the log's line, and the latest one kept for a page waiting on the load
        to_stderr(line)
        _load_steps[name] = line.removeprefix("[metasd]").strip()

    try:
        bundle = load_bundle(name, progress=progress)
        progress(f"[metasd] warming up preset {name!r} (one short answer)")
        _warm_up(bundle)
        with _bundle_lock:
            _bundles[name] = bundle
            while len(_bundles) > max(1, MAX_BUNDLES):
                old, _ = _bundles.popitem(last=False)  # requests still running on it keep their reference
                log.info("unloaded preset %s (least recently used; at most %d loaded)", old, MAX_BUNDLES)
        del bundle
        free_memory()
    except Exception as e:  # noqa: BLE001  (told to the next one who asks; the log keeps the traceback)
        log.error("loading preset %s failed", name, exc_info=e)
        with _bundle_lock:
            _load_errors[name] = f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        with _bundle_lock:
            _loading.pop(name, None)
            _load_steps.pop(name, None)
        done.set()


def get_bundle(name: Any, wait: bool = True) -> Bundle:
    """The loaded preset, loading it in the background the first time. Anything but an offered preset name is
    refused. `wait=False` (a page request) raises Loading at once instead of waiting for the load."""
    if not isinstance(name, str) or name not in available_presets():
        raise InvalidInput(f"unknown preset {str(name)[:64]!r}; this machine offers {', '.join(available_presets())}")
    with _bundle_lock:
        if name in _bundles:
            _bundles.move_to_end(name)
            return _bundles[name]
        failed = _load_errors.pop(name, None)
        done = _loading.get(name)
        if done is None and failed is None:
            done = _loading[name] = threading.Event()
            _load_started[name] = time.perf_counter()
            threading.Thread(target=_load, args=(name, done), name=f"metasd-load-{name}", daemon=True).start()
    if failed is not None:
        raise InvalidInput(f"loading preset {name} failed ({failed}); choose it again to retry")
    if not wait:
        raise Loading(f"preset {name} is loading in the background (a minute or two for a hub model); "
                      "choose it again in a moment")
    if not done.wait(LOAD_WAIT_S):
        raise InvalidInput(f"preset {name} did not load within {LOAD_WAIT_S:.0f} s")
    return get_bundle(name, wait=False)


def _warm_up(bundle: Bundle) -> None:
    """One short pass through both code paths, so the first timed request is not a cold start."""
    ids = encode_prompt(bundle, "Hello!", True)
    target_greedy(bundle, ids, 4)
    engine_run(bundle, "Hello!", max_new_tokens=8)


def bundle_for(name: Any, progress: Any = None) -> Bundle:
    """get_bundle for a handler: a name it refuses is the user's message (gr.Error). With a gradio progress
    tracker, a wait for a preset still loading (the first half-minute after a start) shows the load's step."""
    while progress is not None and WAIT_IN_REQUESTS and (state := loading(name if isinstance(name, str) else "")):
        progress(0.0, desc=f"waiting for the model to load ({state[0]:.0f} s so far): {state[1]}")
        time.sleep(1.0)
    try:
        return get_bundle(name, wait=WAIT_IN_REQUESTS)
    except InvalidInput as e:
        raise refused(e) from None


def drafters_of(name: str, wait: bool = True) -> list[str]:
    """The drafters a preset really has once loaded (a distilled drafter without weights is left out)."""
    return get_bundle(name, wait).drafter_names


def start_loading(name: str) -> None:
    """Load the preset in the background (nothing to wait for: get_bundle waits where the model is needed)."""
    try:
        get_bundle(name, wait=False)
    except Loading:
        pass


def loading(name: str) -> tuple[float, str] | None:
    """While the preset loads: seconds since its load began and its latest step; None once it is loaded
    (or failed, or never asked for)."""
    with _bundle_lock:
        if name not in _loading:
            return None
        return time.perf_counter() - _load_started.get(name, time.perf_counter()), _load_steps.get(name, "starting")


def page_drafters(name: str) -> tuple[list[str], list[str]]:
    """The preset's drafters and the bandit's default arms, as the page offers them: from the loaded models,
    or, while they load, from the preset itself (the same names: both leave out trained drafters without
    weights)."""
    with _bundle_lock:
        bundle = _bundles.get(name)
    if bundle is not None:
        return bundle.drafter_names, bundle.default_drafters
    p = get_preset(name)
    specs = present_specs(p)
    return drafter_names(specs), default_drafters(p, specs)


class _FirstPassDone(LogitsProcessor):
    """Tells the thread plan that the prompt's pass is done (transformers calls logits processors after every
    forward pass; the scores go back unchanged)."""

    def __init__(self, plan: ThreadPlan) -> None:
        self.plan, self.told = plan, False

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if not self.told:
            self.plan.first_pass_done()
            self.told = True
        return scores


def measure_target(bundle: Bundle, prompt: str, n: int) -> tuple[list[int], float]:
    """The target alone, timed under the engine worker's thread plan (a fair ratio): in a thread of its own, the
    prompt's pass with PREFILL_THREADS, every step after it with TORCH_THREADS (metasd.core.streaming)."""
    plan = ThreadPlan() if HAS_CUDA else ThreadPlan(PREFILL_THREADS, TORCH_THREADS)
    ids = encode_prompt(bundle, prompt, True)

    def timed() -> tuple[list[int], float]:
        plan.begin()
        t = time.perf_counter()
        out = target_greedy(bundle, ids, n, logits_processor=LogitsProcessorList([_FirstPassDone(plan)]))
        return out, time.perf_counter() - t

    with MODEL.hold():
        return in_fresh_thread(timed, name="metasd-target-alone")

