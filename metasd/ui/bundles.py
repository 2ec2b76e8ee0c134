"""The models: only PRESETS names, each loaded (and warmed up) once and shared by every request, and
MODEL, the fair slots through which requests take turns on them."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from metasd.core.engine import encode_prompt, target_greedy
from metasd.core.engine import run as engine_run
from metasd.core.streaming import FairSlots, in_fresh_thread
from metasd.core.validation import InvalidInput
from metasd.models.loading import Bundle, load_bundle
from metasd.models.presets import DEFAULT_PRESET, PRESETS
from metasd.ui.config import GEN_CONCURRENCY, HAS_CUDA, MAX_WAITING, PREFILL_THREADS, TORCH_THREADS
from metasd.ui.errors import refused

# The model, shared by every request: Generate holds it for a whole answer, Compare one run at a time,
# first come first served, so nobody waits for a whole prompt set; at most MAX_WAITING page runs in line.
MODEL = FairSlots(GEN_CONCURRENCY, max_waiting=MAX_WAITING)

_bundles: dict[str, Bundle] = {}
_bundle_lock = threading.Lock()


def available_presets() -> list[str]:
    """Hub presets need a CUDA GPU; on a CPU only the offline preset is offered."""
    return [n for n, p in PRESETS.items() if HAS_CUDA or "gpu" not in p.tags]


def default_preset() -> str:
    want = os.environ.get("METASD_PRESET") or DEFAULT_PRESET
    return want if want in available_presets() else DEFAULT_PRESET


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


def bundle_for(name: Any) -> Bundle:
    """get_bundle for a handler: a name it refuses is the user's message (gr.Error)."""
    try:
        return get_bundle(name)
    except InvalidInput as e:
        raise refused(e) from None


def drafters_of(name: str) -> list[str]:
    """The drafters a preset really has once loaded (a distilled drafter without weights is left out)."""
    return get_bundle(name).drafter_names


class _StepThreads(LogitsProcessor):
    """Switches torch to the rounds' thread count once the prompt's pass is done (transformers calls
    logits processors after every forward pass and hands the scores back unchanged here)."""

    def __init__(self, threads: int) -> None:
        self.threads, self.switched = threads, False

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if not self.switched:
            torch.set_num_threads(self.threads)
            self.switched = True
        return scores


def measure_target(bundle: Bundle, prompt: str, n: int) -> tuple[list[int], float]:
    """The target alone, timed under the engine worker's torch threading (a fair ratio): the prompt's
    pass with PREFILL_THREADS, every step after it with TORCH_THREADS (metasd.core.streaming.EngineStream)."""
    extra: dict[str, Any] = {}
    if not HAS_CUDA:
        extra["logits_processor"] = LogitsProcessorList([_StepThreads(TORCH_THREADS)])
    ids = encode_prompt(bundle, prompt, True)

    def timed() -> tuple[list[int], float]:
        t = time.perf_counter()
        out = target_greedy(bundle, ids, n, **extra)
        return out, time.perf_counter() - t

    with MODEL.hold():  # in a thread of its own, as the engine's worker (metasd.core.streaming.in_fresh_thread)
        return in_fresh_thread(timed, None if HAS_CUDA else PREFILL_THREADS, name="metasd-target-alone")

