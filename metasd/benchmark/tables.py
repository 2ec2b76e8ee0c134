"""The benchmark's tables: pure functions from per-run rows to summaries (pandas) and Markdown.

`bench` produces a BenchResult; this module and `report` (the HTML report) only read it, so neither
imports the benchmark runner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from metasd.benchmark.args import DEFAULT_KERNELS


@dataclass
class BenchResult:
    results: pd.DataFrame  # one row per method and prompt (RESULT_COLUMNS)
    rounds: pd.DataFrame  # one row per round of our engine's methods (ROUND_COLUMNS)
    meta: dict[str, Any]


AFTER_PROMPT_NOTE = (
    "The same ratio with each run's prompt pass taken out of its wall time: our engine's prefill, and the first "
    "forward call of transformers' `generate` (it reads the prompt; with prompt lookup or assisted generation it also "
    "checks the first candidates). Reading the prompt is the same work for every method and no drafter shortens "
    "it, so long prompts pull every whole-answer speed-up towards 1; this one is what the rounds themselves gain."
)
CPU_SPEEDUP_NOTE = (
    "CPU-time speed-up: the same ratio over this process's CPU time (time.process_time) instead of wall time. On a "
    "CPU shared with other jobs it is far less sensitive to time spent waiting for a core (it still feels contention "
    "for caches and memory bandwidth); with one torch thread it is the compute each method needed. Meaningless on a GPU."
)
SPEEDUP_DEFINITION = (
    "speed-up = (sum of the baseline's wall time over a category's prompts) / (sum of the method's wall time "
    "over the same prompts), both measured in this run with the methods interleaved per prompt; above 1 is faster. "
    "The overall row sums over every prompt, so long generations weigh more."
)


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """Per method and category, then an 'overall' row per method.

    Columns: method, category, prompts, new_tokens, wall_s, tokens_per_s, speedup, cpu_speedup, mean_accepted
    (accepted draft tokens per target call), calls_per_token, identical (share of outputs equal to
    the baseline's), and the time split of our engine (prefill_s, draft_s, verify_s, overhead_s).
    """
    df = results.copy()
    if "cpu_s" not in df:
        df["cpu_s"] = math.nan
    base = df[df["method"] == "baseline"].set_index("question_id")
    df["baseline_wall_s"] = df["question_id"].map(base["wall_s"])
    df["baseline_cpu_s"] = df["question_id"].map(base["cpu_s"])
    # After the prompt's pass: the same for every method, it is where drafting can change nothing.
    df["after_s"] = df["wall_s"] - df["prefill_s"]
    df["baseline_after_s"] = df["question_id"].map(base["wall_s"] - base["prefill_s"])
    df["accepted"] = df["mean_accepted"] * df["target_calls"]
    order = list(dict.fromkeys(df["method"]))
    cats = list(dict.fromkeys(df["category"]))
    parts = [df.assign(group=df["category"]), df.assign(group="overall")]
    both = pd.concat(parts, ignore_index=True)
    agg = both.groupby(["method", "group"], sort=False).agg(
        prompts=("question_id", "count"), new_tokens=("new_tokens", "sum"), wall_s=("wall_s", "sum"),
        baseline_wall_s=("baseline_wall_s", "sum"), cpu_s=("cpu_s", lambda s: s.sum(min_count=1)),
        baseline_cpu_s=("baseline_cpu_s", lambda s: s.sum(min_count=1)), target_calls=("target_calls", "sum"),
        accepted=("accepted", lambda s: s.sum(min_count=1)), identical=("identical_to_baseline", "mean"),
        prefill_s=("prefill_s", lambda s: s.sum(min_count=1)), draft_s=("draft_s", lambda s: s.sum(min_count=1)),
        verify_s=("verify_s", lambda s: s.sum(min_count=1)), overhead_s=("overhead_s", lambda s: s.sum(min_count=1)),
        after_s=("after_s", _every), baseline_after_s=("baseline_after_s", _every),
    ).reset_index().rename(columns={"group": "category"})
    agg["speedup"] = agg["baseline_wall_s"] / agg["wall_s"]
    agg["cpu_speedup"] = agg["baseline_cpu_s"] / agg["cpu_s"]
    agg["after_prompt_speedup"] = agg["baseline_after_s"] / agg["after_s"]
    agg["tokens_per_s"] = agg["new_tokens"] / agg["wall_s"]
    calls = agg["target_calls"].where(agg["target_calls"] > 0)
    agg["mean_accepted"] = agg["accepted"] / calls
    agg["calls_per_token"] = calls / agg["new_tokens"]
    agg["method"] = pd.Categorical(agg["method"], order, ordered=True)
    agg["category"] = pd.Categorical(agg["category"], [*cats, "overall"], ordered=True)
    agg = agg.sort_values(["method", "category"]).reset_index(drop=True)
    agg["method"] = agg["method"].astype(str)
    agg["category"] = agg["category"].astype(str)
    return agg[["method", "category", "prompts", "new_tokens", "wall_s", "tokens_per_s", "speedup", "cpu_speedup",
                "mean_accepted",
                "calls_per_token", "identical", "prefill_s", "draft_s", "verify_s", "overhead_s", "after_prompt_speedup"]]


def _every(s: pd.Series) -> float:
    """A sum over every prompt of a group, or NaN where one lacks the figure (never a sum over some)."""
    return float(s.sum()) if len(s) and s.notna().all() else math.nan


def speedup_table(summary: pd.DataFrame, values: str = "speedup") -> pd.DataFrame:
    """Methods x categories (and overall) of speed-up (or `values`: e.g. cpu_speedup)."""
    t = summary.pivot(index="method", columns="category", values=values)
    cats = [c for c in dict.fromkeys(summary["category"]) if c != "overall"] + ["overall"]
    return t.reindex(index=list(dict.fromkeys(summary["method"])), columns=cats)


DEFAULT_KERNELS_NOTE = (
    f"`{DEFAULT_KERNELS}` is the target alone with torch's default linear kernels, where the CPU target's layers are "
    "packed (packing makes several ids cost about one step, and can make one id dearer): the target alone at its "
    "fastest for one id per pass. Here every speed-up is over it instead, the stricter yardstick where it is faster "
    "than the baseline."
)


def over_default_kernels(summary: pd.DataFrame) -> pd.DataFrame | None:
    """The speed-up table taken over `baseline:default-kernels` (None when it did not run). Both speed-ups are
    over the same baseline time on the same prompts, so their quotient is wall(default kernels) / wall(method)."""
    t = speedup_table(summary)
    if DEFAULT_KERNELS not in t.index:
        return None
    return t / t.loc[DEFAULT_KERNELS]


def time_split(summary: pd.DataFrame, rounds: pd.DataFrame | None = None) -> pd.DataFrame:
    """Our engine's overall time: shares of drafting, verifying, bookkeeping, prefill and the rest."""
    ov = summary[(summary["category"] == "overall") & summary["draft_s"].notna()].copy()
    if ov.empty:
        return pd.DataFrame()
    rounds_s = ov["draft_s"] + ov["verify_s"] + ov["overhead_s"]
    out = pd.DataFrame({"method": ov["method"]})
    out["drafting"] = ov["draft_s"] / ov["wall_s"]
    out["verifying"] = ov["verify_s"] / ov["wall_s"]
    out["bookkeeping"] = ov["overhead_s"] / ov["wall_s"]
    out["prefill"] = ov["prefill_s"] / ov["wall_s"]
    out["other"] = 1 - out[["drafting", "verifying", "bookkeeping", "prefill"]].sum(axis=1)
    out["bookkeeping_of_rounds"] = ov["overhead_s"] / rounds_s
    if rounds is not None and not rounds.empty:
        cols = dict(rounds=("round", "count"), draft_ms=("draft_ms", "mean"), verify_ms=("verify_ms", "mean"),
                    overhead_ms=("overhead_ms", "mean"))
        if "ids_verified" in rounds:  # ids the target read per round (a chain's draft + 1; a tree's nodes + 1)
            cols["ids_per_call"] = ("ids_verified", "mean")
        per = rounds.groupby("method", sort=False).agg(**cols)
        out = out.merge(per, left_on="method", right_index=True, how="left")
        out["rounds"] = out["rounds"].astype("Int64")
    return out.reset_index(drop=True)


def oracle_choices(results: pd.DataFrame) -> pd.DataFrame:
    o = results[results["oracle_choice"].fillna("") != ""]
    if o.empty:
        return pd.DataFrame()
    return o.groupby(["category", "oracle_choice"], sort=False).size().unstack(fill_value=0)


def _fmt(x: Any, kind: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if kind == "x":
        return f"{x:.2f}x"
    if kind == "%":
        return f"{100 * x:.0f}%"
    if kind == "%1":
        return f"{100 * x:.1f}%"
    if isinstance(x, float):
        return f"{x:.2f}"
    return str(x)


def markdown_table(df: pd.DataFrame, formats: dict[str, str] | None = None, index: bool = False) -> str:
    """A GitHub markdown table (no tabulate dependency)."""
    formats = formats or {}
    d = df.reset_index() if index else df
    head = [str(c) for c in d.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|"]
    for _, r in d.iterrows():
        lines.append("| " + " | ".join(_fmt(r[c], formats.get(str(c), "")) for c in d.columns) + " |")
    return "\n".join(lines)


def _profile_line(meta: dict) -> str:
    """The probed price of a target pass by ids fed that the run's plans read, as ratios to one id's."""
    prof = meta.get("verify_profile") or []
    one = next((ms for n, ms in prof if n == 1), 0.0)
    if not one:
        return ""
    shown = ", ".join(f"{n} ids {ms / one:.2f}" for n, ms in prof if n in (2, 5, 8, 16))
    return f" The target's pass as probed: one id {one:.1f} ms; {shown} of it."


def summary_markdown(result: BenchResult) -> str:
    res, meta = result.results, result.meta
    s = summarize(res)
    cats = [c for c in dict.fromkeys(res["category"])]
    out = [
        "# MetaSD benchmark",
        "",
        f"Preset `{meta['preset']}` on {meta['device']} ({meta['dtype']}, {meta['torch_threads']} torch threads), "
        f"{meta['prompts']} prompts in {len(cats)} categories, up to {meta['max_new_tokens']} new tokens, greedy, "
        f"gamma {meta['gamma']}, chat template {'on' if meta['chat_template'] else 'off'}, {meta['date']}."
        + (f" Each method's time on a prompt is the fastest of {meta['repeats']} interleaved runs."
           if meta.get("repeats", 1) > 1 else "") + _profile_line(meta),
        "",
        SPEEDUP_DEFINITION,
        "",
        "## Speed-up over the baseline",
        "",
        markdown_table(speedup_table(s), {c: "x" for c in [*cats, "overall"]}, index=True),
        "",
    ]
    strict = over_default_kernels(s)
    if strict is not None and meta.get("packed_layers", 0):  # where nothing is packed it is the baseline again
        out += ["## Speed-up over the target alone with torch's default kernels", "", DEFAULT_KERNELS_NOTE, "",
                markdown_table(strict, {c: "x" for c in [*cats, "overall"]}, index=True), ""]
    if s.loc[s["method"] != "baseline", "after_prompt_speedup"].notna().any():
        out += ["## Speed-up after the prompt's pass", "", AFTER_PROMPT_NOTE, "",
                markdown_table(speedup_table(s, "after_prompt_speedup"), {c: "x" for c in [*cats, "overall"]}, index=True),
                ""]
    if meta.get("device", "cpu").startswith("cpu") and s["cpu_speedup"].notna().any():
        out += [
            "## Speed-up in CPU time",
            "",
            CPU_SPEEDUP_NOTE,
            "",
            markdown_table(speedup_table(s, "cpu_speedup"), {c: "x" for c in [*cats, "overall"]}, index=True),
            "",
        ]
    out += [
        "## Per method and category",
        "",
        "accepted/call: mean accepted draft tokens per target call (tokens per call = this + 1); "
        "calls/token: target forward passes per generated token; identical: share of outputs equal to the baseline's.",
        "",
        markdown_table(
            s[["method", "category", "prompts", "tokens_per_s", "speedup", "cpu_speedup", "mean_accepted", "calls_per_token",
               "identical"]]
            .rename(columns={"tokens_per_s": "tokens/s", "speedup": "speed-up", "cpu_speedup": "CPU-time speed-up",
                             "mean_accepted": "accepted/call", "calls_per_token": "calls/token"}),
            {"speed-up": "x", "CPU-time speed-up": "x", "identical": "%", "tokens/s": ""},
        ),
    ]
    return "\n".join(out + _tail_sections(s, result)) + "\n"


def _tail_sections(s: pd.DataFrame, result: BenchResult) -> list[str]:
    """The summary's last sections: where the engine's time goes, the oracle's choices, identity."""
    res = result.results
    out: list[str] = []
    split = time_split(s, result.rounds)
    if not split.empty:
        out += [
            "",
            "## Where our engine's time goes (overall)",
            "",
            "Shares of wall time; bookkeeping = policy, rewards, detokenisation and events per round; "
            "'of rounds' = bookkeeping / (drafting + verifying + bookkeeping); ids_per_call = ids the target read "
            "per round (a chain: its draft + 1; a tree: its nodes + 1).",
            "",
            markdown_table(split, {"drafting": "%1", "verifying": "%1", "bookkeeping": "%1", "prefill": "%1",
                                   "other": "%1", "bookkeeping_of_rounds": "%1"}),
        ]
    oc = oracle_choices(res)
    if not oc.empty:
        out += ["", "## The oracle's choice (fastest single drafter per prompt)", "", markdown_table(oc, index=True)]
    bad = res[~res["identical_to_baseline"].astype(bool)]
    out += ["", "## Identity with the baseline", ""]
    if bad.empty:
        out.append("Every output is identical to the baseline's token ids.")
    else:
        out.append(f"{len(bad)} of {len(res)} outputs differ from the baseline "
                   "(first differing token index; under greedy fp32 each is a bug unless the logits tie):")
        out.append("")
        out.append(markdown_table(bad[["method", "question_id", "category", "first_mismatch", "new_tokens"]]))
    return out
