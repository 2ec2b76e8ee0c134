"""Bandit playground handler (/playground): policies side by side on synthetic drafters, thousands of
rounds in a moment, no model."""

from __future__ import annotations

import functools
from concurrent.futures.process import BrokenProcessPool

import gradio as gr
import pandas as pd

from metasd.bandits.playground import SynthDrafter, compare, expected_speedup, expected_tokens
from metasd.core.validation import InvalidInput, markdown_literal, validate_playground
from metasd.ui import viz
from metasd.ui.errors import failure
from metasd.ui.server import Server

PLAYGROUND_DRAFTERS = pd.DataFrame(
    [["prompt lookup", 0.45, 0.0], ["token recycling", 0.55, 0.02], ["small LM", 0.75, 0.08], ["large LM", 0.9, 0.35]],
    columns=["drafter", "acceptance", "cost"],
)


def run_playground(server: Server, table: pd.DataFrame, policies: list[str], gamma: int, rounds: int, reward: str,
                   full_info: bool, spread: float, seed: int, here: bool = False):
    """The simulation's arm probabilities, regret, per-policy table, and each drafter's expected value. It runs in
    the server's simulator process, or with `here` in this one (the start-up's default: no run streams yet)."""
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
        results = (compare if here else functools.partial(server.simulator.run, compare))(
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


def playground_default(server: Server):
    """The simulation a page opens with (the tab's default settings), computed once per server, in its own process
    (0.5 s here), which the server does at start-up: page loads queue no work, and a class opening the page costs
    nothing. The Simulator's process would cost ~3 s of CPU to start: on a 2-core machine, made on the first page
    load, it slowed the first Run beside it from 1.4x to 0.8x (docs/BENCHMARKS.md, *The page's own cost*)."""
    policies, gamma, rounds, reward, full_info, spread, seed = PLAYGROUND_DEFAULTS
    return server.opening.get(lambda: run_playground(server, PLAYGROUND_DRAFTERS, list(policies), gamma, rounds, reward,
                                                     full_info, spread, seed, here=True))
