"""One builder function per tab: its components, in page order, and their event wiring to the handlers
in generate, compare, replay and playground. Builders run inside app.build_demo's gr.Blocks and gr.Tabs.

Component creation order and event order are the page's config (component ids, endpoint order), so
they stay exactly as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from metasd.bandits.policies import POLICIES, POLICY_HELP, single_drafter
from metasd.core import defaults
from metasd.core.validation import MAX_PROMPT_CHARS, markdown_literal
from metasd.models.presets import PRESETS
from metasd.ui import text, viz
from metasd.ui.bundles import available_presets
from metasd.ui.compare import COMPARE_COLUMNS, cancel_compare, compare_prompt, compare_set
from metasd.ui.config import (
    COMPARE_MAX_NEW_TOKENS,
    EXAMPLES,
    MAX_NEW_TOKENS,
    PAGE_EXAMPLE,
    PAGE_POLICY,
    REWARD_CHOICES,
    TASKS,
    task_title,
)
from metasd.ui.files import write_logs
from metasd.ui.frames import REPLAY_FIELDS, lanes_placeholder, outputs, plot
from metasd.ui.generate import generate_view, measure_baseline_stream, measure_now, on_preset, policy_choices, stop_generation
from metasd.ui.playground import PLAYGROUND_DEFAULTS, PLAYGROUND_DRAFTERS, playground_default, run_playground
from metasd.ui.replay import gallery, open_grid_run, open_link, replay_at, replay_rounds, replay_view, stop_replay
from metasd.ui.server import Server

# ----------------------------------------------------------------------------------------------
# Helpers of the page


def _as_sent(payload: Any) -> Any:
    return payload


def take_as_sent(*components: gr.components.Component) -> None:
    """Numbers reach the handlers as sent: metasd.core.validation checks their type and range, and its message
    names the setting (gradio's own check says only "Value 99 is greater than maximum value 16", and a
    wrong type gets no message at all). Set on the instance: a gradio subclass would write a .pyi file."""
    for c in components:
        c.preprocess = _as_sent


# The page-only handlers keep their names: a function's name is its (private) endpoint's name in the config.
REJECTED_LOOKS = ["marks", "inline", "hidden"]  # how the token view shows rejected drafts (a class on #tokens)


def _running():
    return gr.update(value="Running \u2026", interactive=False), gr.update(interactive=True)


def _idle():
    return gr.update(value="Run", interactive=True), gr.update(interactive=False)


def _policy_info(name: str) -> str:
    if not isinstance(name, str) or (name not in POLICIES and single_drafter(name) is None):
        return f"**{markdown_literal(name)}**: unknown policy"  # a custom value: shown as literal text (#27)
    alone = single_drafter(name)
    if alone is not None:
        return f"**{markdown_literal(name)}**: {markdown_literal(alone)} alone, plain speculative decoding without a bandit"
    return f"**{name}**: {POLICY_HELP.get(name, 'unknown policy')}"


def _example_label(example: dict[str, Any], width: int = 58) -> str:
    words = " ".join(example["turns"][0].split())
    return f"{task_title(example['category'])} \u00b7 " + (words if len(words) <= width else words[: width - 1] + "\u2026")


def _preset_info(name: str) -> str:
    if len(available_presets()) == 1:
        return f"{PRESETS[name].target.split('/')[-1]} on the CPU (hub presets need a CUDA GPU)"
    return "; ".join(f"{n}: {PRESETS[n].hardware}" for n in available_presets())


def _empty_view(drafters0: list[str], placeholder: str = "Press Run (or Ctrl+Enter) to stream tokens here.") -> viz.LiveView:
    """The views before the first run (Generate) or replay (Replay: its button is Play)."""
    return viz.LiveView(viz.drafter_colors(drafters0), drafters0, placeholder=placeholder)


# ----------------------------------------------------------------------------------------------
# Generate


@dataclass
class GenerateControls:
    """The left column: what to run."""

    prompt: gr.Textbox
    run_btn: gr.Button
    stop_btn: gr.Button
    max_new_tokens: gr.Slider
    policy: gr.Dropdown
    policy_help: gr.Markdown
    preset: gr.Dropdown
    drafters: gr.CheckboxGroup
    reward: gr.Radio
    gamma: gr.Slider
    seed: gr.Number
    temperature: gr.Slider
    top_p: gr.Slider
    full_info: gr.Checkbox
    cold: gr.Checkbox


@dataclass
class GenerateAnswer:
    """The right column and the row below: the answer, its numbers and figures, the per-round log."""

    tokens: gr.HTML
    stats: gr.HTML
    show_rejected: gr.Radio
    auto_base: gr.Checkbox
    measure_btn: gr.Button
    answer_text: gr.Textbox
    arm_plot: gr.Plot
    regret_plot: gr.Plot
    table: gr.DataFrame
    csv_btn: gr.DownloadButton
    json_btn: gr.DownloadButton
    lanes: gr.HTML


def build_generate_tab(server: Server, preset0: str, drafters0: list[str], baselines: gr.State, record: gr.State,
                       concurrency: int) -> None:
    """The Generate tab: settings on the left, the streamed answer on the right. `concurrency`: how many
    generations may hold the model at once (the server's setting)."""
    with gr.Tab("Generate", id="generate"):
        with gr.Row(equal_height=False, elem_id="gen-row"):
            controls = _generate_controls(preset0, drafters0, server.presets.drafters(preset0)[1])
            views = _generate_answer(drafters0)
        with gr.Row():
            table = gr.DataFrame(viz.drafter_table([], drafters0), label="Per drafter", interactive=False,
                                 elem_id="drafter-table", scale=4)
            with gr.Column(scale=1, min_width=200):
                gr.Markdown("**Per-round log** (also of a stopped run)", elem_classes="compact-md")
                csv_btn = gr.DownloadButton("CSV", size="sm", interactive=False)
                json_btn = gr.DownloadButton("JSON", size="sm", interactive=False)
        _wire_generate(server, controls, GenerateAnswer(*views[:-1], table, csv_btn, json_btn, views[-1]), baselines, record,
                       concurrency)
    take_as_sent(controls.gamma, controls.max_new_tokens, controls.temperature, controls.top_p, controls.seed)


def _generate_controls(preset0: str, drafters0: list[str], ticked0: list[str]) -> GenerateControls:
    """The left column: what to run. Only the prompt, Run/Stop and the two most used settings are open,
    so that at projector size (1280x720) the answer on the right is on the first screen."""
    with gr.Column(scale=4, min_width=300, elem_id="controls"):
        prompt = gr.Textbox(label="Prompt", lines=4, max_lines=10, elem_id="prompt",
                            info=f"Up to {MAX_PROMPT_CHARS:,} characters. Ctrl+Enter runs, Esc stops.",
                            placeholder="Ask something, or pick an example below",
                            value=EXAMPLES[PAGE_EXAMPLE]["turns"][0])
        with gr.Row():
            run_btn = gr.Button("Run", variant="primary", elem_id="run", scale=3)
            stop_btn = gr.Button("Stop", variant="stop", elem_id="stop", scale=1, interactive=False)
        with gr.Row():
            max_new_tokens = gr.Slider(8, MAX_NEW_TOKENS, value=128, step=8, label="Max new tokens",
                                       elem_id="max-new-tokens", scale=1, min_width=140)
            policy = gr.Dropdown(policy_choices(drafters0), value=PAGE_POLICY, label="Policy", scale=1,
                                 allow_custom_value=True, min_width=140)
        policy_help = gr.Markdown(_policy_info(PAGE_POLICY), elem_classes="compact-md")
        # One list, each example named by its task; page 1 holds one example of every task.
        shown = sorted(EXAMPLES, key=lambda e: ([x for x in EXAMPLES if x["category"] == e["category"]].index(e),
                                                TASKS.index(e["category"])))
        gr.Examples([[e["turns"][0]] for e in shown], inputs=[prompt], label="Examples",
                    example_labels=[_example_label(e) for e in shown], examples_per_page=len(TASKS),
                    elem_id="examples")
        with gr.Accordion("More settings: preset, drafters, reward, \u03b3, sampling", open=False, elem_id="settings"):
            presets = available_presets()
            preset = gr.Dropdown(presets, value=preset0, label="Preset", info=_preset_info(preset0),
                                 interactive=len(presets) > 1)
            drafters = gr.CheckboxGroup(drafters0, value=ticked0,
                                        label="Drafters (tick any subset)")
            reward = gr.Radio(REWARD_CHOICES, value="bd", label="Reward")
            with gr.Row():
                gamma = gr.Slider(1, 16, value=PRESETS[preset0].gamma, step=1, label="Draft length \u03b3")
                seed = gr.Number(0, label="Seed", precision=0, minimum=0, maximum=2**32 - 1, min_width=90)
            with gr.Row():
                temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)",
                                        info="sampled answers repeat with their seed, under every policy")
                top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
            full_info = gr.Checkbox(False, label="Full-information feedback: score every drafter on every "
                                    "verified chunk (measured regret; Hedge needs it)")
            cold = gr.Checkbox(False, label="Start cold: every drafter unknown, as in the paper (by default the "
                               "bandit starts from the preset's measured priors)", elem_id="start-cold")
    return GenerateControls(prompt, run_btn, stop_btn, max_new_tokens, policy, policy_help, preset, drafters, reward,
                            gamma, seed, temperature, top_p, full_info, cold)


