"""Command line: `python -m metasd generate | bench | drafters ...` (docs/DESIGN.md §3).

Plugin drafters: the modules named in `METASD_PLUGINS` are imported first (metasd.drafting.registry).
torch and transformers are imported by the commands that need them, so that `--help`, a bad flag and
`replay` answer at once."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from metasd import settings
from metasd.benchmark.args import add_bench_args, add_priors_args
from metasd.core import defaults
from metasd.core.events import Summary
from metasd.core.runfile import MAX_BYTES, parse_run, run_document
from metasd.core.validation import PRICES, InvalidInput, clean_prompt, validate_settings
from metasd.drafting.registry import load_plugins, registered
from metasd.models.colors import drafter_colors
from metasd.models.presets import DEFAULT_PRESET, PRESETS, get_preset

_RESET, _STRIKE, _DIM = "\033[0m", "\033[9m", "\033[2m"


def _terminal(hex_color: str) -> str:
    """The page's colour of a drafter as a 24-bit terminal colour: one colour per drafter everywhere."""
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"\033[38;2;{r};{g};{b}m"


def _generate_args(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate", help="generate from one prompt with MetaSD",
                       description=f"Generate from one prompt with MetaSD; {defaults.describe()}.")
    g.add_argument("prompt")
    g.add_argument("--preset", default=DEFAULT_PRESET, help=f"one of {', '.join(PRESETS)}")
    g.add_argument("--drafters", default=None, help="comma-separated drafter names (default: the preset's bandit arms; "
                   "`python -m metasd drafters` lists them)")
    g.add_argument("--policy", default=defaults.POLICY, help="metasd-ucb-cost, metasd-ucb, exp3, thompson, hedge, ... "
                   "or single:<drafter> (default: %(default)s)")
    g.add_argument("--reward", default=defaults.REWARD,
                   help="bd (block divergence), be (block efficiency) or throughput (default: %(default)s)")
    g.add_argument("--gamma", default=defaults.GAMMA, help="draft length (default: the preset's)")
    g.add_argument("--max-new-tokens", default=defaults.MAX_NEW_TOKENS, help="default: %(default)s")
    g.add_argument("--temperature", default=defaults.TEMPERATURE, help="0 is greedy (default: %(default)s)")
    g.add_argument("--top-p", default=defaults.TOP_P, help="default: %(default)s (no nucleus cut)")
    g.add_argument("--top-k", default=defaults.TOP_K, help="default: %(default)s (no top-k cut)")
    g.add_argument("--seed", default=defaults.SEED, help="seeds the sampling and the policy (default: %(default)s)")
    g.add_argument("--full-info", action="store_true", help="score every drafter on every verified chunk")
    g.add_argument("--cold", action="store_true",
                   help="start the bandit cold (the paper's setting), not from the preset's informed priors")
    g.add_argument("--prices", default=defaults.PRICES, choices=PRICES,
                   help="what the cost-aware plans read: auto (fixed when sampling, so a seed repeats; measured when "
                   "greedy), measured (the clock) or fixed (costs.json's stored prices) (default: %(default)s)")
    g.add_argument("--no-chat-template", action="store_true", help="feed the prompt as plain text")
    g.add_argument("--device", default=None, help="override the preset's device (cpu, cuda, ...)")
    g.add_argument("--dtype", default=None, help="override the preset's dtype (float32, bfloat16, float16)")
    g.add_argument("--json", action="store_true", help="print exactly one JSON object")
    g.add_argument("--hide-rejected", action="store_true", help="do not show rejected draft tokens")


def _render_round(ev: Any, colours: dict[str, str], show_rejected: bool) -> str:
    c = colours[ev.drafter]
    out = [f"{c}{t}{_RESET}" for t in ev.emitted_text[: ev.accepted]]
    if show_rejected and ev.accepted < len(ev.draft):
        rejected = "".join(ev.draft_text[ev.accepted :])
        out.append(f"{_DIM}{c}{_STRIKE}{rejected}{_RESET}")
    out.append("".join(ev.emitted_text[ev.accepted :]))
    return "".join(out)


def precheck_generate(a: argparse.Namespace) -> None:
    """The checks that need no model, before loading one: a bad prompt or setting fails in a moment.
    The preset's drafters and the registered ones are a superset of what the loaded bundle offers, so
    this refuses nothing the engine's own check (after loading) would accept."""
    preset = get_preset(a.preset)
    clean_prompt(a.prompt)
    validate_settings([*preset.drafter_names, *(n for n in registered() if n not in preset.drafter_names)],
                      drafters=a.drafters, policy=a.policy, reward=a.reward,
                      gamma=preset.gamma if a.gamma is None else a.gamma, max_new_tokens=a.max_new_tokens,
                      temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, seed=a.seed)


