"""The benchmark's interactive HTML report: pure functions from results to plotly figures."""

from __future__ import annotations

import html

import pandas as pd
import plotly.graph_objects as go

from metasd.benchmark.tables import BenchResult, summarize, summary_markdown

SPLIT_COLOURS = {"prefill": "#9e9e9e", "drafting": "#1f77b4", "verifying": "#ff7f0e", "bookkeeping": "#d62728",
                 "other": "#c7c7c7"}


def speedup_figure(summary: pd.DataFrame, values: str = "speedup",
                   title: str = "Speed-up over the baseline (sum of baseline wall / sum of method wall)") -> go.Figure:
    """Grouped bars: speed-up over the baseline per category (and overall), one colour per method."""
    fig = go.Figure()
    cats = list(dict.fromkeys(summary["category"]))
    for method, g in summary.groupby("method", sort=False):
        g = g.set_index("category").reindex(cats)
        fig.add_bar(name=str(method), x=cats, y=g[values],
                    customdata=g[["tokens_per_s", "mean_accepted", "identical"]].to_numpy(),
                    hovertemplate=(f"<b>{method}</b><br>%{{x}}: %{{y:.2f}}x<br>%{{customdata[0]:.1f}} tokens/s<br>"
                                   "accepted/call %{customdata[1]:.2f}<br>identical %{customdata[2]:.0%}<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dash", line_color="black", annotation_text="baseline")
    fig.update_layout(barmode="group", title=title,
                      yaxis_title="speed-up (x)", legend_title="method", height=480)
    return fig


def time_split_figure(summary: pd.DataFrame) -> go.Figure:
    """Stacked bars: milliseconds per generated token spent prefilling, drafting, verifying, bookkeeping."""
    ov = summary[(summary["category"] == "overall") & summary["draft_s"].notna()]
    fig = go.Figure()
    parts = {
        "prefill": ov["prefill_s"], "drafting": ov["draft_s"], "verifying": ov["verify_s"],
        "bookkeeping": ov["overhead_s"],
        "other": ov["wall_s"] - ov[["prefill_s", "draft_s", "verify_s", "overhead_s"]].sum(axis=1),
    }
    for name, secs in parts.items():
        ms = 1000 * secs / ov["new_tokens"]
        share = secs / ov["wall_s"]
        fig.add_bar(name=name, x=ov["method"], y=ms, marker_color=SPLIT_COLOURS[name], customdata=share,
                    hovertemplate=f"{name}: %{{y:.2f}} ms/token (%{{customdata:.1%}} of wall)<extra></extra>")
    fig.update_layout(barmode="stack", title="Where our engine's time goes (ms per generated token, all prompts)",
                      yaxis_title="ms per token", height=420)
    return fig


def accepted_figure(summary: pd.DataFrame) -> go.Figure:
    """Heatmap: mean accepted draft tokens per target call, method x category."""
    t = summary.pivot(index="method", columns="category", values="mean_accepted")
    t = t.reindex(index=list(dict.fromkeys(summary["method"])), columns=list(dict.fromkeys(summary["category"])))
    fig = go.Figure(go.Heatmap(z=t.to_numpy(), x=list(t.columns), y=list(t.index), colorscale="Viridis",
                               text=[[f"{v:.2f}" if v == v else "" for v in row] for row in t.to_numpy()],
                               texttemplate="%{text}", colorbar_title="accepted/call"))
    fig.update_layout(title="Mean accepted draft tokens per target call", height=60 + 40 * len(t.index),
                      yaxis_autorange="reversed")
    return fig


def rounds_figure(rounds: pd.DataFrame) -> go.Figure:
    """Per-round verify time against the number of tokens fed: what a longer draft costs here."""
    fig = go.Figure()
    if rounds.empty:
        return fig
    g = rounds.groupby("drafted").agg(verify_ms=("verify_ms", "median"), draft_ms=("draft_ms", "median"),
                                      n=("round", "count")).reset_index()
    fig.add_scatter(x=g["drafted"] + 1, y=g["verify_ms"], mode="lines+markers", name="verify (median)",
                    customdata=g["n"], hovertemplate="%{x} tokens fed: %{y:.1f} ms (%{customdata} rounds)<extra></extra>")
    fig.add_scatter(x=g["drafted"] + 1, y=g["draft_ms"], mode="lines+markers", name="draft (median)")
    fig.update_layout(title="Per-round cost by tokens fed to the target (draft + 1), all our methods",
                      xaxis_title="tokens fed to the target", yaxis_title="ms", height=380)
    return fig


def report_html(result: BenchResult) -> str:
    """One self-contained page (plotly.js inlined once, so it opens offline)."""
    s = summarize(result.results)
    figs = [speedup_figure(s)]
    if s.loc[s["method"] != "baseline", "after_prompt_speedup"].notna().any():
        figs.append(speedup_figure(s, "after_prompt_speedup", "Speed-up after the prompt's pass (what the rounds gain)"))
    if str(result.meta.get("device", "cpu")).startswith("cpu") and s["cpu_speedup"].notna().any():
        figs.append(speedup_figure(s, "cpu_speedup", "Speed-up in CPU time (less sensitive to other jobs on a shared CPU)"))
    figs += [time_split_figure(s), accepted_figure(s), rounds_figure(result.rounds)]
    body = [f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figs)]
    md = html.escape(summary_markdown(result))
    return ("<!doctype html><html><head><meta charset='utf-8'><title>MetaSD benchmark</title>"
            "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
            "pre{background:#f6f6f6;padding:1em;overflow:auto;font-size:12px}</style></head><body>"
            "<h1>MetaSD benchmark</h1>" + "".join(body)
            + "<h2>Summary (summary.md)</h2><pre>" + md + "</pre></body></html>")