def _generate_answer(drafters0: list[str]) -> tuple[gr.components.Component, ...]:
    """The right column: GenerateAnswer's fields up to the per-drafter table, then the lanes."""
    with gr.Column(scale=6, min_width=320, elem_id="answer"):
        empty = _empty_view(drafters0)
        tokens = gr.HTML(empty.tokens_html(""), elem_id="tokens", js_on_load=None)
        stats = gr.HTML(viz.stats_html(viz.live_stats([], 0.0)), elem_id="stats", js_on_load=None)
        # The plots next: at 1280x720 the answer, the numbers and the arm plot's top share the first screen;
        # from 1600 px wide the stylesheet moves this row beside the answer (`#plots`).
        with gr.Row(equal_height=False, elem_id="plots"):
            with gr.Column(min_width=300):
                arm_plot = gr.Plot(plot(empty.arm_json()), elem_id="arm-probabilities", show_label=False)
                gr.Markdown(text.ARM_CAPTION, elem_classes="caption")
            with gr.Column(min_width=300):
                regret_plot = gr.Plot(plot(empty.regret_json()), elem_id="regret", show_label=False)
                gr.Markdown(text.REGRET_CAPTION, elem_classes="caption")
        # The drafter lanes (where each drafter would have been accepted): they arrive when the answer ends,
        # and below the live views they never move them.
        lanes = gr.HTML(lanes_placeholder(viz.LANES_EMPTY), elem_id="lanes", js_on_load=None)
        with gr.Row(elem_id="view-options"):
            show_rejected = gr.Radio(REJECTED_LOOKS, value=REJECTED_LOOKS[0], label="Rejected drafts",
                                     info="marks: a small \u2715n between tokens, the draft on hover; inline: struck "
                                          "through in place", scale=0, min_width=260, elem_id="rejected-look")
            auto_base = gr.Checkbox(True, label="Measure the target alone after each run", scale=0, min_width=300)
            measure_btn = gr.Button("Measure target alone", size="sm", scale=0, min_width=170)
        with gr.Accordion("The answer as plain text", open=False):
            answer_text = gr.Textbox(show_label=True, label="Answer", lines=4, max_lines=12, interactive=False,
                                     buttons=["copy"], elem_id="answer-text")
        with gr.Accordion("How to read this", open=False, elem_id="how-to-read"):
            gr.Markdown(text.HOW_TO_READ, elem_classes="compact-md")
    return tokens, stats, show_rejected, auto_base, measure_btn, answer_text, arm_plot, regret_plot, lanes


