"""Compare tab handlers: each drafter alone and the bandit, greedy, against the target alone measured in
the same run, on one prompt (/compare) or a prompt set (/compare_set), and the set's Cancel."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import gradio as gr
import pandas as pd

from metasd.bandits.policies import single_drafter, single_method
from metasd.core.runfile import run_document
from metasd.core.validation import (
    COMPARE_MAX_WORK,
    PROMPT_SET_MAX_BYTES,
    InvalidInput,
    check_compare_work,
    first_per_category,
    number,
    parse_prompt_set,
)
from metasd.decoding.engine import check
from metasd.decoding.lanes import lanes_for
from metasd.decoding.loading import Bundle
from metasd.models.spaces import MAX_S
from metasd.serving.streaming import EngineStream, in_fresh_thread
from metasd.ui import viz
from metasd.ui.bundles import measure_target, preset_drafters
from metasd.ui.config import COMPARE_MAX_NEW_TOKENS, COMPARE_MAX_PROMPTS, EXAMPLES, HAS_CUDA, PREFILL_THREADS, TORCH_THREADS, gpu
from metasd.ui.errors import failure, refused
from metasd.ui.files import read_upload, safe_csv
from metasd.ui.generate import engine_events
from metasd.ui.server import Server
from metasd.ui.session import Cancelled, compare_key


def _checked(bundle: Bundle, prompt: Any, limit: int, **settings: Any) -> str:
    """Check a request as the engine will (metasd.decoding.engine.check: settings, the prompt, the context length)
    without running it; returns the cleaned prompt. Raises InvalidInput."""
    return check(bundle, prompt, max_new_tokens_limit=limit, **settings).text


# The one-prompt table's columns, before a run (the tab's empty table) and after.
COMPARE_COLUMNS = ["method", "new_tokens", "tokens_per_s", "speedup", "mean_accepted", "acceptance_rate",
                   "target_calls", "identical_to_target"]


def _methods(bundle: Bundle, policy: str) -> list[str]:
    """What a comparison runs: each of the preset's drafters alone, then the bandit."""
    return [single_method(d) for d in bundle.drafter_names] + [policy]


def _prompt_methods(bundle: Bundle, policy: str) -> list[str]:
    """One prompt's order: the bandit first, then its default arms alone, then the other drafters: the answer
    a class came for arrives first (within seconds), the rest as they finish."""
    arms = bundle.default_drafters
    return [policy] + [single_method(d) for d in arms] + [single_method(d) for d in bundle.drafter_names
                                                          if d not in arms]


# torch threads (prefill, rounds) of a run, as the page's engine worker sets them (none on a GPU).
THREADS = (None, None) if HAS_CUDA else (PREFILL_THREADS, TORCH_THREADS)


def _method_runs(server: Server, bundle: Bundle, prompt: str, methods: list[str], max_new_tokens: int,
                 progress: Any, label: str, done: int, total: int,
                 cancel: threading.Event | None = None, started: float | None = None) -> tuple[dict[str, Any], float, list[int]]:
    """The target alone, then each method, on one prompt: every run's result at once."""
    stream = _method_stream(server, bundle, prompt, methods, max_new_tokens, progress, label, done, total, cancel,
                            started)
    ids, base_tps = next(stream)
    return dict(stream), base_tps, ids


def _method_stream(server: Server, bundle: Bundle, prompt: str, methods: list[str], max_new_tokens: int,
                   progress: Any, label: str, done: int, total: int,
                   cancel: threading.Event | None = None, started: float | None = None) -> Iterator[Any]:
    """The target alone (its ids and tokens/s), then each method's (name, (rounds, summary)) as it finishes.
    Each run takes the model on its own (a Generate request can go in between), and the progress line says
    how long the rest will take at this pace."""
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
    ids, secs = measure_target(bundle, prompt, max_new_tokens, server.model)
    yield ids, (len(ids) / secs if secs > 0 else 0.0)
    for i, m in enumerate(methods, 1):
        step(i, m)
        alone = single_drafter(m)
        # Where the server shares rounds (a class on a Space), the run joins them like a student's; else in a
        # thread of its own with the engine worker's torch threads, as the target alone was timed.
        stop = threading.Event()
        prepared = check(bundle, prompt, drafters=None if alone is None else [alone], policy=m,
                         max_new_tokens=max_new_tokens, max_new_tokens_limit=COMPARE_MAX_NEW_TOKENS)
        events = engine_events(server, bundle, prepared, stop, timed=True)
        with server.model.hold():  # the page's one stream driver, as Generate's runs (its worker: a thread of its own)
            result = EngineStream(events, stop, prefill_threads=THREADS[0], torch_threads=THREADS[1]).collect()
        yield m, result  # the model given back first: what the caller does with it (lanes) takes it again


