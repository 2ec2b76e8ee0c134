"""What the machine and the operator decide, read once at import: the GPU (and ZeroGPU), how many
generations run at once, the limits of a request, the page's defaults and its examples.

The operator's METASD_* settings come from metasd.settings (the one module that reads them, each checked; the
table: docs/DESIGN.md §11). Importing this loads nothing else: operator plugins ($METASD_PLUGINS) are loaded by
app.py when it builds or starts the page.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import torch

from metasd import paths, settings
from metasd.core import defaults
from metasd.models.spaces import duration_of

try:  # ZeroGPU on Hugging Face Spaces: a GPU is attached only inside decorated calls.
    import spaces
except ImportError:  # anywhere else: handlers run as they are
    spaces = None


def gpu(fn: Callable | None = None, *, runs: Callable[[dict[str, Any]], Any] | int = 1,
        duration: Callable[..., int] | None = None) -> Any:
    """Mark a handler as one that holds a ZeroGPU GPU while it runs, for a time sized per request from its
    max_new_tokens and preset (metasd/models/spaces.py; `runs`: generations per call), or by `duration` (the call's
    arguments -> seconds). The mark is applied where the handler is bound to its server (on_gpu, Server.bind)."""
    def mark(f: Callable) -> Callable:
        f.gpu_sizing = {"runs": runs, "duration": duration}  # type: ignore[attr-defined]
        return f
    return mark(fn) if fn is not None else mark


def on_gpu(handler: Callable, sizing: dict[str, Any] | None) -> Callable:
    """`handler` under `spaces.GPU` where it is marked (gpu) and this is a Space with the spaces package; off
    ZeroGPU `spaces.GPU` hands the function back unchanged."""
    if spaces is None or sizing is None:
        return handler
    return spaces.GPU(duration=sizing["duration"] or duration_of(handler, runs=sizing["runs"]))(handler)


ROOT, ASSETS = paths.ROOT, paths.ASSETS  # the repository (app.py, metasd/, assets/) and its assets
HAS_CUDA = torch.cuda.is_available()
# Generations that may run at once (each one holds the model): 1 on a CPU, 2 on a GPU.
GEN_CONCURRENCY = settings.value("METASD_CONCURRENCY")
# Runs that may wait in the app's own line for the model (metasd.serving.streaming.FairSlots): each sees its
# place and an estimate; one more is told that the class is full and when to come back.
MAX_WAITING = settings.value("METASD_MAX_WAITING")
# Generate's handlers all start at once, each waiting in the app's line and streaming its place there, so
# gradio's own queue (bounded: it holds only events that found no handler) never fills with Generate
# runs and its generic "Queue is full" never shows: the app admits runs itself and tells the rest.
GENERATE_HANDLERS = 2 * MAX_WAITING + 16
QUEUE_SIZE = settings.value("METASD_QUEUE_SIZE")
# Where the browsers are elsewhere (a Space, or any host that sets $PORT), one generation takes every core.
HOSTED = settings.machine().hosted
# torch threads per generation on a CPU. Measured 2026-12-01 on the offline preset (2 cores, scripts/measure_threads.py
# and measure_page_examples.py): two threads in a worker run the engine at 32-36 tokens/s against 22-26 with
# one, but only without a browser on the same machine; with one there (a teacher's `make run`), the streamed
# run lost more than the target alone and the page showed 0.62-1.17x instead of 0.83-1.54x. So locally one
# thread per generation, the other core left to the server and the browser; hosted, every core's share
# (the issue measured a Space start on 2 cores streaming at 0.73 of the engine's speed with one thread).
# $METASD_TORCH_THREADS overrides both.
_CORES = os.cpu_count() or 2
TORCH_THREADS = settings.value("METASD_TORCH_THREADS") or (
    max(1, _CORES // GEN_CONCURRENCY) if HOSTED else max(1, _CORES // (GEN_CONCURRENCY + 1)))
# Rounds of many requests in one pass (metasd.serving.batch): on a CPU, on where the server is hosted (a class on
# one machine), off locally (one teacher's browser) unless $METASD_BATCH says otherwise; only where the target's
# linear layers are row-invariant (checked at start-up). On a GPU only with $METASD_BATCH=1 (no GPU has run them
# yet): in a thread of the server's process (fork and CUDA do not mix), every pass's row-wise layers in calls of
# $METASD_PASS_BLOCK rows (batch-invariant blocking: cuBLAS picks its kernel by shape, so a row alone and beside
# others is computed by the same kernel), and the server then offers its one preset ($METASD_PRESET); never on
# ZeroGPU, whose GPU is attached only inside a request's own call, never to a thread serving many. The batch is bounded by the
# pass-time cost model measured at start-up (each stream keeps at least 1/BATCH_SLOWDOWN of its solo
# speed), by $METASD_KV_BUDGET_MB of KV caches and by $METASD_MAX_BATCH. On 2 cores a pass of 32 full drafts
# costs 5-10x a solo one (measured 2026-12-02 and 12-03; the machine's speed moves the fitted line): rounds
# verify ~2 ids, not 5, so a class of 32 streams at about a sixth of a run alone (docs/BENCHMARKS.md). 12x
# lets a class of 32 start together on any of those lines; 8x left 4-10 of them waiting for whole runs.
ZERO_GPU = os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")
BATCH = settings.value("METASD_BATCH") and not ZERO_GPU
PASS_BLOCK = settings.value("METASD_PASS_BLOCK")
# ... in processes of their own (metasd.serving.remote), where torch's calls never wait for the server's event loop to
# give the interpreter lock back: $METASD_ROUNDS_PROCESS of them (default one per core; 0: in the server's process),
# each with $METASD_CROWD_THREADS torch threads while more than one run is served (TORCH_THREADS for a run alone;
# 0: TORCH_THREADS always). A class's pass is compute-bound on one thread and a second thread in the same process
# gained nothing, where two processes with half the class each served 1.5-1.8x the tokens on the engine alone and
# about 1.2x through the server (docs/BENCHMARKS.md).
ROUNDS_PROCESS = 0 if HAS_CUDA else settings.value("METASD_ROUNDS_PROCESS")
CROWD_THREADS = settings.value("METASD_CROWD_THREADS")
# ... and in them, every running request's model-drafter forwards on one drafter in one pass ($METASD_BATCH_DRAFTS).
BATCH_DRAFTS = settings.value("METASD_BATCH_DRAFTS")
BATCH_SLOWDOWN = settings.value("METASD_BATCH_SLOWDOWN")
MAX_BATCH = settings.value("METASD_MAX_BATCH")
KV_BUDGET_MB = settings.value("METASD_KV_BUDGET_MB")
# Prompt passes kept for the next run of the same prompt in company (metasd.decoding.prefix): a page example's
# pass is 3-15 MB of keys and values on the offline preset.
PREFIX_MB = settings.value("METASD_PREFIX_MB")
# The prompt's prefill is one large batch, where more threads do pay: every core's share for it.
PREFILL_THREADS = max(TORCH_THREADS, _CORES // GEN_CONCURRENCY)
MAX_NEW_TOKENS = 1024 if HAS_CUDA else 512
COMPARE_MAX_NEW_TOKENS = 256
COMPARE_MAX_PROMPTS = 40 if HAS_CUDA else 21
# While a run streams, the figures and the table refresh at most every PLOT_INTERVAL_S (the tokens up to
# FRAME_FPS times a second): redrawing the two plotly figures is most of what a browser does during a run.
PLOT_INTERVAL_S = settings.value("METASD_PLOT_INTERVAL")  # 0.5 s cost a browser twice the plotly time
FRAME_FPS = settings.value("METASD_FRAME_FPS")  # frames a second at most (the token view)
# Frames a second for the whole server, shared by its open streams (metasd.serving.streaming.FrameBudget): one
# stream keeps FRAME_FPS; 32 streams draw a frame each every second or so, which leaves the event loop free
# to serve them (each frame costs it a few ms, whatever the frame carries).
SERVER_FPS = settings.value("METASD_SERVER_FPS")

EXAMPLES: list[dict[str, Any]] = json.loads((ASSETS / "examples.json").read_text(encoding="utf-8"))
TASKS = list(dict.fromkeys(e["category"] for e in EXAMPLES))
TASK_TITLES = {"translation": "Translation", "summarization": "Summarization", "qa": "QA", "math": "Math",
               "rag": "RAG", "code": "Code", "chat": "Chat"}
# The page's defaults come from metasd.core.defaults (the API and the CLI share them). The RAG example
# opens the page: it shows prompt lookup and retrieval copying from the context (1.71x with the page's
# policy in the benchmark of 2026-12-01; 1.55-1.78x on 2026-12-08, docs/BENCHMARKS.md "The heads as the default arms").
PAGE_POLICY = defaults.POLICY
PAGE_EXAMPLE = next(i for i, e in enumerate(EXAMPLES) if e["question_id"] == "ex-rag-1")
REWARD_CHOICES = [("block divergence (bd)", "bd"), ("block efficiency (be)", "be"), ("throughput", "throughput")]


def task_title(category: str) -> str:
    """The task's name as the page shows it (an unknown category as it is)."""
    return TASK_TITLES.get(category, category)