def _wire_generate(server: Server, c: GenerateControls, a: GenerateAnswer, baselines: gr.State, record: gr.State,
                   concurrency: int) -> None:
    gen_inputs = [c.prompt, c.preset, c.drafters, c.policy, c.reward, c.gamma, c.max_new_tokens, c.temperature,
                  c.top_p, c.seed, c.full_info, c.cold, baselines]
    gen_outputs = outputs({"tokens": a.tokens, "arms": a.arm_plot, "regret": a.regret_plot, "stats": a.stats,
                           "table": a.table, "text": a.answer_text, "record": record, "lanes": a.lanes})
    buttons = [c.run_btn, c.stop_btn]
    # Run: the buttons say at once that something runs (no queue round trip), then the stream.
    busy = gr.on([c.run_btn.click, c.prompt.submit], _running, None, buttons, queue=False,
                 api_visibility="private", trigger_mode="once")
    gen = busy.then(server.bind(generate_view), gen_inputs, gen_outputs, api_name="generate", concurrency_limit=concurrency,
                    api_description=f"Stream a generation from a prompt; {defaults.describe()}.",
                    concurrency_id="model", show_progress="full", show_progress_on=[a.tokens])
    # A refused request (gr.Error) ends the chain in the browser: give the buttons back there too.
    gen.failure(_idle, None, buttons, api_visibility="private", queue=False)
    after = gen.then(_idle, None, buttons, api_visibility="private", queue=False)
    after = after.then(server.bind(write_logs, server.files), record, [a.csv_btn, a.json_btn], api_visibility="private",
                       queue=False)
    # Timing the target alone has its own limit (it never takes Generate's handlers) and waits in the model's line.
    after.then(server.bind(measure_baseline_stream), [record, baselines, a.auto_base], [a.stats, baselines],
               api_visibility="private", concurrency_limit=1, concurrency_id="baseline", show_progress="minimal")
    # Stop only signals the engine: the stream then ends on its own final frame and keeps the answer
    # (a gradio `cancels` would throw the frame away and reset the outputs).
    c.stop_btn.click(server.bind(stop_generation), None, None, api_visibility="private", queue=False)
    a.measure_btn.click(server.bind(measure_now), [record, baselines], [a.stats, baselines],
                        api_visibility="private", concurrency_limit=1, concurrency_id="baseline")
    a.show_rejected.change(None, a.show_rejected, None, js=(
        "(v) => { const t = document.getElementById('tokens'); t.classList.toggle('rej-inline', v === 'inline'); "
        "t.classList.toggle('hide-rejected', v === 'hidden'); }"))
    c.policy.change(_policy_info, c.policy, c.policy_help, api_visibility="private", queue=False)
    c.preset.change(server.bind(on_preset), c.preset, [c.drafters, c.policy, c.gamma], api_visibility="private",
                    concurrency_limit=1, concurrency_id="load")