def _lanes_of(server: Server, bundle: Bundle, prompt: str, rounds: list[Any], summary: Any) -> dict[str, list[float]]:
    """A run's drafter lanes (metasd.decoding.lanes), computed with the model held, in a thread of its own."""
    if not rounds:
        return {}
    with server.model.hold():
        lanes, _ = in_fresh_thread(lambda: lanes_for(bundle, prompt, rounds, summary.config), THREADS[0], "metasd-lanes")
    return lanes


def _run_file(server: Server, bundle: Bundle, prompt: str, rounds: list[Any], summary: Any, lanes: dict[str, list[float]],
              stem: str) -> str:
    """The run saved as a run file in the app's private temp dir, for Replay to open."""
    doc = run_document(prompt, rounds, summary, preset=bundle.preset.name, target=bundle.preset.target,
                       drafters=list(rounds[0].probabilities), colors=viz.drafter_colors(bundle.drafter_names),
                       settings=summary.config, lanes=lanes)
    path = server.files.stem("lanes", stem).with_suffix(".json")
    path.write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    return str(path)


def _bundle_and_cancel(server: Server, preset: Any, progress: Any,
                       request: gr.Request | None) -> tuple[Bundle, threading.Event, str]:
    """The preset's models, and the run's Cancel signal, registered first so that Cancel also ends a wait for
    the models to load (the first half-minute after a start); unregistered again if the preset is refused."""
    cancel = threading.Event()
    key = compare_key(request)
    server.stops.start(key, cancel)
    try:
        return server.presets.bundle_for(preset, progress, cancel), cancel, key
    except BaseException:
        server.stops.end(key, cancel)
        raise


def cancel_compare(server: Server, request: gr.Request = None) -> None:
    """Cancel: the session's Compare run ends before its next run, keeping the results so far."""
    server.stops.signal(compare_key(request))


@gpu(runs=lambda a: len(preset_drafters(a["preset"])[0]) + 2)  # each drafter alone, the bandit, the target
def compare_prompt(server: Server, prompt: str, preset: str, policy: str, max_new_tokens: int,
                   progress=gr.Progress(), request: gr.Request = None):  # noqa: B008  (gradio injects a tracker per call)
    """One prompt under the bandit and each drafter alone, side by side: the target alone and the bandit first,
    then each drafter alone as it finishes (the table, grid and bars grow); Cancel keeps what finished."""
    bundle, cancel, key = _bundle_and_cancel(server, preset, progress, request)
    colors = viz.drafter_colors(bundle.drafter_names)
    shown: tuple = ()
    try:
        methods = _prompt_methods(bundle, policy)
        max_new_tokens = int(number("max_new_tokens", max_new_tokens, True, (1, COMPARE_MAX_NEW_TOKENS)))
        prompt = _checked(bundle, prompt, COMPARE_MAX_NEW_TOKENS, policy=policy, max_new_tokens=max_new_tokens)
        check_compare_work([prompt], max_new_tokens)  # bounded before it starts (#27)
        stream = _method_stream(server, bundle, prompt, methods, max_new_tokens, progress, "prompt", 0, len(methods) + 1,
                                cancel)
        ref, base_tps = next(stream)
        rows = [{"method": "target alone", "new_tokens": len(ref), "tokens_per_s": round(base_tps, 2), "speedup": 1.0,
                 "identical_to_target": True}]
        cells: list[str] = []
        for m, (rounds, s) in stream:
            rows.append(viz.method_row(m, s, base_tps, list(s.token_ids) == ref[: len(s.token_ids)], "this prompt"))
            lanes = _lanes_of(server, bundle, prompt, rounds, s)  # every method's lanes, side by side
            cells.append(f"<div><h4>{viz._esc(m)} \u2014 {s.tokens_per_s:.1f} tok/s, "
                         f"{s.tokens_per_s / base_tps:.2f}\u00d7</h4>"
                         f"{viz.token_html(rounds, colors, legend=False)}"
                         f"{viz.lanes_html(rounds, lanes, colors, title=f'Lanes of {m}')}</div>")
            shown = _prompt_views(rows, cells, colors)
            yield shown
    except InvalidInput as e:
        raise refused(e) from None
    except Cancelled:
        if not shown:
            raise gr.Error("Cancelled.", print_exception=False) from None
        gr.Warning("Cancelled: the methods that finished are shown.")
    except Exception as e:
        raise failure(e) from None
    finally:
        server.stops.end(key, cancel)