def cmd_generate(a: argparse.Namespace) -> int:
    precheck_generate(a)
    from metasd.decoding.engine import generate
    from metasd.decoding.loading import load_bundle

    bundle = load_bundle(a.preset, device=a.device, dtype=a.dtype)
    events = generate(
        bundle, a.prompt, drafters=a.drafters, policy=a.policy, reward=a.reward,
        gamma=None if a.gamma is None else a.gamma, max_new_tokens=a.max_new_tokens,
        temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, seed=a.seed,
        chat_template=not a.no_chat_template, full_info=a.full_info, priors=not a.cold, prices=a.prices,
    )
    colours = {n: _terminal(c) for n, c in drafter_colors(bundle.drafter_names).items()}
    tty = sys.stdout.isatty() and not a.json
    rounds = []
    if not a.json:
        legend = "  ".join(f"{colours[n]}■ {n}{_RESET}" for n in bundle.drafter_names)
        print(f"{legend}  ■ target\n", flush=True)
    for ev in events:
        if isinstance(ev, Summary):
            break
        rounds.append(ev)
        if not a.json:
            print(_render_round(ev, colours, not a.hide_rejected) if tty else "".join(ev.emitted_text),
                  end="", flush=True)
    summary = ev
    if a.json:
        print(json.dumps(json_document(a, bundle, rounds, summary), ensure_ascii=False))
    else:
        print(f"\n\n{summary.new_tokens} tokens in {summary.wall_s:.2f} s ({summary.tokens_per_s:.1f} tokens/s), "
              f"{summary.target_calls} target calls, {summary.mean_accepted:.2f} accepted per call, "
              f"stopped by {summary.stop_reason}")
        for d in summary.drafters:
            print(f"  {colours[d.name]}{d.name:16s}{_RESET} pulls {d.pulls:4d}  acceptance {d.acceptance_rate:6.1%}  "
                  f"mean reward {d.mean_reward:.3f}")
    return 0


def json_document(a: argparse.Namespace, bundle: Any, rounds: list[Any], summary: Any) -> dict[str, Any]:
    """`generate --json`'s one object: a run file, the --json contract plus what `replay` needs
    (metasd.core.runfile). A new field of the output goes here."""
    from metasd.decoding.lanes import lanes_for

    return run_document(a.prompt, rounds, summary, preset=bundle.preset.name, target=bundle.preset.target,
                        drafters=list(rounds[0].probabilities) if rounds else bundle.default_drafters,
                        colors=drafter_colors(bundle.drafter_names), settings=summary.config,
                        lanes=lanes_for(bundle, summary.prompt, rounds, summary.config)[0] if rounds else {})