# ----------------------------------------------------------------------------------------------
# Compare

@dataclass
class GridLink:
    """Compare's lanes grid opens a prompt's run in Replay: the grid is built in Compare, the link wired in Replay."""

    grid: gr.DataFrame
    runs: gr.State


def build_compare_tab(server: Server, preset0: str) -> GridLink:
    """The Compare tab: one prompt side by side, and a prompt set by drafter and task."""
    with gr.Tab("Compare", id="compare"):
        gr.Markdown(text.COMPARE_INTRO, elem_classes="compact-md")
        with gr.Row():
            c_preset = gr.Dropdown(available_presets(), value=preset0, label="Preset", scale=1)
            c_policy = gr.Dropdown([n for n in POLICIES], value=defaults.POLICY, label="Bandit policy", scale=1)
            c_tokens = gr.Slider(8, COMPARE_MAX_NEW_TOKENS, value=64, step=8, label="Max new tokens", scale=2,
                                 elem_id="compare-max-new-tokens")
        with gr.Accordion("One prompt, side by side", open=True):
            c_prompt = gr.Textbox(label="Prompt", lines=3, value=EXAMPLES[2]["turns"][0])
            c_btn = gr.Button("Compare drafters on this prompt", variant="primary")
            c_table = gr.DataFrame(pd.DataFrame(columns=COMPARE_COLUMNS), interactive=False,
                                   label="Methods (greedy; speed-up against the target alone, measured here)")
            c_bars = gr.Plot(viz.empty_figure("Speed-up over the target alone", "compare to see the bars"),
                             show_label=False)
            c_views = gr.HTML(js_on_load=None)
            c_btn.click(server.bind(compare_prompt), [c_prompt, c_preset, c_policy, c_tokens], [c_table, c_views, c_bars],
                        api_name="compare", concurrency_limit=1, concurrency_id="compare")
        with gr.Accordion("A prompt set: acceptance by drafter and task", open=True):
            s_per, link = _prompt_set(server, c_preset, c_policy, c_tokens)
    take_as_sent(c_tokens, s_per)
    return link