def _prompt_views(rows: list[dict[str, Any]], cells: list[str], colors: dict[str, str]) -> tuple:
    """One prompt's table, its side-by-side grid and its speed-up bars, from the runs so far."""
    df = pd.DataFrame(rows)
    grid = viz.legend_html(colors) + '<div class="cmp-grid">' + "".join(cells) + "</div>"
    table = df.reindex(columns=COMPARE_COLUMNS)
    return table, grid, viz.speedup_bars(df.assign(category="this prompt"), colors)


@gpu(duration=lambda *a, **k: MAX_S)  # many prompts: the most ZeroGPU grants (its cap ends a long set)
def compare_set(server: Server, source: str, upload: Any, per_category: int, preset: str, policy: str, max_new_tokens: int,
                progress=gr.Progress(), request: gr.Request = None):  # noqa: B008  (gradio injects a tracker per call)
    """A prompt set: each drafter alone and the bandit on every prompt; acceptance heatmap and speed-up bars,
    updated after every prompt. Cancel ends it before its next run and keeps what it measured."""
    bundle, cancel, key = _bundle_and_cancel(server, preset, progress, request)
    try:
        colors = viz.drafter_colors(bundle.drafter_names)
        items, max_new_tokens = _prompt_set(bundle, source, upload, per_category, policy, max_new_tokens)
        rows, cancelled_at, grid = yield from _run_set(server, bundle, items, _methods(bundle, policy), max_new_tokens,
                                                       progress, cancel, colors)
    finally:
        server.stops.end(key, cancel)
    if not rows:
        raise gr.Error("Cancelled before the first prompt finished." if cancelled_at is not None
                       else "No prompt of the set could be run (see the warnings).", print_exception=False)
    if cancelled_at is not None:
        gr.Warning(f"Cancelled: results for {cancelled_at} of {len(items)} prompts.")
    df = pd.DataFrame(rows)
    server.files.prune()
    path = server.files.stem("compare", preset).with_suffix(".csv")
    safe_csv(df, path)  # question ids and categories are the visitor's text
    yield (viz.acceptance_heatmap(df), viz.speedup_bars(df, colors), df, gr.update(value=str(path), interactive=True),
           *_grid_out(grid, bundle))


def _grid_out(grid: list[dict[str, Any]], bundle: Bundle) -> tuple[pd.DataFrame, list[str]]:
    """The prompts x drafters lanes grid and, per row, the run file Replay opens on a click."""
    names = list(dict.fromkeys(d for g in grid for d in g["lanes"])) or bundle.default_drafters
    return viz.lane_grid(grid, names), [g["path"] for g in grid]