def _drafters_args(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("drafters", help="list every drafter of a preset (and the registered ones)")
    d.add_argument("--preset", default=DEFAULT_PRESET, help=f"one of {', '.join(PRESETS)}")
    d.add_argument("--json", action="store_true", help="print a JSON list of {name, kind, description, parameters, "
                   "file_bytes, cost, ...}")
    d.add_argument("--measure", action="store_true",
                   help="load the preset and measure each drafter's cost c on this machine (a minute or two)")
    d.add_argument("--save", action="store_true", help="with --measure: record the costs in assets/drafters/costs.json")
    d.add_argument("--threads", default="", help="with --measure: comma-separated torch thread counts to measure at, "
                   "one after another (each recorded for sampled runs of that count; the last is also the record's own, "
                   "shown in the table and the page's legend); default: torch's current count")


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    return "-" if n == 0 else (f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB")


def _thread_counts(text: str) -> list[int]:
    """`--threads 1,2` as [1, 2]; empty as []. A count below 1 or not a number is an error."""
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--threads: comma-separated whole numbers, not {text!r}") from None
    if counts and min(counts) < 1:
        raise SystemExit("--threads: each count at least 1")
    return counts


def cmd_drafters(a: argparse.Namespace) -> int:
    """The preset's drafters from its spec and weight files (no model is loaded unless --measure), then the
    registered ones; with --measure one table per torch thread count measured."""
    preset = get_preset(a.preset)
    from metasd.decoding.catalog import describe, measure_costs, save_costs

    if a.threads and not a.measure:
        raise SystemExit("--threads counts are measured: give --measure too")
    measured: list[tuple[int | None, dict | None]] = [(None, None)]
    if a.measure:
        import torch

        from metasd.decoding.loading import load_bundle

        counts = _thread_counts(a.threads)  # checked before the model loads
        bundle = load_bundle(preset)
        measured = []
        for n in counts or [torch.get_num_threads()]:
            torch.set_num_threads(n)
            print(f"[metasd] measuring at {n} torch thread(s)", file=sys.stderr)
            costs, detail = measure_costs(bundle, list(bundle.specs), progress=lambda m: print(m, file=sys.stderr))
            if a.save:
                save_costs(preset.name, costs, detail)
            measured.append((n, costs))
    tables = [(n, _drafter_rows(describe(preset, costs), n)) for n, costs in measured]
    if a.json:  # one list; a measured row also says its thread count
        print(json.dumps([r for _, rows in tables for r in rows], ensure_ascii=False))
        return 0
    for n, rows in tables:
        if len(tables) > 1:
            print(f"at {n} torch thread(s):")
        _print_drafters(rows)
    print("\n* a default arm of the bandit; params: the drafter's own (shared target weights not counted); "
          "c: drafting time per token / one target step, measured on this machine "
          "(`drafters --measure`; recorded in assets/drafters/costs.json)")
    return 0


def _drafter_rows(rows: list[dict], threads: int | None) -> list[dict]:
    """The preset's rows then the registered drafters'; measured rows carry the thread count."""
    rows = rows + [{"name": r.name, "kind": r.kind, "description": r.description, "default_arm": False,
                    "source": f"plugin {r.module}", "parameters": None, "file_bytes": None, "cost": None}
                   for r in registered().values() if r.name not in {x["name"] for x in rows}]
    return [{**r, "threads": threads} for r in rows] if threads is not None else rows


def _print_drafters(rows: list[dict]) -> None:
    width = max(len(r["name"]) for r in rows)
    print(f"  {'name':{width}s}  {'kind':10s}  {'params':>7s}  {'file':>8s}  {'c':>6s}  description")
    for r in rows:
        star = "*" if r["default_arm"] else " "
        params = "-" if r["parameters"] == 0 else ("?" if r["parameters"] is None else f"{r['parameters'] / 1e6:.1f}M")
        cost = f"{r['cost']:.3f}" if r["cost"] is not None else "?"
        print(f"{star} {r['name']:{width}s}  {r['kind']:10s}  {params:>7s}  {_size(r['file_bytes']):>8s}  {cost:>6s}  "
              f"{r['description']}")


def _replay_args(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("replay", help="render a saved run (generate --json, or the page's JSON download) without a model")
    r.add_argument("run", help="the run file")
    r.add_argument("--speed", default=1.0, help="1 = as fast as it ran, 4 = four times faster, 0 = at once")


def cmd_replay(a: argparse.Namespace) -> int:
    try:
        speed = float(a.speed)
    except ValueError:
        raise InvalidInput(f"--speed must be a number, got {a.speed!r}") from None
    if not math.isfinite(speed) or speed < 0:
        raise InvalidInput("--speed must be 0 (at once) or more")
    path = Path(a.run)
    try:
        if path.stat().st_size > MAX_BYTES:
            raise InvalidInput(f"{path} has {path.stat().st_size:,} bytes; the limit is {MAX_BYTES:,}")
        run = parse_run(path.read_bytes())
    except OSError as e:
        raise InvalidInput(f"cannot read {path}: {e.strerror}") from None
    names = list(dict.fromkeys([*run.colors, *run.drafters, *(ev.drafter for ev in run.rounds)]))
    colours = {n: _terminal(c) for n, c in drafter_colors(names).items()}
    tty = sys.stdout.isatty()
    print(f"replaying {path.name}: preset {run.preset or '?'}, {len(run.rounds)} rounds"
          + (f", {speed:g}x" if speed else ", at once"))
    print("  ".join(f"{colours[n]}■ {n}{_RESET}" for n in run.drafters) + "  ■ target\n", flush=True)
    for ev in run.rounds:
        if speed:
            time.sleep((ev.draft_ms + ev.verify_ms + ev.overhead_ms) / 1000.0 / speed)
        print(_render_round(ev, colours, True) if tty else "".join(ev.emitted_text), end="", flush=True)
    s = run.summary
    if s is not None:
        print(f"\n\n{s.new_tokens} tokens in {s.wall_s:.2f} s ({s.tokens_per_s:.1f} tokens/s when recorded), "
              f"{s.target_calls} target calls, {s.mean_accepted:.2f} accepted per call, stopped by {s.stop_reason}")
    else:
        print("\n\n(the run file has no summary: a partial run)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m metasd", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    _generate_args(sub)
    _drafters_args(sub)
    _replay_args(sub)
    add_bench_args(sub)
    add_priors_args(sub)
    sub.add_parser("config", help="every METASD_* setting: its effective value and where it came from")
    a = p.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        settings.check()
        if a.command == "config":
            print("\n".join(settings.describe()))
            return 0
        load_plugins(settings.value("METASD_PLUGINS"))
    except (ValueError, RuntimeError) as e:  # a SettingError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        if a.command == "generate":
            return cmd_generate(a)
        if a.command == "drafters":
            return cmd_drafters(a)
        if a.command == "replay":
            return cmd_replay(a)
        from metasd.benchmark import bench  # the runner: torch, transformers, pandas

        return bench.cmd_priors(a) if a.command == "priors" else bench.cmd_bench(a)
    except InvalidInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
