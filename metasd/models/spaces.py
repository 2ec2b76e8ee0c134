"""How long a request asks to hold a ZeroGPU GPU on Hugging Face Spaces (`spaces.GPU(duration=...)`).

On ZeroGPU a GPU is attached only while a function decorated with `spaces.GPU` runs, for at most the
duration it declares. The declared duration is what the platform weighs before the call: it is checked
against the visitor's remaining daily quota (a request that asks for more than is left fails at once, even
if the work would have fitted) and a shorter declaration queues ahead of a longer one. A flat 120 s
therefore turns away a visitor with 100 s of quota left who wants 16 tokens. `spaces.GPU` also accepts a
callable instead of a number; it is called with the decorated function's own arguments and returns
seconds, which is what `duration_of` builds from `gpu_duration`.

The rates below are assumptions, not measurements: no GPU figure has been measured yet (docs/DESIGN.md §6;
`scripts/gpu_bench.sh` is how to measure one). They are deliberately low (the engine's worst case, every
draft rejected, is slower than the target alone) so that a request is not cut off: an underestimate ends
the request, an overestimate only costs queue priority.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

from metasd.models.presets import DEFAULT_PRESET

# Tokens per second a request is assumed to reach at worst, per preset, in bf16 on one ZeroGPU slice
# (an H200 share). Batch-1 decoding of these models is bound by per-step overhead, not by arithmetic.
WORST_TOKENS_PER_S = {"offline": 20.0, "qwen2.5-1.5b": 15.0, "qwen2.5-7b": 10.0}
SETUP_S = 10  # attaching the GPU, moving weights onto it on first use, the prompt's prefill
MIN_S = 15
MAX_S = 120  # what the app has always asked for, known to be accepted; ZeroGPU refuses durations over a cap
DEFAULT_TOKENS = 128  # engine.generate's default


def gpu_duration(max_new_tokens: Any = DEFAULT_TOKENS, preset: Any = DEFAULT_PRESET, runs: Any = 1) -> int:
    """Seconds to ask for: setup, then `runs` generations of `max_new_tokens` at the preset's worst rate,
    clamped to [MIN_S, MAX_S]. Never raises (it runs before the request's own validation): an unreadable
    argument asks for MAX_S, an unknown preset for the slowest rate."""
    try:
        tokens = float(max_new_tokens)
        n = float(runs)
    except (TypeError, ValueError):
        return MAX_S
    if not (math.isfinite(tokens) and math.isfinite(n)) or tokens < 0 or n < 0:
        return MAX_S
    rate = WORST_TOKENS_PER_S.get(preset, min(WORST_TOKENS_PER_S.values())) if isinstance(preset, str) \
        else min(WORST_TOKENS_PER_S.values())
    seconds = SETUP_S + n * tokens / rate
    return int(min(MAX_S, max(MIN_S, math.ceil(seconds))))


def duration_of(fn: Callable[..., Any], runs: Callable[[dict[str, Any]], Any] | int = 1) -> Callable[..., int]:
    """A `spaces.GPU(duration=...)` callable for `fn`: it binds the call's arguments to `fn`'s signature (its
    defaults included) and sizes the request from its `max_new_tokens` and `preset` parameters; a function
    without `max_new_tokens` asks for MAX_S. `runs` is a count or a function of the bound arguments (how
    many generations one call makes, e.g. a Compare run's methods)."""
    sig = inspect.signature(fn)

    def duration(*args: Any, **kwargs: Any) -> int:
        try:
            bound = sig.bind_partial(*args, **kwargs)
            bound.apply_defaults()
            a = dict(bound.arguments)
            if "max_new_tokens" not in a:
                return MAX_S
            n = runs(a) if callable(runs) else runs
            return gpu_duration(a["max_new_tokens"], a.get("preset", DEFAULT_PRESET), n)
        except Exception:  # sizing must never fail a request: ask for the most instead
            return MAX_S

    duration.__name__ = f"duration_of_{getattr(fn, '__name__', 'fn')}"
    return duration