def _prompt_set(bundle: Bundle, source: str, upload: Any, per_category: Any, policy: str,
                max_new_tokens: Any) -> tuple[list[dict[str, Any]], int]:
    """The set's prompts (at most COMPARE_MAX_PROMPTS, per_category of each task) and max new tokens, all
    checked before anything runs."""
    try:
        per_category = int(number("per_category", per_category, True))
        max_new_tokens = int(number("max_new_tokens", max_new_tokens, True, (1, COMPARE_MAX_NEW_TOKENS)))
        # The settings once, on a short prompt: policy and max new tokens are the same for every prompt.
        _checked(bundle, "settings check", COMPARE_MAX_NEW_TOKENS, policy=policy, max_new_tokens=max_new_tokens)
        if source == "upload":
            data, _ = read_upload(upload, PROMPT_SET_MAX_BYTES, "prompt file",
                                  "Upload a JSONL file (question_id, category, turns) first.")
            items = parse_prompt_set(data)
        elif source == "examples":
            items = [{"question_id": e["question_id"], "category": e["category"], "prompt": e["turns"][0]} for e in EXAMPLES]
        else:
            raise InvalidInput(f"unknown prompt source {source!r}; choose examples or upload")
    except InvalidInput as e:
        raise refused(e) from None
    items = first_per_category(items, per_category)
    if len(items) > COMPARE_MAX_PROMPTS:
        gr.Warning(f"Using the first {COMPARE_MAX_PROMPTS} of {len(items)} prompts.")
        items = items[:COMPARE_MAX_PROMPTS]
    try:  # the whole set's work, bounded and said before it starts (#27)
        work = check_compare_work([it["prompt"] for it in items], max_new_tokens)
    except InvalidInput as e:
        raise refused(e) from None
    gr.Info(f"{len(items)} prompts x {len(_methods(bundle, policy)) + 1} runs of {max_new_tokens} tokens. Size of "
            f"this comparison: {work / COMPARE_MAX_WORK:.0%} of the most one comparison may do (prompt characters "
            "times new tokens: longer prompts leave room for fewer tokens).")
    return items, max_new_tokens


def _run_set(server: Server, bundle: Bundle, items: list[dict[str, Any]], methods: list[str], max_new_tokens: int, progress: Any,
             cancel: threading.Event, colors: dict[str, str]) -> Iterator[tuple]:
    """Every method on every prompt, yielding the results so far after each prompt but the last; returns
    the rows and, if cancelled, at which prompt. A prompt the engine refuses is skipped with a warning."""
    per = len(methods) + 1
    rows: list[dict[str, Any]] = []
    grid: list[dict[str, Any]] = []  # per prompt: the bandit's run's lanes and its run file
    started = time.perf_counter()
    for k, it in enumerate(items):
        try:
            runs, base_tps, ref = _method_runs(server, bundle, it["prompt"], methods, max_new_tokens, progress,
                                               f"{it['category']} {k + 1}/{len(items)}", k * per, len(items) * per,
                                               cancel, started)
        except InvalidInput as e:  # e.g. a prompt longer than the model's context
            gr.Warning(f"Skipped {it['question_id']}: {e}")
            continue
        except Cancelled:
            return rows, k, grid
        except Exception as e:
            raise failure(e) from None
        for m, (_, s) in runs.items():
            rows.append(viz.method_row(m, s, base_tps, list(s.token_ids) == ref[: len(s.token_ids)],
                                       it["category"], it["question_id"]))
        grid.append(_grid_row(server, bundle, it, *runs[methods[-1]]))
        if k + 1 < len(items):  # the results so far, while the rest runs
            df = pd.DataFrame(rows)
            yield viz.acceptance_heatmap(df), viz.speedup_bars(df, colors), df, gr.skip(), *_grid_out(grid, bundle)
    return rows, None, grid


def _grid_row(server: Server, bundle: Bundle, item: dict[str, Any], rounds: list[Any], summary: Any) -> dict[str, Any]:
    """One prompt of the grid: the bandit's run (all of the request's drafters) with its lanes, saved."""
    lanes = _lanes_of(server, bundle, item["prompt"], rounds, summary)
    path = _run_file(server, bundle, item["prompt"], rounds, summary, lanes, str(item["question_id"]))
    return {"question_id": item["question_id"], "category": item["category"], "lanes": lanes, "path": path}