def _prompt_set(server: Server, c_preset: gr.Dropdown, c_policy: gr.Dropdown,
                c_tokens: gr.Slider) -> tuple[gr.Slider, GridLink]:
    """The prompt-set part of Compare (it shares the preset, policy and token settings); returns its
    per-category slider and its lanes grid's link to Replay."""
    with gr.Row():
        s_source = gr.Radio([("built-in examples", "examples"), ("uploaded JSONL", "upload")], value="examples",
                            label="Prompts")
        s_file = gr.File(label="Spec-Bench JSONL (question_id, category, turns)", file_types=[".jsonl", ".json"])
        s_per = gr.Slider(1, 10, value=1, step=1, label="Prompts per category")
    with gr.Row():
        s_btn = gr.Button("Run the prompt set", variant="primary", scale=3, elem_id="compare-run")
        s_cancel = gr.Button("Cancel", variant="stop", scale=1, elem_id="compare-cancel")
    gr.Markdown(text.COMPARE_SET_NOTE, elem_classes="compact-md")
    with gr.Row():
        s_heat = gr.Plot(viz.acceptance_heatmap(pd.DataFrame()), show_label=False)
        s_bars = gr.Plot(viz.empty_figure("Speed-up over the target alone", "run a prompt set"), show_label=False)
    s_table = gr.DataFrame(pd.DataFrame(columns=["method", "question_id", "category", "tokens_per_s", "speedup",
                                                 "acceptance_rate"]),
                           label="Results (one row per method and prompt)", interactive=False, max_height=320)
    s_csv = gr.DownloadButton("Download results.csv", size="sm", interactive=False)
    gr.Markdown(text.LANE_GRID_NOTE, elem_classes="compact-md")
    s_grid = gr.DataFrame(viz.lane_grid([], []), label=f"Drafter lanes by prompt ({viz.LANE_GRID_NOTE})",
                          interactive=False, elem_id="lane-grid", max_height=360)
    s_runs = gr.State([])
    s_btn.click(server.bind(compare_set), [s_source, s_file, s_per, c_preset, c_policy, c_tokens],
                [s_heat, s_bars, s_table, s_csv, s_grid, s_runs],
                api_name="compare_set", concurrency_limit=1, concurrency_id="compare")
    s_cancel.click(server.bind(cancel_compare), None, None, api_visibility="private", queue=False)
    return s_per, GridLink(s_grid, s_runs)


# ----------------------------------------------------------------------------------------------
# Replay


def build_replay_tab(server: Server, demo: gr.Blocks, tabs: gr.Tabs, drafters0: list[str],
                     link: GridLink | None = None) -> None:
    """The Replay tab: recorded runs played at any speed or stepped through; `?run=<name>` opens one."""
    with gr.Tab("Replay", id="replay"):
        gr.Markdown(text.REPLAY_INTRO, elem_classes="compact-md")
        runs = gallery()
        empty = _empty_view(drafters0, "Choose a recorded run and press Play to stream it here (or drag the round slider).")
        with gr.Row(equal_height=False):
            with gr.Column(scale=4, min_width=300):
                r_name = gr.Dropdown(runs, value=runs[0][1] if runs else None, label="Recorded runs", elem_id="replay-run")
                r_file = gr.File(label="... or a run file (JSON)", file_types=[".json"], elem_id="replay-file")
                r_speed = gr.Slider(0.25, 16, value=2, step=0.25, label="Speed \u00d7 (1 = as recorded)",
                                    elem_id="replay-speed")
                with gr.Row():
                    r_play = gr.Button("Play", variant="primary", elem_id="replay-play", scale=3)
                    r_stop = gr.Button("Stop", variant="stop", elem_id="replay-stop", scale=1)
                r_round = gr.Slider(0, 1, value=0, step=1, label="Round (drag to step through the run)",
                                    elem_id="replay-round")
            with gr.Column(scale=6, min_width=320):
                r_tokens = gr.HTML(empty.tokens_html(""), elem_id="replay-tokens", js_on_load=None)
                r_lanes = gr.HTML(lanes_placeholder(viz.LANES_EMPTY.replace("when the answer ends", "with a replayed run")),
                                  elem_id="replay-lanes", js_on_load=None)
                r_stats = gr.HTML(viz.stats_html(viz.live_stats([], 0.0)), elem_id="replay-stats", js_on_load=None)
                with gr.Accordion("The answer as plain text", open=False):
                    r_text = gr.Textbox(label="Answer", lines=4, max_lines=12, interactive=False, buttons=["copy"])
                with gr.Row(equal_height=False):
                    r_arm = gr.Plot(plot(empty.arm_json()), show_label=False, min_width=300)
                    r_regret = gr.Plot(plot(empty.regret_json()), show_label=False, min_width=300)
                r_table = gr.DataFrame(viz.drafter_table([], drafters0), label="Per drafter", interactive=False)
        r_outputs = outputs({"tokens": r_tokens, "arms": r_arm, "regret": r_regret, "stats": r_stats,
                             "table": r_table, "text": r_text, "lanes": r_lanes}, REPLAY_FIELDS)
        played = r_play.click(server.bind(replay_view), [r_file, r_name, r_speed], r_outputs, api_name="replay",
                              concurrency_limit=8, concurrency_id="replay", show_progress="hidden")
        played.then(server.bind(replay_rounds), [r_file, r_name], r_round, api_visibility="private", queue=False)
        r_stop.click(server.bind(stop_replay), None, None, api_visibility="private", queue=False)
        # Dragging or typing a round: the latest position wins, the others are dropped on the way.
        r_round.input(server.bind(replay_at), [r_file, r_name, r_round], r_outputs, api_visibility="private",
                      concurrency_limit=8, concurrency_id="replay", trigger_mode="always_last", show_progress="hidden")
        demo.load(open_link, None, [tabs, r_name], api_visibility="private", queue=False)
        if link is not None:  # a click on a cell of Compare's lanes grid: that prompt's run, here, with its lanes
            link.grid.select(server.bind(open_grid_run), link.runs, [tabs, r_file, r_round, *r_outputs],
                                  api_visibility="private", concurrency_limit=8, concurrency_id="replay")
    take_as_sent(r_speed, r_round)


