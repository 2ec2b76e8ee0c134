"""Bandit playground handler (/playground): policies side by side on synthetic drafters, thousands of
rounds in a moment, no model."""

from __future__ import annotations

import functools
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import gradio as gr
import pandas as pd

from metasd.bandits.playground import SynthDrafter, compare, expected_speedup, expected_tokens
from metasd.core.validation import InvalidInput, markdown_literal, validate_playground
from metasd.ui import viz
from metasd.ui.errors import failure

PLAYGROUND_DRAFTERS = pd.DataFrame(
    [["prompt lookup", 0.45, 0.0], ["token recycling", 0.55, 0.02], ["small LM", 0.75, 0.08], ["large LM", 0.9, 0.35]],
    columns=["drafter", "acceptance", "cost"],
)


class Simulator:
    """Simulations in one process of their own at the lowest CPU priority, one at a time.

    A simulation is pure Python and numpy: in the server's process it held the interpreter lock the engine's
    round loop and the event loop need, and four of them (even one at a time) slowed a 0.7 s Generate beside
    them to 4.5 s on 2 cores. In a process of its own, niced, it takes only what the model leaves over; a queued
    simulation waits its turn in the pool, a generation never waits for one. Spawned, not forked: the server has
    torch's thread pools, which a fork would copy half-alive.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_lowest_priority)
            pool = self._pool
        try:
            return pool.submit(fn, *args, **kwargs).result()
        except BrokenProcessPool:  # the process died (killed, out of memory): the next simulation starts a new one
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            raise

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def _lowest_priority() -> None:
    os.nice(19)


SIMULATOR = Simulator()


def run_playground(table: pd.DataFrame, policies: list[str], gamma: int, rounds: int, reward: str, full_info: bool,
                   spread: float, seed: int, here: bool = False):
    """The simulation's arm probabilities, regret, per-policy table, and each drafter's expected value. It runs in
    the Simulator's process, or with `here` in this one (the start-up's default: no run streams yet)."""
    try:
        rows = table.to_dict("records") if isinstance(table, pd.DataFrame) else table
        st = validate_playground(rows, policies, gamma, rounds, reward, full_info, spread, seed)
    except InvalidInput as e:
        raise gr.Error(f"Playground settings: {e}", print_exception=False) from None
    except Exception as e:  # e.g. a table gradio could not read: the app's message, the traceback in the log
        raise failure(e, "The simulation") from None
    drafters = [SynthDrafter(name, acc, cost) for name, acc, cost in st.drafters]
    gamma = st.gamma
    try:
        results = (compare if here else functools.partial(SIMULATOR.run, compare))(
            list(st.policies), drafters, gamma=st.gamma, rounds=st.rounds, reward=st.reward, full_info=st.full_info,
            spread=st.spread, seed=st.seed)
    except (ValueError, TypeError, KeyError) as e:
        raise gr.Error(f"Playground settings: {e}", print_exception=False) from None
    except BrokenProcessPool as e:
        raise failure(e, "The simulation") from None
    colors = viz.drafter_colors([d.name for d in drafters])
    best = results[0].best
    lines = ["| drafter | E[tokens / call] | speed-up E[tokens]/(\u03b3c+1) |", "|---|---|---|"]
    for i, d in enumerate(drafters):
        mark = " **(best)**" if i == best else ""
        lines.append(f"| {markdown_literal(d.name)}{mark} | {expected_tokens(d.acceptance, int(gamma)):.2f} | "
                     f"{expected_speedup(d.acceptance, int(gamma), d.cost):.2f}\u00d7 |")
    return (viz.playground_probability_figure(results, colors), viz.playground_regret_figure(results),
            viz.playground_table(results), "\n".join(lines))


PLAYGROUND_DEFAULTS = (["metasd-ucb", "exp3", "thompson", "hedge"], 4, 3000, "throughput", False, 8.0, 0)
_default_lock = threading.Lock()


@functools.cache
def _simulated_default() -> tuple:
    policies, gamma, rounds, reward, full_info, spread, seed = PLAYGROUND_DEFAULTS
    return run_playground(PLAYGROUND_DRAFTERS, list(policies), gamma, rounds, reward, full_info, spread, seed,
                          here=True)


def playground_default():
    """The simulation a page opens with (the tab's default settings), computed once per server, in its own process
    (0.5 s here), which the server does at start-up: page loads queue no work, and a class opening the page costs
    nothing. The Simulator's process would cost ~3 s of CPU to start: on a 2-core machine, made on the first page
    load, it slowed the first Run beside it from 1.4x to 0.8x (docs/BENCHMARKS.md, *The page's own cost*)."""
    with _default_lock:
        return _simulated_default()
