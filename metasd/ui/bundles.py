"""The models: only PRESETS names, each loaded (and warmed up) once per server (Presets) and shared by every
request, and the target alone timed through the server's fair slots."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import gradio as gr
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from metasd import settings
from metasd.core.validation import InvalidInput
from metasd.decoding.engine import encode_prompt, target_greedy
from metasd.decoding.engine import run as engine_run
from metasd.decoding.loading import Bundle, default_drafters, drafter_names, load_bundle, present_specs, to_stderr
from metasd.models.presets import DEFAULT_PRESET, PRESETS, get_preset
from metasd.serving.streaming import FairSlots, ThreadPlan, in_fresh_thread
from metasd.ui.config import BATCH, HAS_CUDA, PREFILL_THREADS, TORCH_THREADS
from metasd.ui.errors import free_memory, refused

MAX_BUNDLES = settings.value("METASD_MAX_BUNDLES")
# On a CPU the only preset is the offline one, loaded at start-up: a request that finds it still loading waits
# for it (as handlers called before start-up did). On a GPU a hub preset loads in the background instead.
WAIT_IN_REQUESTS = not HAS_CUDA
LOAD_WAIT_S = 1800.0  # the longest a caller that must have the model (start-up, the CLI, tests) waits for a load
log = logging.getLogger("metasd.app")


class Loading(InvalidInput):
    """The preset is loading in the background: the one who asked is told to come back in a moment."""


class PresetLoad(threading.Event):
    """One load of a preset, set when it has ended: when it began, its latest step ("loading target ..."), and
    why it failed, if it did (every run that waited on this load is told, not only the first)."""

    def __init__(self) -> None:
        super().__init__()
        self.started = time.perf_counter()
        self.step = "starting"
        self.error: str | None = None

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def waiting(self, name: str, stop: threading.Event, every: float = 1.0) -> Iterator[None]:
        """Yield at once and then every `every` s while the load runs, until it has ended or `stop` is set
        (a waiting run's Stop, Compare's Cancel); raise what a run that waited is told where the load failed
        or did not end within LOAD_WAIT_S."""
        while not self.is_set() and not stop.is_set():
            if self.seconds >= LOAD_WAIT_S:
                raise _late(name)
            yield
            stop.wait(every)  # Stop ends the wait at once; the load's end is seen within `every`
        if self.error and not stop.is_set():
            raise _failed(name, self.error)


def _failed(name: str, error: str) -> InvalidInput:
    return InvalidInput(f"loading preset {name} failed ({error}); choose it again to retry")


def _late(name: str) -> InvalidInput:
    return InvalidInput(f"preset {name} did not load within {LOAD_WAIT_S:.0f} s")


def available_presets() -> list[str]:
    """Hub presets need a CUDA GPU; on a CPU only the offline preset is offered. A GPU server sharing its passes
    between runs (BATCH) offers its one preset: the shared rounds hold that preset's target, and its admission
    slots count runs that share passes (another preset's runs would each take a pass, and memory, of their own)."""
    offered = [n for n, p in PRESETS.items() if HAS_CUDA or "gpu" not in p.tags]
    return [_preferred(offered)] if HAS_CUDA and BATCH else offered


def default_preset() -> str:
    return _preferred(available_presets())


def _preferred(offered: list[str]) -> str:
    """$METASD_PRESET where it is among `offered`, else the default preset."""
    want = settings.value("METASD_PRESET") or DEFAULT_PRESET
    return want if want in offered else DEFAULT_PRESET


def preset_drafters(name: str) -> tuple[list[str], list[str]]:
    """The preset's drafters and the bandit's default arms from the preset itself, nothing loaded (trained
    drafters without weights left out, as loading leaves them out)."""
    p = get_preset(name)
    specs = present_specs(p)
    return drafter_names(specs), default_drafters(p, specs)


class Presets:
    """The loaded presets of one server, least recently used first, each loaded (and warmed up) once in a thread
    of its own and shared by every request. At most MAX_BUNDLES stay loaded (the least recently used beyond that is
    unloaded); the lock guards only the three dicts, never a load, so no request waits for another's load."""

    def __init__(self) -> None:
        self.loaded: OrderedDict[str, Bundle] = OrderedDict()
        self.loads: dict[str, PresetLoad] = {}  # loads in progress
        self.errors: dict[str, str] = {}  # a failed load's reason, told to the next one who asks (who may retry)
        self.lock = threading.Lock()

    def _load(self, name: str, done: PresetLoad) -> None:
        """Load and warm up one preset (in a thread of its own), then keep at most MAX_BUNDLES loaded."""
        def progress(line: str) -> None:  # the log's line, and the latest one kept for a page waiting on the load
            to_stderr(line)
            done.step = line.removeprefix("[metasd]").strip()

        try:
            bundle = load_bundle(name, progress=progress)
            progress(f"[metasd] warming up preset {name!r} (one short answer)")
            _warm_up(bundle)
            with self.lock:
                self.loaded[name] = bundle
                while len(self.loaded) > max(1, MAX_BUNDLES):
                    old, _ = self.loaded.popitem(last=False)  # requests still running on it keep their reference
                    log.info("unloaded preset %s (least recently used; at most %d loaded)", old, MAX_BUNDLES)
            log.info("preset %s ready to serve (loaded and warmed up in %.1f s)", name, done.seconds)
            del bundle
            free_memory()
        except Exception as e:  # noqa: BLE001  (told to the next one who asks; the log keeps the traceback)
            log.error("loading preset %s failed", name, exc_info=e)
            done.error = f"{type(e).__name__}: {str(e)[:200]}"
            with self.lock:
                self.errors[name] = done.error
        finally:
            with self.lock:
                self.loads.pop(name, None)
            done.set()

    def get(self, name: Any, wait: bool = True) -> Bundle:
        """The loaded preset, loading it in the background the first time. Anything but an offered preset name is
        refused. `wait=False` (a page request) raises Loading at once instead of waiting for the load."""
        if not isinstance(name, str) or name not in available_presets():
            raise InvalidInput(f"unknown preset {str(name)[:64]!r}; this machine offers {', '.join(available_presets())}")
        with self.lock:
            if name in self.loaded:
                self.loaded.move_to_end(name)
                return self.loaded[name]
            failed = self.errors.pop(name, None)
            done = self.loads.get(name)
            if done is None and failed is None:
                done = self.loads[name] = PresetLoad()
                threading.Thread(target=self._load, args=(name, done), name=f"metasd-load-{name}", daemon=True).start()
        if failed is not None:
            raise _failed(name, failed)
        if not wait:
            raise Loading(f"preset {name} is loading in the background (a minute or two for a hub model); "
                          "choose it again in a moment")
        if not done.wait(LOAD_WAIT_S):
            raise _late(name)
        if done.error:
            raise _failed(name, done.error)
        return self.get(name, wait=False)

    def bundle_for(self, name: Any, progress: Any = None, cancel: threading.Event | None = None) -> Bundle:
        """get for a handler: a name it refuses is the user's message (gr.Error). With a gradio progress tracker, a
        wait for a preset still loading (the first half-minute after a start) shows the load's step, and `cancel`
        set ends it."""
        load = self.loading(name) if progress is not None and WAIT_IN_REQUESTS else None
        try:
            if load is not None:
                for _ in load.waiting(name, cancel or threading.Event()):
                    progress(0.0, desc=f"waiting for the model to load ({load.seconds:.0f} s so far): {load.step}")
                if cancel is not None and cancel.is_set():
                    raise gr.Error("Cancelled while the model was loading.", print_exception=False)
            return self.get(name, wait=WAIT_IN_REQUESTS)
        except InvalidInput as e:
            raise refused(e) from None

    def start_loading(self, name: str) -> None:
        """Load the preset in the background (nothing to wait for: get waits where the model is needed)."""
        try:
            self.get(name, wait=False)
        except Loading:
            pass

    def loading(self, name: Any) -> PresetLoad | None:
        """The preset's load in progress (its time so far, its latest step); None once it is loaded, or failed, or
        where it was never asked for."""
        with self.lock:
            return self.loads.get(name) if isinstance(name, str) else None

    def drafters(self, name: str) -> tuple[list[str], list[str]]:
        """The preset's drafters and the bandit's default arms, as the page offers them: from the loaded models,
        or, while they load, from the preset itself (the same names)."""
        with self.lock:
            bundle = self.loaded.get(name)
        if bundle is not None:
            return bundle.drafter_names, bundle.default_drafters
        return preset_drafters(name)


def _warm_up(bundle: Bundle) -> None:
    """One short pass through both code paths, so the first timed request is not a cold start."""
    ids = encode_prompt(bundle, "Hello!", True)
    target_greedy(bundle, ids, 4)
    engine_run(bundle, "Hello!", max_new_tokens=8)


class TargetProgress:
    """What the target alone has written so far while it is timed, for a page that shows it: the ids (a reference
    to transformers' own tensor, never copied in the timed thread) and the prompt's length (its first call's)."""

    def __init__(self) -> None:
        self.ids: torch.Tensor | None = None
        self.prompt_len = 0

    @property
    def made(self) -> int:
        return 0 if self.ids is None else int(self.ids.shape[-1]) - self.prompt_len


class _FirstPassDone(LogitsProcessor):
    """Tells the thread plan that the prompt's pass is done (transformers calls logits processors after every
    forward pass; the scores go back unchanged), and keeps `progress` where given."""

    def __init__(self, plan: ThreadPlan, progress: TargetProgress | None = None) -> None:
        self.plan, self.told, self.progress = plan, False, progress

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if not self.told:
            self.plan.first_pass_done()
            self.told = True
            if self.progress is not None:  # the first call sees the prompt alone
                self.progress.prompt_len = int(input_ids.shape[-1])
        if self.progress is not None:
            self.progress.ids = input_ids
        return scores


def measure_target(bundle: Bundle, prompt: str, n: int, slots: FairSlots, progress: TargetProgress | None = None
                   ) -> tuple[list[int], float]:
    """The target alone, timed under the engine worker's thread plan (a fair ratio): in a thread of its own, the
    prompt's pass with PREFILL_THREADS, every step after it with TORCH_THREADS (metasd.serving.streaming).
    `progress`, where given, follows what it has written while it runs."""
    plan = ThreadPlan() if HAS_CUDA else ThreadPlan(PREFILL_THREADS, TORCH_THREADS)
    ids = encode_prompt(bundle, prompt, True)

    def timed() -> tuple[list[int], float]:
        plan.begin()
        t = time.perf_counter()
        out = target_greedy(bundle, ids, n, logits_processor=LogitsProcessorList([_FirstPassDone(plan, progress)]))
        return out, time.perf_counter() - t

    with slots.hold():
        return in_fresh_thread(timed, name="metasd-target-alone")

