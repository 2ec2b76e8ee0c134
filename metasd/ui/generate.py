"""Generate tab handlers: stream one generation as page frames (/generate), stop it, time the target
alone for the speed-up, and switch presets."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import gradio as gr

from metasd.bandits.policies import POLICIES, single_method
from metasd.core import defaults
from metasd.core.validation import InvalidInput
from metasd.decoding.engine import Prepared, Request, check, drive, encode_prompt, steps
from metasd.decoding.lanes import lanes_for
from metasd.decoding.loading import Bundle
from metasd.decoding.numerics import first_divergence
from metasd.decoding.prefix import PrefixStore
from metasd.models.presets import DEFAULT_PRESET, PRESETS
from metasd.models.spaces import gpu_duration
from metasd.serving.batch import (
    BLOCKS_TRIED,
    Rounds,
    check_shared_pass,
    kv_bytes_per_token,
    measure_pass_cost,
    pass_block,
    supports,
)
from metasd.serving.remote import Job, RoundsPool
from metasd.serving.streaming import EngineStream, FairSlots, Place, Ticket, in_fresh_thread, on_event_loop
from metasd.ui import viz
from metasd.ui.bundles import WAIT_IN_REQUESTS, PresetLoad, TargetProgress, available_presets, default_preset, measure_target
from metasd.ui.config import (
    BATCH_DRAFTS,
    BATCH_SLOWDOWN,
    CROWD_THREADS,
    FRAME_FPS,
    HAS_CUDA,
    KV_BUDGET_MB,
    MAX_BATCH,
    MAX_NEW_TOKENS,
    PAGE_POLICY,
    PASS_BLOCK,
    PLOT_INTERVAL_S,
    PREFILL_THREADS,
    PREFIX_MB,
    ROUNDS_PROCESS,
    TORCH_THREADS,
    gpu,
)
from metasd.ui.errors import failure, refused
from metasd.ui.frames import (
    STREAM_PLACEHOLDER,
    UNREAD,
    Frame,
    Unchanged,
    baseline_key,
    final_status,
    frame,
    lanes_placeholder,
    lanes_view,
    live_lanes,
    plot,
    stats,
)
from metasd.ui.server import Server
from metasd.ui.session import RunRecord, SessionReader, session_key

WAIT_UPDATE_S = 1.0  # a waiting run's page hears from the line at least this often

log = logging.getLogger(__name__)
LANES_STOPPED = "No drafter lanes for a stopped run: they are computed when an answer ends on its own."


@gpu
def generate_view(server: Server, prompt: str, preset: str = DEFAULT_PRESET, drafters: list[str] | None = None,
                  policy: str = defaults.POLICY, reward: str = defaults.REWARD, gamma: int | None = defaults.GAMMA,
                  max_new_tokens: int = defaults.MAX_NEW_TOKENS, temperature: float = defaults.TEMPERATURE,
                  top_p: float = defaults.TOP_P, seed: int = defaults.SEED, full_info: bool = defaults.FULL_INFO,
                  cold: bool = defaults.COLD, baselines: dict | None = None, request: gr.Request = None):
    """Stream a generation. The engine runs at full speed in its own worker (metasd.serving.streaming); the page
    draws the latest state at most FRAME_FPS times a second (figures and table at most every
    PLOT_INTERVAL_S) and always ends on one complete final frame. Outputs: token view, arm
    probabilities, regret, numbers, per-drafter table, the answer as plain text, the run record, the drafter
    lanes (live with full information, else within a second or two of the answer's end)."""
    stop = threading.Event()
    key = session_key(request)
    # A browser session runs one generation at a time: its new Run stops the previous one (waiting or running);
    # API calls without a session don't. Registered once the run is accepted (a refused request leaves nothing
    # behind), or at once where it first waits for the models to load (so that Stop reaches it there).
    register = server.stops.replace if request is not None and key != "api" else server.stops.start
    registered = False
    try:
        load = server.presets.loading(preset) if WAIT_IN_REQUESTS else None
        if load is not None:
            register(key, stop)
            registered = True
            try:  # a load that failed, or never ended, is told to every run that waited on it
                yield from _loading_frames(server, preset, load, stop, baselines)
            except InvalidInput as e:
                raise refused(e) from None
            if stop.is_set():
                return
        bundle = server.presets.bundle_for(preset)
        names = bundle.drafter_names
        drafters = _drafters_asked(server, names, drafters)
        settings = {"policy": policy, "reward": reward, "gamma": gamma, "max_new_tokens": max_new_tokens,
                    "temperature": temperature, "top_p": top_p, "seed": seed, "full_info": full_info,
                    "priors": not cold}
        prepared, events = _start_engine(server, bundle, prompt, drafters, settings, stop)
        settings = {**settings, "gamma": prepared.settings.gamma}  # None asked the preset's: the record says which
        if not registered:
            register(key, stop)
            registered = True
        record = RunRecord(preset=bundle.preset.name, prompt=prepared.text, settings=settings, all_drafters=names,
                           drafters=list(drafters) if drafters else names)
        view = viz.LiveView(viz.drafter_colors(names), record.drafters, placeholder=STREAM_PLACEHOLDER)
        reading = SessionReader(key, server.streams)
        yield from map(Unchanged(), _stream(server, events, stop, view, record, baselines, key, reading))
    finally:
        if registered:
            server.stops.end(key, stop)


def _loading_frames(server: Server, preset: str, load: PresetLoad, stop: threading.Event,
                    baselines: dict | None) -> Iterator[Frame]:
    """While the server's models load (the first minute after a start): what the load is doing, every
    WAIT_UPDATE_S, until it has ended (loaded or failed), Stop is pressed or LOAD_WAIT_S have gone by."""
    names, chosen = server.presets.drafters(preset)
    view = viz.LiveView(viz.drafter_colors(names), chosen, placeholder="waiting for the model ...")
    record = RunRecord(preset=preset, prompt="", all_drafters=names, drafters=chosen)
    first = True
    for _ in load.waiting(preset, stop, WAIT_UPDATE_S):
        status = f"waiting for the model to load ({load.seconds:.0f} s so far)"
        note = (f"The server has just started and is loading its models: {load.step.rstrip(' .')}. Your run starts as "
                "soon as they are ready (on a machine's first start the offline model is converted once, about 20 s). "
                "Stop takes this run back.")
        yield (frame(view, record, baselines, status, note, record=None, lanes=lanes_placeholder()) if first
               else Frame(tokens=view.tokens_html(status), stats=stats(view, record, baselines, note)))
        first = False
    if stop.is_set():
        yield frame(view, record, baselines, "stopped while the model was loading: you pressed Stop", record=None,
                    lanes=lanes_placeholder())


def _drafters_asked(server: Server, names: list[str], drafters: Any) -> Any:
    """The drafters a request asked for, checked for shape (the engine's validation checks the names);
    None for all of the preset's."""
    if drafters is not None and not isinstance(drafters, list | tuple | str):
        raise gr.Error("drafters must be a list of drafter names")
    if drafters is not None and len(drafters) == 0:
        raise gr.Error("Tick at least one drafter.")
    if (isinstance(drafters, list) and not set(drafters) <= set(names)
            and list(drafters) == server.presets.drafters(default_preset())[0]):
        return None  # the page's default list was sent along with another preset: use all of its drafters
    return drafters


def _start_engine(server: Server, bundle: Bundle, prompt: Any, drafters: Any, settings: dict[str, Any],
                  stop: threading.Event) -> tuple[Prepared, Iterator[Any]]:
    """The request checked once (its cleaned prompt, ids and settings) and the engine's event stream, nothing run
    yet."""
    try:
        asked = list(drafters) if isinstance(drafters, list | tuple) else drafters
        prepared = check(bundle, prompt, drafters=asked, max_new_tokens_limit=MAX_NEW_TOKENS, **settings)
        events = engine_events(server, bundle, prepared, stop)
    except InvalidInput as e:
        raise refused(e) from None
    except Exception as e:  # e.g. the tokenizer failing on something validation let through
        raise failure(e) from None
    return prepared, events


def engine_events(server: Server, bundle: Bundle, prepared: Prepared, stop: threading.Event,
                  timed: bool = False) -> Iterator[Any]:
    """One checked run's events (nothing run until read): in the shared rounds where this server has them for this
    preset (start_rounds), with everyone else's runs, else from the engine alone. Generate's runs and each of
    Compare's come this way. A `timed` run (Compare's, set against the target alone timed in this process) reads
    its own prompt in the rounds, and skips them where their passes are padded into blocks: there it would be
    timed on another computation than the target alone."""
    rounds = server.shared.now
    if rounds is not None and bundle.target is rounds.model and not (timed and rounds.block):
        if isinstance(rounds, RoundsPool):
            return rounds.submit(Job.of(prepared, timed), stop)
        req = Request.of(bundle, prepared)
        req.timed = timed
        return _shared(rounds, req, stop)
    req = Request.of(bundle, prepared)
    req.threads = None if HAS_CUDA else TORCH_THREADS  # the engine worker's rounds (its prompt's pass: PREFILL_THREADS)
    return drive(req, stop)


def start_rounds(server: Server, bundle: Bundle, process: int = ROUNDS_PROCESS) -> str:
    """Share the target's passes between this server's page runs, if its rows are invariant: the batch bound
    from the pass-time cost model measured now and from the KV-cache budget; the admission slots follow it.
    With `process` > 0, the rounds run in that many processes forked now (call it before the server starts its
    threads), each run in one of them. Returns the line for the startup log."""
    server.shared.stop()
    if not supports(bundle.target):
        return "shared rounds: off (the shared pass does not compute this target's layout)"
    block = pass_block(bundle.target, asked=PASS_BLOCK)
    if block is None:
        return ("shared rounds: off (this target's linear layers give a row other bits beside other rows, in calls "
                f"of any size and in blocks of {', '.join(map(str, BLOCKS_TRIED))} rows)")
    failed = in_fresh_thread(lambda: check_shared_pass(bundle.target, block), TORCH_THREADS, name="metasd-pass-check")
    if failed:
        return f"shared rounds: off (the shared pass was checked against the model's own: {failed})"
    rows = bundle.preset.gamma + 1  # a round's last id and a full draft: the most a chain round verifies
    cost = in_fresh_thread(lambda: measure_pass_cost(bundle.target, rows, block=block), TORCH_THREADS,
                           name="metasd-cost-model")
    why = ""
    if block and not PASS_BLOCK:  # the CPU's fallback: what blocks cost a lone request, in the log
        plain = in_fresh_thread(lambda: measure_pass_cost(bundle.target, rows, requests=(1,)), TORCH_THREADS,
                                name="metasd-cost-model")
        why = (f": without them this CPU's kernels give a row other bits beside other rows; a lone pass "
               f"{cost.ms[0]:.0f} ms in blocks against {plain.ms[0]:.0f} ms without")
    blocks = f" (row-wise layers in blocks of {block} rows{why})" if block else ""
    by_time = cost.best_batch(BATCH_SLOWDOWN)
    per_request = kv_bytes_per_token(bundle.target) * min(bundle.max_context, 1024 + MAX_NEW_TOKENS)
    by_memory = max(1, KV_BUDGET_MB * 2**20 // per_request)
    n = max(1, min(by_time, by_memory, MAX_BATCH))
    # Every process keeps its own prompt passes: the budget is theirs together.
    rounds = Rounds(bundle.target, n, threads=TORCH_THREADS, share=True,
                    prefixes=PrefixStore(PREFIX_MB * 2**20 // max(1, process)), share_drafts=BATCH_DRAFTS,
                    crowd_threads=CROWD_THREADS if process else None, block=block)
    server.model.resize(n)
    drafters = {name: m for name, m in bundle.models.items() if hasattr(m, "model")}  # LMs, not white-box heads
    together = in_fresh_thread(lambda: [d for d, m in drafters.items() if rounds.drafts_together(m)], TORCH_THREADS,
                               name="metasd-drafter-probe")  # before the fork: the child keeps the answers
    server.shared.start(RoundsPool(bundle, rounds, process) if process else rounds)
    shared = server.shared.now
    where = "in this process" + blocks
    if isinstance(shared, RoundsPool):
        pids = ", ".join(str(p) for p in shared.pids)
        where = (f"in process{'es' if process > 1 else ''} {pids} (each run in the one holding the fewest; "
                 f"{TORCH_THREADS} torch thread(s) for a run alone, {CROWD_THREADS or TORCH_THREADS} each while "
                 "several run)") + blocks
    return (f"shared rounds {where}: up to {n} runs at once (cost model: {cost.describe()}; at most "
            f"{BATCH_SLOWDOWN:g}x a solo pass -> {by_time}; KV budget {KV_BUDGET_MB} MB -> {by_memory}; cap "
            f"{MAX_BATCH}); prompt passes kept: up to {PREFIX_MB} MB; drafting together: {', '.join(together) or 'none'}")


def _shared(rounds: Rounds, req: Any, stop: threading.Event) -> Iterator[Any]:
    """The request's events from the shared rounds; it joins them only once its stream starts (admitted)."""
    yield from rounds.submit(req, steps(req, stop))


def _stream(server: Server, events: Iterator[Any], stop: threading.Event, view: viz.LiveView, record: RunRecord,
            baselines: dict | None, key: str = "", reading: Callable[[], bool] = lambda: True) -> Iterator[tuple]:
    """The page's frames: the run's place in the app's line while it waits (or that the class is full),
    then the engine's. However it ends, the engine's worker is closed and the model handed back."""
    stream: EngineStream | None = None
    ticket = None
    try:
        ticket = server.model.join(key, stop)
        if ticket is None:  # past capacity: said at once, in the page's own words
            yield frame(view, record, baselines, "the class is full", full_note(server.model), record=None,
                        lanes=lanes_placeholder())
            return
        yield from _waiting_frames(server.model, ticket, view, record, baselines, reading)
        if ticket.left:
            if ticket.left == "stopped":
                why = "you pressed Stop"
            else:  # a client lost while it waited: the operator sees it too
                why = "its stream was not read"
                log.warning("a waiting run left the line: its stream was not read (%d waiting)", server.model.waiting)
            yield frame(view, record, baselines, f"left the line before starting: {why}", record=None,
                        lanes=lanes_placeholder())
            return
        # The engine starts before the first frame is drawn: prefill runs meanwhile.
        own = HAS_CUDA or server.shared.now is not None  # shared rounds: torch runs in the rounds' thread, not this stream's
        stream = EngineStream(events, stop, max_fps=FRAME_FPS, torch_threads=None if own else TORCH_THREADS,
                              prefill_threads=None if own else PREFILL_THREADS, budget=server.frames)
        yield frame(view, record, baselines, None, "starting: prefill ...", record=None, lanes=lanes_placeholder())
        yield from _engine_frames(server, stream, view, record, baselines, reading)
    except InvalidInput as e:
        raise refused(e) from None
    except Exception as e:  # shown as a message, never a traceback; the log keeps the details
        raise failure(e) from None
    finally:
        _finish(server.model, stream, events, ticket)


CLOSE_TIMEOUT_S = 10.0  # a worker ends within a round; waiting for it never takes longer than this


def _finish(slots: FairSlots, stream: EngineStream | None, events: Iterator[Any], ticket: Ticket | None) -> None:
    """End the worker (it frees the drafters' and the target's caches), then hand the model back, or leave the
    line if the run never started. A cancelled stream is closed on the server's event loop: there the wait goes
    to a thread of its own, so no client stalls."""
    def end() -> None:
        try:
            if stream is not None:
                stream.close(CLOSE_TIMEOUT_S)
            else:
                events.close()
        finally:
            if ticket is not None and ticket.admitted_at is not None:
                slots.release(ticket)
            elif ticket is not None:
                slots.cancel(ticket)  # the page went away while waiting: out of the line at once

    if on_event_loop():
        threading.Thread(target=end, name="metasd-close", daemon=True).start()
    else:
        end()


def full_note(slots: FairSlots) -> str:
    """What a run refused at the door is told: the class is full, and when to come back."""
    return (f"The class is full: {slots.waiting} runs are already waiting for the model on this server. "
            f"Please press Run again in about {_duration(slots.retry_after_s())}.")


def waiting_status(p: Place) -> str:
    """A waiting run's status line: its place and the expected wait ("3rd in line, about 20 s")."""
    return f"{_ordinal(p.place)} in line, about {_duration(p.eta_s)}"


def _waiting_frames(slots: FairSlots, ticket: Ticket, view: viz.LiveView, record: RunRecord, baselines: dict | None,
                    reading: Callable[[], bool]) -> Iterator[tuple]:
    """While the run waits: a full frame at once, then the status and numbers whenever the place changes
    (at least every WAIT_UPDATE_S, which also tells whether the client still reads its stream)."""
    said, said_at, first = "", 0.0, True
    for place in slots.wait(ticket, reading=reading):
        status = waiting_status(place)
        note = (f"Waiting for the model: {place.running} run(s) on it now, {slots.waiting} in line. Stop takes "
                "this run out of the line.")
        if first:
            yield frame(view, record, baselines, status, note, record=None, lanes=lanes_placeholder())
            first = False
        elif status != said or time.perf_counter() - said_at >= WAIT_UPDATE_S:
            yield Frame(tokens=view.tokens_html(status), stats=stats(view, record, baselines, note))
        else:
            continue
        said, said_at = status, time.perf_counter()


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _duration(s: float) -> str:
    return f"{max(1, round(s))} s" if s < 90 else f"{round(s / 60)} min"


def _engine_frames(server: Server, stream: EngineStream, view: viz.LiveView, record: RunRecord,
                   baselines: dict | None, reading: Callable[[], bool] = lambda: True) -> Iterator[tuple]:
    """One frame per batch of engine events, the last one complete and carrying the finished record. A
    client that stopped reading its stream stops the run (its frames would pile up unread)."""
    plotted_at, plotted_rounds, unread = -1e9, -1, False
    for batch, done in stream.batches():
        if not unread and not reading():
            log.warning("a run was stopped after %d rounds: its stream was not read", stream.rounds)
            stream.close(timeout=0)
            unread = True
        t_frame = time.perf_counter()
        for item in batch:
            view.add(item.event, item.t)
        record.frames = (stream.frames, stream.rounds)
        if done:
            if unread and view.summary is not None and view.summary.stop_reason == "stopped":
                view.summary = replace(view.summary, config={**(view.summary.config or {}), **UNREAD})
            record = replace(record, rounds=view.rounds, summary=view.summary)
            status = final_status(view.summary) if view.summary else "ended"
            if view.summary is None or view.summary.stop_reason == "stopped":  # Stop, or the tab closed: no more work
                yield frame(view, record, baselines, status, record=record, lanes=lanes_placeholder(LANES_STOPPED))
                break
            yield frame(view, record, baselines, status, record=record)
            # The lanes after the answer: its frame is out first, so they never delay it. While other runs share
            # the model, only what the engine scored live (full information): the teacher-forced passes would
            # cost the class about a third of a run's work each.
            others = sharing_model(server)
            if others and not record.settings.get("full_info"):
                yield frame(view, record, baselines, status, record=record, lanes=lanes_placeholder(
                    f"No drafter lanes now: {others} other run{'s' if others != 1 else ''} share the model, and the "
                    "lanes after an answer would cost them a third of a run. Tick Full-information feedback to see them live."))
                break
            lanes = in_fresh_thread(lambda r=record, post=not others: run_lanes(server, r, post=post),
                                    None if HAS_CUDA else PREFILL_THREADS, "metasd-lanes")
            record = replace(record, lanes=lanes)
            # The final frame again, whole (a caller reading only the last one gets every view), with the lanes.
            yield frame(view, record, baselines, status, record=record,
                        lanes=lanes_view(record.rounds, lanes, view.colors,
                                         empty="No drafter lanes for this run (see the server log)."))
            break
        # The tokens go out every frame (appended text); the figures, numbers and table, which are
        # re-sent whole, at most every PLOT_INTERVAL_S, and less often as they grow.
        out = Frame(tokens=view.tokens_html(), text=view.text())
        if t_frame - plotted_at >= PLOT_INTERVAL_S * (1 + len(view.rounds) / 100) and len(view.rounds) != plotted_rounds:
            note = f"round {len(view.rounds)} \u00b7 {view.new_tokens} tokens \u00b7 streaming{_company(server)} ..."
            out = out._replace(arms=plot(view.arm_json()), regret=plot(view.regret_json()),
                               stats=stats(view, record, baselines, note), table=view.table(),
                               lanes=live_lanes(view.rounds, record, view.colors))  # with full information: live
            plotted_at, plotted_rounds = t_frame, len(view.rounds)
        yield out
        stream.frame_cost(time.perf_counter() - t_frame)


def run_lanes(server: Server, record: RunRecord, post: bool = True) -> dict[str, list[float]]:
    """The finished run's drafter lanes: live cells where the engine scored them, the rest teacher-forced now
    (the model is still held by this request); `post=False`: the live cells only."""
    if not record.rounds or record.summary is None:
        return {}
    try:
        lanes, secs = lanes_for(server.presets.bundle_for(record.preset), record.summary.prompt, record.rounds,
                                record.summary.config, post=post)
    except Exception:  # the answer stands without its lanes; the log keeps why
        log.exception("drafter lanes failed")
        return {}
    log.info("lanes: %d tokens x %d drafters in %.0f ms", record.summary.new_tokens, len(lanes), 1000 * secs)
    return lanes


def sharing_model(server: Server) -> int:
    """How many other page runs share the model with a finished one that still holds its slot (shared rounds;
    0 where runs take turns): its after-the-answer extras then wait for a quiet moment."""
    model = server.model
    return 0 if server.shared.now is None else max(0, model.running - 1) + model.waiting


def _company(server: Server) -> str:
    """ \u00b7 served together with N other runs (shared rounds), or nothing."""
    shared = server.shared.now
    others = shared.together - 1 if shared is not None else 0
    return f" \u00b7 served together with {others} other run{'s' if others != 1 else ''}" if others > 0 else ""


def stop_generation(server: Server, request: gr.Request = None) -> None:
    """Stop button, or the tab closed: the session's running generations end at the next round. The
    stream then draws its final frame, so the page keeps everything generated so far."""
    server.stops.signal(session_key(request))


def _baseline_duration(record: RunRecord | None = None, *args: Any, **kwargs: Any) -> int:
    """ZeroGPU seconds for timing the target alone: one generation of the run's length."""
    try:
        return gpu_duration(record.rounds[-1].new_tokens, record.preset)
    except Exception:  # sizing never fails a request
        return gpu_duration(None)


@gpu(duration=_baseline_duration)
def measure_baseline_stream(server: Server, record: RunRecord | None, baselines: dict | None, auto: bool = True,
                            forced: bool = False):
    """The target alone on the same prompt and token count, timed in this session (cached per prompt). While it
    runs, the numbers show its progress at the run's frame rate: the page draws while the target alone is timed
    as it drew while the run was, so on a small machine, where the browser draws on the engine's cores, its
    drawing slows both sides of the speed-up alike. Yields (stats, baselines); the last one is the result."""
    baselines = dict(baselines or {})
    if not record or not record.rounds or not (auto or forced):
        yield gr.skip(), baselines
        return
    rounds = record.rounds
    n = rounds[-1].new_tokens
    key = baseline_key(record.preset, record.prompt, n)
    shared = None if key in baselines or forced else server.timings.get(key)
    if shared is not None:  # another session timed this prompt already
        baselines[key] = {**shared, "note": shared["note"].replace("in this session", "on this server")}
    # Others wait for the model (their runs go first), or share its passes (a timing beside them would slow them
    # and be unfair to the target): this timing only on demand.
    model = server.model
    busy = (f"{model.waiting} runs wait for the model" if model.waiting else
            f"{model.running} runs share the model" if server.shared.now is not None and model.running else "")
    if key not in baselines and not forced and busy:
        yield stats(_record_view(record), record, baselines,
                    f"Target alone not timed now: {busy}. Press “Measure target alone” later."), baselines
        return
    if key not in baselines or forced:
        bundle = server.presets.bundle_for(record.preset)
        timing = _Timing(bundle, record.prompt, n, model)
        view = _record_view(record)
        while timing.wait(1.0 / FRAME_FPS):
            yield stats(view, record, baselines, timing.progress_note()), gr.skip()
        out, secs = timing.result()
        ours = [t for ev in rounds for t in ev.emitted]
        note = (f"Target alone measured on this prompt in this session: {len(out)} tokens in {secs:.2f} s (engine "
                "clock, the page drawing its progress as it drew the run's).")
        if record.settings["temperature"] == 0:
            note += " " + identity_note(bundle, record.prompt, ours, out, model)
        baselines[key] = {"tokens_per_s": len(out) / secs if secs > 0 else 0.0, "note": note}
        server.timings.put(key, baselines[key])
    yield stats(_record_view(record), record, baselines), baselines


def measure_baseline(server: Server, record: RunRecord | None, baselines: dict | None, auto: bool = True,
                     forced: bool = False):
    """measure_baseline_stream's result, its last frame: (stats, baselines)."""
    frames = list(measure_baseline_stream(server, record, baselines, auto, forced))
    return frames[-1]


def measure_now(server: Server, record: RunRecord | None, baselines: dict | None):
    """The “Measure target alone” button: time it again, streamed."""
    yield from measure_baseline_stream(server, record, baselines, True, True)


class _Timing:
    """The target alone timed in a thread of its own (bundles.measure_target), and what it has generated so far."""

    def __init__(self, bundle: Bundle, prompt: str, n: int, slots: FairSlots) -> None:
        self.bundle, self.n, self.slots = bundle, n, slots
        self.progress = TargetProgress()
        self.done: tuple[list[int], float] | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(prompt,), name="metasd-baseline", daemon=True)
        self.thread.start()

    def _run(self, prompt: str) -> None:
        try:
            self.done = measure_target(self.bundle, prompt, self.n, self.slots, self.progress)
        except BaseException as e:  # noqa: BLE001  (raised in the handler's thread, by result())
            self.error = e

    def wait(self, seconds: float) -> bool:
        """Wait up to `seconds`; whether it still runs."""
        self.thread.join(seconds)
        return self.thread.is_alive()

    def progress_note(self) -> str:
        made, ids = self.progress.made, self.progress.ids
        tail = ""
        if made > 0 and ids is not None and self.bundle.tokenizer is not None:
            tail = " \u201c\u2026" + self.bundle.tokenizer.decode(ids[0, -8:].tolist()).replace("\n", " ") + "\u201d"
        return (f"Timing the target alone on this prompt: {max(made, 0)} of {self.n} tokens{tail}. The page keeps "
                "drawing while it is timed, as it did during the run.")

    def result(self) -> tuple[list[int], float]:
        if self.error is not None:
            raise failure(self.error) from None
        assert self.done is not None
        return self.done


def _record_view(record: RunRecord) -> viz.LiveView:
    view = viz.LiveView(viz.drafter_colors(record.all_drafters), record.drafters)
    for ev in [*record.rounds, record.summary]:
        if ev is not None:
            view.add(ev, 0.0)
    return view


def identity_note(bundle: Bundle, prompt: str, ours: list[int], reference: list[int], slots: FairSlots) -> str:
    """Greedy runs: whether the output is the target's own greedy decoding, and if not, where the two
    part and why (in bf16/fp16 a near-tie that batched verification rounds the other way)."""
    with slots.hold():
        d = first_divergence(bundle, encode_prompt(bundle, prompt, True), ours, reference)
    if d is None:
        small = " (the target is a small model: speculative decoding keeps its answer exactly, right or wrong)"
        return "Output identical to the target's own greedy decoding \u2713" + (small if "135M" in bundle.preset.target else "")
    return f"Output differs from the target's greedy decoding: {d.explain(bundle.tokenizer)}."


def policy_choices(drafters: list[str]) -> list[str]:
    """The Policy dropdown: every bandit policy, then each drafter alone."""
    return list(POLICIES) + [single_method(d) for d in drafters]


def on_preset(server: Server, name: str):
    """Another preset: its drafters (its defaults ticked), the policies over them, its draft length."""
    if name not in available_presets():
        raise gr.Error(f"unknown preset {name!r}")
    bundle = server.presets.bundle_for(name)  # a hub preset not loaded yet loads in the background; the one who asked is told
    names = bundle.drafter_names
    return (gr.update(choices=names, value=bundle.default_drafters),
            gr.update(choices=policy_choices(names), value=PAGE_POLICY),
            gr.update(value=PRESETS[name].gamma))