# ----------------------------------------------------------------------------------------------
# Bandit playground


def build_playground_tab(server: Server, demo: gr.Blocks) -> None:
    """The Bandit playground: policies on synthetic drafters, no model; it runs once when the page loads."""
    with gr.Tab("Bandit playground", id="playground"):
        with gr.Row(equal_height=False):
            with gr.Column(scale=5):
                p_table = gr.DataFrame(PLAYGROUND_DRAFTERS, interactive=True,
                                       label="Synthetic drafters (edit: acceptance \u03b1 in [0, 1], "
                                       "cost c = drafter step / target step)",
                                       datatype=["str", "number", "number"], row_count=4)
                p_policies = gr.CheckboxGroup(list(POLICIES), value=list(PLAYGROUND_DEFAULTS[0]),
                                              label="Policies, side by side")
                with gr.Row():
                    p_reward = gr.Radio(REWARD_CHOICES, value="throughput", label="Reward",
                                        info="try block divergence: it ignores cost and picks the large LM")
                    p_full = gr.Checkbox(False, label="Full-information feedback for all")
                with gr.Row():
                    p_gamma = gr.Slider(1, 16, value=4, step=1, label="\u03b3")
                    p_rounds = gr.Slider(100, 20000, value=3000, step=100, label="Rounds")
                    p_spread = gr.Slider(0.5, 50, value=8, step=0.5, label="Context spread \u03ba")
                    p_seed = gr.Number(0, label="Seed", precision=0, minimum=0)
                p_btn = gr.Button("Simulate", variant="primary")
                p_values = gr.Markdown()
            with gr.Column(scale=5, elem_classes="explain"):
                gr.Markdown(text.EXPLAIN, latex_delimiters=text.LATEX_DELIMITERS)
        p_regret = gr.Plot(show_label=False)
        p_probs = gr.Plot(show_label=False)
        p_summary = gr.DataFrame(label="Policies", interactive=False)
        p_inputs = [p_table, p_policies, p_gamma, p_rounds, p_reward, p_full, p_spread, p_seed]
        p_outputs = [p_probs, p_regret, p_summary, p_values]
        # One simulation at a time (it shares the CPU with Generate). A page load queues nothing: the default
        # simulation is computed once per server and sent with the page (playground_default).
        p_btn.click(server.bind(run_playground), p_inputs, p_outputs, api_name="playground", concurrency_limit=1,
                    concurrency_id="playground")
        demo.load(server.bind(playground_default), None, p_outputs, api_visibility="private", queue=False)
    take_as_sent(p_gamma, p_rounds, p_spread, p_seed)
