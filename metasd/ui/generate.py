"""Generate tab handlers: stream one generation as page frames (/generate), stop it, time the target
alone for the speed-up, and switch presets."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import gradio as gr

from metasd.bandits.policies import POLICIES, single_method
from metasd.core import defaults
from metasd.core.engine import encode_prompt, generate
from metasd.core.lanes import lanes_for
from metasd.core.numerics import first_divergence
from metasd.core.streaming import EngineStream, in_fresh_thread, on_event_loop
from metasd.core.validation import InvalidInput, clean_prompt
from metasd.models.loading import Bundle
from metasd.models.presets import DEFAULT_PRESET, PRESETS
from metasd.models.spaces import gpu_duration
from metasd.ui import viz
from metasd.ui.bundles import MODEL, available_presets, bundle_for, default_preset, drafters_of, measure_target
from metasd.ui.config import (
    FRAME_FPS,
    HAS_CUDA,
    MAX_NEW_TOKENS,
    PAGE_POLICY,
    PLOT_INTERVAL_S,
    PREFILL_THREADS,
    TORCH_THREADS,
    gpu,
)
from metasd.ui.errors import failure, refused
from metasd.ui.frames import (
    STREAM_PLACEHOLDER,
    baseline_key,
    final_status,
    frame,
    lanes_placeholder,
    lanes_view,
    live_lanes,
    plot,
    stats,
)
from metasd.ui.session import STOPS, RunRecord, session_key

log = logging.getLogger(__name__)
LANES_STOPPED = "No drafter lanes for a stopped run: they are computed when an answer ends on its own."


@gpu
def generate_view(prompt: str, preset: str = DEFAULT_PRESET, drafters: list[str] | None = None,
                  policy: str = defaults.POLICY, reward: str = defaults.REWARD, gamma: int | None = defaults.GAMMA,
                  max_new_tokens: int = defaults.MAX_NEW_TOKENS, temperature: float = defaults.TEMPERATURE,
                  top_p: float = defaults.TOP_P, seed: int = defaults.SEED, full_info: bool = defaults.FULL_INFO,
                  cold: bool = defaults.COLD, baselines: dict | None = None, request: gr.Request = None):
    """Stream a generation. The engine runs at full speed in its own worker (metasd.core.streaming); the page
    draws the latest state at most FRAME_FPS times a second (figures and table at most every
    PLOT_INTERVAL_S) and always ends on one complete final frame. Outputs: token view, arm
    probabilities, regret, numbers, per-drafter table, the answer as plain text, the run record, the drafter
    lanes (live with full information, else within a second or two of the answer's end)."""
    bundle = bundle_for(preset)
    names = bundle.drafter_names
    drafters = _drafters_asked(names, drafters)
    gamma = bundle.preset.gamma if gamma is None else gamma  # None: the preset's (metasd.core.defaults)
    settings = {"policy": policy, "reward": reward, "gamma": gamma, "max_new_tokens": max_new_tokens,
                "temperature": temperature, "top_p": top_p, "seed": seed, "full_info": full_info,
                "priors": not cold}
    stop = threading.Event()
    text, events = _start_engine(bundle, prompt, drafters, settings, stop)
    key = session_key(request)
    STOPS.start(key, stop)  # registered only now: a refused request leaves nothing behind
    record = RunRecord(preset=bundle.preset.name, prompt=text, settings=settings, all_drafters=names,
                       drafters=list(drafters) if drafters else names)
    view = viz.LiveView(viz.drafter_colors(names), record.drafters, placeholder=STREAM_PLACEHOLDER)
    try:
        yield from _stream(events, stop, view, record, baselines)
    finally:
        STOPS.end(key, stop)


def _drafters_asked(names: list[str], drafters: Any) -> Any:
    """The drafters a request asked for, checked for shape (the engine's validation checks the names);
    None for all of the preset's."""
    if drafters is not None and not isinstance(drafters, list | tuple | str):
        raise gr.Error("drafters must be a list of drafter names")
    if drafters is not None and len(drafters) == 0:
        raise gr.Error("Tick at least one drafter.")
    if (isinstance(drafters, list) and not set(drafters) <= set(names)
            and list(drafters) == drafters_of(default_preset())):
        return None  # the page's default list was sent along with another preset: use all of its drafters
    return drafters


def _start_engine(bundle: Bundle, prompt: Any, drafters: Any, settings: dict[str, Any],
                  stop: threading.Event) -> tuple[str, Iterator[Any]]:
    """The cleaned prompt and the engine's event stream (validated at once, nothing run yet)."""
    try:
        text = clean_prompt(prompt)
        events = generate(bundle, text, drafters=list(drafters) if isinstance(drafters, list | tuple) else drafters,
                          stop=stop, max_new_tokens_limit=MAX_NEW_TOKENS, **settings)
    except InvalidInput as e:
        raise refused(e) from None
    except Exception as e:  # e.g. the tokenizer failing on something validation let through
        raise failure(e) from None
    return text, events


def _stream(events: Iterator[Any], stop: threading.Event, view: viz.LiveView, record: RunRecord,
            baselines: dict | None) -> Iterator[tuple]:
    """The page's frames: one at once (the run has started, or waits for the model), then the engine's.
    However it ends, the engine's worker is closed and the model handed back."""
    stream: EngineStream | None = None
    held = False
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
        yield (*frame(view, record, baselines, None, note), None, lanes_placeholder())
        if not held:
            MODEL.acquire()
            held = True
            stream = start()
        assert stream is not None
        yield from _engine_frames(stream, view, record, baselines)
    except InvalidInput as e:
        raise refused(e) from None
    except Exception as e:  # shown as a message, never a traceback; the log keeps the details
        raise failure(e) from None
    finally:
        _finish(stream, events, held)


CLOSE_TIMEOUT_S = 10.0  # a worker ends within a round; waiting for it never takes longer than this


def _finish(stream: EngineStream | None, events: Iterator[Any], held: bool) -> None:
    """End the worker (it frees the drafters' and the target's caches), then hand the model back. A cancelled
    stream is closed on the server's event loop: there the wait goes to a thread of its own, so no client stalls."""
    def end() -> None:
        try:
            if stream is not None:
                stream.close(CLOSE_TIMEOUT_S)
            else:
                events.close()
        finally:
            if held:
                MODEL.release()

    if on_event_loop():
        threading.Thread(target=end, name="metasd-close", daemon=True).start()
    else:
        end()


def _engine_frames(stream: EngineStream, view: viz.LiveView, record: RunRecord,
                   baselines: dict | None) -> Iterator[tuple]:
    """One frame per batch of engine events, the last one complete and carrying the finished record."""
    plotted_at, plotted_rounds = -1e9, -1
    for batch, done in stream.batches():
        t_frame = time.perf_counter()
        for item in batch:
            view.add(item.event, item.t)
        record.frames = (stream.frames, stream.rounds)
        if done:
            record = replace(record, rounds=view.rounds, summary=view.summary)
            status = final_status(view.summary) if view.summary else "ended"
            if view.summary is None or view.summary.stop_reason == "stopped":  # Stop, or the tab closed: no more work
                yield (*frame(view, record, baselines, status), record, lanes_placeholder(LANES_STOPPED))
                break
            yield (*frame(view, record, baselines, status), record, gr.skip())
            # The lanes after the answer: its frame is out first, so they never delay it.
            lanes = in_fresh_thread(lambda r=record: run_lanes(r), None if HAS_CUDA else PREFILL_THREADS, "metasd-lanes")
            record = replace(record, lanes=lanes)
            # The final frame again, whole (a caller reading only the last one gets every view), with the lanes.
            yield (*frame(view, record, baselines, status), record,
                   lanes_view(record.rounds, lanes, view.colors, empty="No drafter lanes for this run (see the server log)."))
            break
        # The tokens go out every frame (appended text); the figures, numbers and table, which are
        # re-sent whole, at most every PLOT_INTERVAL_S, and less often as they grow.
        skip = gr.skip()
        slow: tuple[Any, ...] = (skip, skip, skip, skip, skip)
        if t_frame - plotted_at >= PLOT_INTERVAL_S * (1 + len(view.rounds) / 100) and len(view.rounds) != plotted_rounds:
            note = f"round {len(view.rounds)} \u00b7 {view.new_tokens} tokens \u00b7 streaming ..."
            slow = (plot(view.arm_json()), plot(view.regret_json()), stats(view, record, baselines, note), view.table(),
                    live_lanes(view.rounds, record, view.colors))  # with full information: live
            plotted_at, plotted_rounds = t_frame, len(view.rounds)
        yield (view.tokens_html(), *slow[:4], view.text(), skip, slow[4])
        stream.frame_cost(time.perf_counter() - t_frame)


def run_lanes(record: RunRecord) -> dict[str, list[float]]:
    """The finished run's drafter lanes: live cells where the engine scored them, the rest teacher-forced now
    (the model is still held by this request)."""
    if not record.rounds or record.summary is None:
        return {}
    try:
        lanes, secs = lanes_for(bundle_for(record.preset), record.summary.prompt, record.rounds, record.summary.config)
    except Exception:  # the answer stands without its lanes; the log keeps why
        log.exception("drafter lanes failed")
        return {}
    log.info("lanes: %d tokens x %d drafters in %.0f ms", record.summary.new_tokens, len(lanes), 1000 * secs)
    return lanes


def stop_generation(request: gr.Request = None) -> None:
    """Stop button, or the tab closed: the session's running generations end at the next round. The
    stream then draws its final frame, so the page keeps everything generated so far."""
    STOPS.signal(session_key(request))


def _baseline_duration(record: RunRecord | None = None, *args: Any, **kwargs: Any) -> int:
    """ZeroGPU seconds for timing the target alone: one generation of the run's length."""
    try:
        return gpu_duration(record.rounds[-1].new_tokens, record.preset)
    except Exception:  # sizing never fails a request
        return gpu_duration(None)


@gpu(duration=_baseline_duration)
def measure_baseline(record: RunRecord | None, baselines: dict | None, auto: bool = True, forced: bool = False):
    """The target alone on the same prompt and token count, timed in this session (cached per prompt)."""
    baselines = dict(baselines or {})
    if not record or not record.rounds or not (auto or forced):
        return gr.skip(), baselines
    rounds = record.rounds
    n = rounds[-1].new_tokens
    key = baseline_key(record.preset, record.prompt, n)
    if key not in baselines or forced:
        bundle = bundle_for(record.preset)
        try:
            out, secs = measure_target(bundle, record.prompt, n)
        except Exception as e:
            raise failure(e) from None
        ours = [t for ev in rounds for t in ev.emitted]
        note = f"Target alone measured on this prompt in this session: {len(out)} tokens in {secs:.2f} s."
        if record.settings["temperature"] == 0:
            note += " " + identity_note(bundle, record.prompt, ours, out)
        baselines[key] = {"tokens_per_s": len(out) / secs if secs > 0 else 0.0, "note": note}
    view = viz.LiveView(viz.drafter_colors(record.all_drafters), record.drafters)
    for ev in [*rounds, record.summary]:
        if ev is not None:
            view.add(ev, 0.0)
    return stats(view, record, baselines), baselines


def identity_note(bundle: Bundle, prompt: str, ours: list[int], reference: list[int]) -> str:
    """Greedy runs: whether the output is the target's own greedy decoding, and if not, where the two
    part and why (in bf16/fp16 a near-tie that batched verification rounds the other way)."""
    with MODEL.hold():
        d = first_divergence(bundle, encode_prompt(bundle, prompt, True), ours, reference)
    if d is None:
        return "Output identical to the target's own greedy decoding \u2713"
    return f"Output differs from the target's greedy decoding: {d.explain(bundle.tokenizer)}."


def policy_choices(drafters: list[str]) -> list[str]:
    """The Policy dropdown: every bandit policy, then each drafter alone."""
    return list(POLICIES) + [single_method(d) for d in drafters]


def on_preset(name: str):
    """Another preset: its drafters (its defaults ticked), the policies over them, its draft length."""
    if name not in available_presets():
        raise gr.Error(f"unknown preset {name!r}")
    bundle = bundle_for(name)  # a hub preset not loaded yet loads in the background; the one who asked is told
    names = bundle.drafter_names
    return (gr.update(choices=names, value=bundle.default_drafters),
            gr.update(choices=policy_choices(names), value=PAGE_POLICY),
            gr.update(value=PRESETS[name].gamma))
