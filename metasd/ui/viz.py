"""Pure functions from engine events to what the visualizer shows: HTML, plotly figures, tables.

Nothing here imports gradio or touches a model: every function takes RoundEvents (or plain
numbers) and returns a string, a `plotly.graph_objects.Figure` or a `pandas.DataFrame`, so
the whole view can be tested without a browser. The app only wires these to components.

Token view vocabulary (the same as the engine's):
- accepted: a drafted token the target kept, coloured by the drafter that proposed it;
- target: the token the target supplied itself (the correction after a rejection, or the bonus
  token after a fully accepted draft), in a neutral style;
- rejected: drafted tokens the target did not keep: a mark with their count between the tokens (the draft
  on hover), or struck through in place in their drafter's colour.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from metasd.bandits.policies import single_drafter
from metasd.core.events import RoundEvent, Summary
from metasd.drafting.registry import kind_by_name
from metasd.models.colors import (  # noqa: F401  (drafter_colors, underline_of: the views call them from here)
    PALETTE,
    TARGET_COLOR,
    drafter_colors,
    underline_of,
    underlines,
)

FONT = "Inter, ui-sans-serif, system-ui, -apple-system, 'Segoe UI', sans-serif"
# A compact template (a few hundred bytes): the page re-sends every figure each round, and
# plotly's named templates ("plotly_white") add about 7 kB to every update.
_AXIS = dict(gridcolor="#EEF0F3", linecolor="#D1D5DB", zeroline=False, ticks="", automargin=True)
TEMPLATE = go.layout.Template(layout=dict(paper_bgcolor="white", plot_bgcolor="white", colorway=list(PALETTE),
                                          xaxis=_AXIS, yaxis=_AXIS))


# --------------------------------------------------------------------------------------------
# Colours and the token view


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha:g})"


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.3f}"


def _visible(piece: str) -> str:
    """A rejected piece shown inline: newlines and empty pieces get a visible stand-in."""
    if piece == "":
        return "\u2205"  # empty set sign: a token with no text of its own (special or mid-character)
    return piece.replace("\n", "\u21b5")


def _known(values: Sequence[float], j: int) -> float | None:
    return values[j] if j < len(values) else None


def round_spans(ev: RoundEvent, colors: Mapping[str, str], looks: Mapping[str, str] | None = None) -> list[str]:
    """The HTML spans of one round, in reading order: accepted, rejected (in place), target token.

    The look comes from the page's CSS (assets/style.css): `--c` is the drafter's colour, the `u-*`
    class its underline style; accepted tokens are tinted and underlined, rejected ones struck through.
    """
    c = colors.get(ev.drafter, TARGET_COLOR)
    u = looks.get(ev.drafter, "none") if looks is not None else underline_of(colors, ev.drafter)
    out: list[str] = []
    n_acc = min(ev.accepted, len(ev.emitted))

    kind = kind_by_name(ev.drafter)
    who = f"{ev.drafter} ({kind})" if kind else ev.drafter

    def tip(j: int, verdict: str) -> str:
        p, q, a = _known(ev.p_draft, j), _known(ev.q_draft, j), _known(ev.accept_prob, j)
        return _esc(f"{who}, round {ev.round}, draft position {j + 1}: {verdict}\n"
                    f"p = {_fmt(p)}   q = {_fmt(q)}   accept prob = min(1, p/q) = {_fmt(a)}")

    for j in range(n_acc):
        text = ev.emitted_text[j] if j < len(ev.emitted_text) else ""
        out.append(f'<span class="tok acc u-{u}" data-drafter="{_esc(ev.drafter)}" style="--c:{c}" '
                   f'title="{tip(j, "accepted")}">{_esc(text)}</span>')
    rejected = []
    for j in range(ev.accepted, len(ev.draft)):
        verdict = "rejected" if j == ev.accepted else "discarded (after the first rejection)"
        piece = ev.draft_text[j] if j < len(ev.draft_text) else f"<{ev.draft[j]}>"
        rejected.append((piece, f'<span class="tok rej" data-drafter="{_esc(ev.drafter)}" style="--c:{c}" '
                                f'title="{tip(j, verdict)}">{_esc(_visible(piece))}</span>'))
    if rejected:
        # One group per round: by default the page shows it as a small mark between the tokens (the answer's
        # words stay whole) with the draft on hover; the "inline" look shows the struck-through pieces.
        draft = "".join(_visible(p) for p, _ in rejected)
        what = _esc(f"{ev.drafter} drafted {len(rejected)} more token(s) the target did not keep: {draft!r}")
        out.append(f'<span class="rejs" data-n="{len(rejected)}" style="--c:{c}" title="{what}">'
                   + "".join(h for _, h in rejected) + "</span>")
    for j in range(n_acc, len(ev.emitted)):  # normally one: the target's own token
        text = ev.emitted_text[j] if j < len(ev.emitted_text) else ""
        if not ev.draft:
            why = "no draft this round: a plain target step"
        elif ev.bonus:
            why = f"bonus token after all {len(ev.draft)} drafted tokens were accepted"
        else:
            why = f"correction after rejecting draft position {ev.accepted + 1}"
        title = _esc(f"target, round {ev.round}: {why}")
        out.append(f'<span class="tok tgt" title="{title}">{_esc(text)}</span>')
    out.extend(tree_fold_spans(ev, colors))
    return out


def tree_fold_lines(ev: RoundEvent) -> list[str]:
    """One line per branch a token-tree round verified besides the kept one: its drafter(s), where it
    left the kept branch, its ids as text, and how many of the drafter's own ids the target accepted."""
    lines = []
    for b in ev.branches:
        who = ", ".join(b.get("drafters") or [b.get("drafter", "?")])
        text = "".join(_visible(t) for t in b.get("text", ()))
        lines.append(f"{who} (after {b.get('from', 0)} kept id(s)): {text!r} - {b.get('accepted', 0)} accepted")
    return lines


def tree_fold_spans(ev: RoundEvent, colors: Mapping[str, str]) -> list[str]:
    """The other branches of a token-tree round, folded under the kept path: a small count that lists
    them on hover. Nothing for chain rounds or a tree of one branch."""
    lines = tree_fold_lines(ev)
    if not lines:
        return []
    head = (f"round {ev.round}: a token tree of {ev.ids_verified} ids verified in one pass "
            f"(this round's budget: at most {ev.tree_budget} ids a pass)")
    title = _esc("\n".join([head, *lines]))
    c = colors.get(ev.branches[0].get("drafter", ""), TARGET_COLOR)
    n = sum(len(b.get("tokens", ())) for b in ev.branches)
    return [f'<sup class="tok-tree" data-branches="{len(lines)}" style="color:{c};font-size:0.7em;cursor:help" '
            f'title="{title}">+{n}</sup>']


def tree_budget_note(rounds: Sequence[RoundEvent]) -> str:
    """A line for the stat cards of a token-tree run: the budget and the ids verified per pass."""
    trees = [ev for ev in rounds if ev.tree_budget]
    if not trees:
        return ""
    per_call = sum(ev.ids_verified for ev in trees) / len(trees)
    shared = sum(1 for ev in trees if ev.branches)
    lo, hi = min(ev.tree_budget for ev in trees), max(ev.tree_budget for ev in trees)
    budget = f"{hi}" if lo == hi else f"{lo}-{hi} (it follows what the drafters propose)"
    return (f"token tree: a budget of {budget} ids a pass, {per_call:.1f} verified per call, "
            f"{shared} of {len(trees)} rounds with more than one branch")


# The drafter kinds in a class's words (the legend's small labels say them on hover).
KIND_WORDS = {
    "model-free": "model-free: copies text it has seen (the prompt, earlier output, a datastore); costs almost nothing",
    "self": "self: the target itself with layers skipped; no second model",
    "model": "model: a separate small language model",
    "distilled": "distilled: a one-layer model trained on the target's own answers of one domain",
    "white-box": "white-box: a small head that reads the target's hidden states (EAGLE-style) and guesses the next "
                 "tokens from them",
}


def legend_html(colors: Mapping[str, str], used: Iterable[str] | None = None) -> str:
    """Chips naming each drafter's colour and underline, plus the target's neutral style and a rejected sample."""
    wanted = None if used is None else set(used)  # once: a set per name made the legend quadratic in drafters
    chips = []
    looks = underlines(colors)
    for n in colors:
        if wanted is not None and n not in wanted:
            continue
        kind = kind_by_name(n)
        label = f'<span class="kind" title="{_esc(KIND_WORDS.get(kind, kind))}">{_esc(kind)}</span>' if kind else ""
        what = f" ({kind} drafter)" if kind else ""
        chips.append(f'<span class="chip" data-drafter="{_esc(n)}" title="tokens {_esc(n)}{what} proposed and the target '
                     f'accepted"><span class="swatch acc u-{looks[n]}" style="--c:{colors[n]}">abc</span>'
                     f'{_esc(n)}{label}</span>')
    chips.append('<span class="chip" title="tokens the target supplied itself"><span class="swatch tgt">abc</span>'
                 'target (correction / bonus)</span>')
    chips.append('<span class="chip" title="drafted tokens the target did not keep: a mark with their count '
                 '(hover it for the draft), or struck through in place"><span class="rejs" data-n="2" '
                 'style="--c:#6B7280"><span class="swatch rej" style="--c:#6B7280">abc</span></span>rejected</span>')
    return '<div class="tok-legend" aria-label="Legend">' + "".join(chips) + "</div>"


def _stream_open(colors: Mapping[str, str], legend: bool, placeholder: str, used: Iterable[str] | None = None) -> str:
    head = legend_html(colors, used) if legend else ""
    # tok-stream scrolls and keeps its end in view (CSS: column-reverse); tok-flow holds the spans.
    return (f'<div class="tok-view">{head}<div class="tok-stream" tabindex="0" role="region" '
            f'aria-label="Generated tokens, coloured by drafter"><div class="tok-flow" data-empty="{_esc(placeholder)}">')


def _stream_close(status: str) -> str:
    foot = f'<div class="tok-status" role="status">{_esc(status)}</div>' if status else ""
    return f"</div></div>{foot}</div>"


def token_html(rounds: Sequence[RoundEvent], colors: Mapping[str, str], *, show_rejected: bool = True,
               legend: bool = True, status: str = "", placeholder: str = "") -> str:
    """The streamed output: every round's spans, with a legend on top.

    `show_rejected=False` leaves the rejected drafts out of the HTML (the page can also hide them with
    the `hide-rejected` class on the container, or show them struck through in place with `rej-inline`,
    without re-rendering).
    """
    spans: list[str] = []
    looks = underlines(colors)
    for ev in rounds:
        spans.extend(s for s in round_spans(ev, colors, looks) if show_rejected or not s.startswith('<span class="rejs"'))
    return _stream_open(colors, legend, placeholder) + "".join(spans) + _stream_close(status)


def output_text(rounds: Sequence[RoundEvent]) -> str:
    """The generated text, exactly as the token view shows it (accepted + target tokens)."""
    return "".join("".join(ev.emitted_text) for ev in rounds)


# --------------------------------------------------------------------------------------------
# Figures


def _layout_dict(title: str, height: int = 260, **kw: Any) -> dict[str, Any]:
    """The shared compact layout: small margins, small fonts, legend on top, a light template."""
    return dict(
        template=TEMPLATE, height=height, title=dict(text=title, x=0.01, y=0.97, font=dict(size=13)),
        margin=dict(l=44, r=12, t=36, b=34), font=dict(family=FONT, size=11),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1.0, xanchor="right", font=dict(size=10)),
        hovermode="x unified", uirevision="keep", **kw,
    )


def _layout(fig: go.Figure, title: str, height: int = 280, **kw: Any) -> go.Figure:
    fig.update_layout(**_layout_dict(title, height, **kw))
    return fig


# The two live figures are rebuilt every round, so they are built from plain dicts in one
# go.Figure call (about 10x cheaper than make_subplots + add_trace + update_* per round).


def _arm_spec(x: Sequence[int], probs: Mapping[str, Sequence[float]], pulled: Mapping[str, Sequence[int]],
              colors: Mapping[str, str]) -> dict[str, Any]:
    """The arm-probability figure as a plotly dict: stacked probabilities above, the pulled arm below."""
    names = list(probs)
    data: list[dict[str, Any]] = []
    for n in names:
        c = colors.get(n, TARGET_COLOR)
        # rounds are 1, 2, 3, ...: x0/dx instead of an x array keeps the streamed figure small
        # Plotly renders a subset of HTML (links too) in names, titles, ticks and hover text: a name is escaped.
        data.append(dict(type="scatter", x0=x[0] if len(x) else 1, dx=1, y=list(probs[n]), name=_esc(n), mode="lines",
                         stackgroup="p", line=dict(width=0.8, color=c, shape="hv"), fillcolor=_rgba(c, 0.45),
                         hovertemplate="%{y:.2f}", xaxis="x", yaxis="y"))
    for i, n in enumerate(names):
        xs = list(pulled.get(n, ()))
        # one row per arm, top to bottom in legend order: y0 with dy=0 puts every tick on it without a y array
        data.append(dict(type="scatter", x=xs, y0=len(names) - 1 - i, dy=0, mode="markers", showlegend=False,
                         name=f"pulled {_esc(n)}", marker=dict(symbol="line-ns", size=9, line=dict(width=2, color=colors.get(n))),
                         hovertemplate=f"pulled {_esc(n)}<extra></extra>", xaxis="x", yaxis="y2"))
    xr = None if len(x) else [0.5, 10.5]
    layout = _layout_dict(
        "Arm probabilities and the arm pulled each round", height=270,
        xaxis=dict(anchor="y2", domain=[0, 1], title=dict(text="round"), range=xr),
        yaxis=dict(domain=[0.3, 1], range=[0, 1.0001], title=dict(text="P(arm)")),
        yaxis2=dict(domain=[0, 0.22], anchor="x", range=[-0.5, len(names) - 0.5], showticklabels=False, showgrid=False,
                    fixedrange=True),
    )
    return dict(data=data, layout=layout)


def arm_shares(ev: RoundEvent) -> dict[str, float]:
    """What the arm-probability figure stacks for a round: each arm's share of the round's token tree
    (a shared node split equally) in a tree round, the policy's probabilities otherwise."""
    if ev.tree_share:
        return {n: ev.tree_share.get(n, 0.0) for n in ev.probabilities}
    return dict(ev.probabilities)


def arm_probability_figure(rounds: Sequence[RoundEvent], colors: Mapping[str, str]) -> go.Figure:
    """The policy's probability of each arm per round (stacked), and which arm was pulled; in token-tree
    rounds each arm's share of the round's tree."""
    names = list(rounds[0].probabilities) if rounds else list(colors)
    probs = {n: [arm_shares(ev).get(n, 0.0) for ev in rounds] for n in names}
    pulled = {n: [ev.round for ev in rounds if ev.drafter == n] for n in names}
    return go.Figure(**_arm_spec([ev.round for ev in rounds], probs, pulled, colors))


def regret_label(measured: bool) -> str:
    return "measured (full information)" if measured else "estimated (bandit feedback)"


def _regret_spec(x: Sequence[int], regret: Sequence[float], measured: bool) -> dict[str, Any]:
    data = [dict(type="scatter", x0=x[0] if len(x) else 1, dx=1, y=list(regret), mode="lines",
                 name=regret_label(measured), line=dict(color="#111827", width=2), fill="tozeroy",
                 fillcolor="rgba(17,24,39,0.07)", hovertemplate="%{y:.2f} tokens")]
    layout = _layout_dict(
        # Short enough for half a projector's width (1280 px); the legend says how it was obtained.
        f"Regret vs the best drafter in hindsight ({'measured' if measured else 'estimated'})", showlegend=True,
        xaxis=dict(title=dict(text="round"), range=None if len(x) else [0.5, 10.5]),
        yaxis=dict(title=dict(text="tokens"), rangemode="tozero", range=None if len(x) else [0, 2]),
    )
    return dict(data=data, layout=layout)


def regret_figure(rounds: Sequence[RoundEvent]) -> go.Figure:
    """Cumulative regret in tokens against the best drafter in hindsight."""
    measured = bool(rounds and rounds[-1].regret_measured)
    return go.Figure(**_regret_spec([ev.round for ev in rounds], [ev.regret for ev in rounds], measured))


def figure_json(spec: Mapping[str, Any]) -> str:
    """A figure dict as the JSON plotly.js reads (what go.Figure.to_json gives, without re-validating
    every point: the live view sends it several times a second)."""
    return pio.to_json(_without_none(dict(spec)), validate=False)


def _without_none(x: Any) -> Any:
    """Drop None values as plotly's validation does: plotly.js fails on an update that sets e.g. a null range."""
    if isinstance(x, dict):
        return {k: _without_none(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        # A figure's long lists are numbers: walked only where they hold dicts or lists (every frame of
        # every stream builds figures, in the interpreter the engine shares).
        return [_without_none(v) for v in x] if any(isinstance(v, dict | list) for v in x) else x
    return x


def empty_figure(title: str, note: str = "", height: int = 280) -> go.Figure:
    fig = go.Figure()
    if note:
        fig.add_annotation(text=note, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                           font=dict(color="#6B7280", size=12))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, title, height=height)


# --------------------------------------------------------------------------------------------
# Numbers and tables


TABLE_COLUMNS = ["drafter", "pulls", "acceptance rate", "mean reward", "tokens / call", "time share"]


class DrafterTally:
    """Per-drafter running sums, one round at a time (the table never re-reads old rounds)."""

    def __init__(self, names: Sequence[str]):
        self.names = list(names)
        self.sums = {n: [0, 0, 0, 0.0, 0, 0.0] for n in self.names}  # pulls, drafted, accepted, reward, emitted, ms
        self.total_ms = 0.0

    def add(self, ev: RoundEvent) -> None:
        ms = ev.draft_ms + ev.verify_ms
        self.total_ms += ms
        if ev.drafter not in self.sums:
            return
        t = self.sums[ev.drafter]
        t[0] += 1
        t[1] += len(ev.draft)
        t[2] += ev.accepted
        t[3] += ev.reward
        t[4] += len(ev.emitted)
        t[5] += ms

    def frame(self) -> pd.DataFrame:
        total = self.total_ms or 1.0
        nan = float("nan")
        rows = [{"drafter": n, "pulls": p, "acceptance rate": round(a / d, 3) if d else nan,
                 "mean reward": round(r / p, 3) if p else nan, "tokens / call": round(e / p, 2) if p else nan,
                 "time share": round(ms / total, 3)}
                for n, (p, d, a, r, e, ms) in self.sums.items()]
        return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def drafter_table(rounds: Sequence[RoundEvent], names: Sequence[str] | None = None) -> pd.DataFrame:
    """Per drafter: pulls, acceptance rate, mean reward, tokens per target call, time share."""
    if names is None:
        names = list(rounds[0].probabilities) if rounds else []
    tally = DrafterTally(names)
    for ev in rounds:
        tally.add(ev)
    return tally.frame()


def live_stats(rounds: Sequence[RoundEvent], elapsed_s: float, baseline_tps: float | None = None) -> dict[str, Any]:
    """Running numbers: tokens/s over the wall time so far, target calls, accepted per call, speed-up.

    The speed-up is only given against a measured baseline (the target alone, same prompt).
    """
    new = rounds[-1].new_tokens if rounds else 0
    return _stats_dict(new, len(rounds), sum(ev.accepted for ev in rounds), elapsed_s, None, baseline_tps)


def _stats_dict(new: int, calls: int, accepted: int, elapsed_s: float, tps: float | None,
                baseline_tps: float | None) -> dict[str, Any]:
    """The numbers the stat cards show; tokens/s from `elapsed_s` unless given (a summary's own)."""
    if tps is None:
        tps = new / elapsed_s if elapsed_s > 0 else 0.0
    return {
        "new_tokens": new,
        "tokens_per_s": tps,
        "target_calls": calls,
        "mean_accepted": accepted / calls if calls else 0.0,
        "tokens_per_call": new / calls if calls else 0.0,
        "elapsed_s": elapsed_s,
        "baseline_tps": baseline_tps,
        "speedup": tps / baseline_tps if baseline_tps and tps else None,
    }


def stats_html(stats: Mapping[str, Any], note: str = "") -> str:
    """Stat cards for the live numbers."""
    sp = stats.get("speedup")
    base = stats.get("baseline_tps")
    cards = [
        ("tokens/s", f"{stats['tokens_per_s']:.1f}", f"{stats['new_tokens']} tokens in {stats['elapsed_s']:.2f} s"),
        ("target calls", f"{stats['target_calls']}", f"{stats['tokens_per_call']:.2f} tokens per call"),
        ("accepted / call", f"{stats['mean_accepted']:.2f}", "draft tokens kept"),
        ("speed-up", f"{sp:.2f}\u00d7" if sp else "\u2014",
         f"target alone: {base:.1f} tok/s" if base else "not measured yet"),
    ]
    body = "".join(f'<div class="card"><div class="card-k">{_esc(k)}</div><div class="card-v">{_esc(v)}</div>'
                   f'<div class="card-s">{_esc(s)}</div></div>' for k, v, s in cards)
    foot = f'<div class="cards-note">{_esc(note)}</div>' if note else ""
    return f'<div class="cards">{body}</div>{foot}'


def rounds_frame(rounds: Sequence[RoundEvent]) -> pd.DataFrame:
    """The per-round log, one row per round (lists joined with spaces), for CSV download."""
    cols = ["round", "drafter", "draft", "accepted", "emitted", "target_token", "bonus", "p_draft", "q_draft",
            "accept_prob", "reward", "regret", "regret_measured", "draft_ms", "verify_ms", "overhead_ms", "new_tokens",
            "emitted_text", "draft_text"]
    rows = []
    for ev in rounds:
        d = ev.to_json()
        for k in ("draft", "emitted"):
            d[k] = " ".join(map(str, d[k]))
        for k in ("p_draft", "q_draft", "accept_prob"):
            d[k] = " ".join(f"{x:.4g}" for x in d[k])
        for k in ("emitted_text", "draft_text"):
            d[k] = json.dumps(d[k], ensure_ascii=False)
        for n, p in ev.probabilities.items():
            d[f"prob[{n}]"] = p
        for n, r in ev.rewards.items():
            d[f"reward[{n}]"] = r
        rows.append(d)
    extra = [c for c in (rows[0] if rows else {}) if c.startswith(("prob[", "reward["))]
    return pd.DataFrame(rows, columns=cols + extra)


# --------------------------------------------------------------------------------------------
# The live Generate view, built up one round at a time


class LiveView:
    """What the Generate tab shows, accumulated round by round.

    Each round is rendered once when it arrives; a frame only joins what has accumulated. The token
    HTML only ever grows at its end while streaming (its closing tags and the status line come with
    the final frame; browsers close open tags themselves), so gradio streams it as appended text
    and the bytes sent stay linear in the answer's length. Figures are plain plotly dicts built from
    running arrays.
    """

    def __init__(self, colors: Mapping[str, str], drafters: Sequence[str], placeholder: str = ""):
        self.colors = dict(colors)
        self._looks = underlines(self.colors)
        self.tally = DrafterTally(drafters)
        self.rounds: list[RoundEvent] = []
        self.summary: Summary | None = None
        self.engine_s = 0.0  # the engine's own clock at its latest event
        # The legend names this request's arms only: ten chips with their kinds wrap to an extra line.
        self._html = _stream_open(self.colors, True, placeholder, used=drafters)
        self._text: list[str] = []
        self._x: list[int] = []
        self._probs: dict[str, list[float]] = {}
        self._pulled: dict[str, list[int]] = {}
        self._regret: list[float] = []
        self._accepted = 0

    def add(self, ev: RoundEvent | Summary, engine_s: float) -> None:
        self.engine_s = engine_s
        if isinstance(ev, Summary):
            self.summary = ev
            self.engine_s = ev.wall_s
            return
        if not self.rounds:
            self._probs = {n: [] for n in ev.probabilities}
            self._pulled = {n: [] for n in ev.probabilities}
        self.rounds.append(ev)
        self._html += "".join(round_spans(ev, self.colors, self._looks))
        self._text.extend(ev.emitted_text)
        self._x.append(ev.round)
        shares = arm_shares(ev)
        for n, ys in self._probs.items():
            ys.append(round(shares.get(n, 0.0), 3))
        self._pulled.setdefault(ev.drafter, []).append(ev.round)
        self._regret.append(round(ev.regret, 3))
        self._accepted += ev.accepted
        self.tally.add(ev)

    @property
    def new_tokens(self) -> int:
        return self.rounds[-1].new_tokens if self.rounds else 0

    def tokens_html(self, status: str | None = None) -> str:
        """The token view. While streaming (status None) its tags stay open so that each frame only appends;
        the final frame closes them, with the status line when there is one."""
        return self._html if status is None else self._html + _stream_close(status)

    def text(self) -> str:
        return "".join(self._text)

    def arm_json(self) -> str:
        probs = self._probs or {n: [] for n in self.colors}
        return figure_json(_arm_spec(self._x, probs, self._pulled, self.colors))

    def regret_json(self) -> str:
        measured = bool(self.rounds and self.rounds[-1].regret_measured)
        return figure_json(_regret_spec(self._x, self._regret, measured))

    def table(self) -> pd.DataFrame:
        return self.tally.frame()

    def stats(self, baseline_tps: float | None = None) -> dict[str, Any]:
        """live_stats' numbers, on the engine's clock (the page's rendering is not in them)."""
        new = self.summary.new_tokens if self.summary else self.new_tokens
        tps = self.summary.tokens_per_s if self.summary else None
        return _stats_dict(new, len(self.rounds), self._accepted, self.engine_s, tps, baseline_tps)


# --------------------------------------------------------------------------------------------
# Compare: one prompt under several methods; a prompt set into a heatmap and a bar chart


def method_row(method: str, summary: Summary, baseline_tps: float | None, identical: bool | None,
               category: str = "", question_id: Any = "") -> dict[str, Any]:
    drafted = sum(d.drafted for d in summary.drafters)
    accepted = sum(d.accepted for d in summary.drafters)
    return {
        "method": method, "question_id": question_id, "category": category,
        "new_tokens": summary.new_tokens, "wall_s": round(summary.wall_s, 3),
        "tokens_per_s": round(summary.tokens_per_s, 2), "target_calls": summary.target_calls,
        "mean_accepted": round(summary.mean_accepted, 3),
        "acceptance_rate": round(accepted / drafted, 3) if drafted else 0.0,
        "speedup": round(summary.tokens_per_s / baseline_tps, 3) if baseline_tps else None,
        "identical_to_target": identical,
    }


def acceptance_heatmap(df: pd.DataFrame) -> go.Figure:
    """Acceptance rate by drafter (rows of `single:<name>` methods) and task category."""
    single = df[[single_drafter(m) is not None for m in df["method"]]] if len(df) else df
    if not len(single):
        return empty_figure("Acceptance rate by drafter and task", "run a prompt set")
    t = single.assign(drafter=[single_drafter(m) for m in single["method"]]).pivot_table(
        index="drafter", columns="category", values="acceptance_rate", aggfunc="mean")
    fig = go.Figure(go.Heatmap(z=t.values, x=[_esc(str(c)) for c in t.columns], y=[_esc(str(i)) for i in t.index],
                               zmin=0, zmax=1, colorscale="Blues",
                               text=[[f"{v:.0%}" if v == v else "" for v in row] for row in t.values],
                               texttemplate="%{text}", hovertemplate="%{y} on %{x}: %{z:.1%}<extra></extra>",
                               colorbar=dict(thickness=10, tickformat=".0%")))
    fig.update_layout(hovermode="closest")
    return _layout(fig, "Acceptance rate by drafter and task", height=90 + 38 * len(t.index))


def speedup_bars(df: pd.DataFrame, colors: Mapping[str, str] | None = None) -> go.Figure:
    """Mean measured speed-up over the target alone, per method and task category.

    `single:<drafter>` bars take their drafter's colour; the target alone is the dotted line at 1.
    """
    if not len(df) or df["speedup"].isna().all():
        return empty_figure("Speed-up over the target alone", "run a prompt set")
    d = df.dropna(subset=["speedup"])
    d = d[d["method"] != "target alone"]
    t = d.pivot_table(index="category", columns="method", values="speedup", aggfunc="mean")
    fig = go.Figure()
    for m in t.columns:
        name = single_drafter(m)
        single = bool(colors) and name in colors
        # A lone drafter's bar wears its colour; a policy's bar is hatched grey, so no policy can be taken
        # for a drafter. Each bar names its method inside it: colour is never the only label.
        c = colors[name] if single else "#9CA3AF"
        label = name if single else str(m)
        fig.add_trace(go.Bar(x=[_esc(str(i)) for i in t.index], y=t[m].values, name=_esc(str(m)), marker_color=c,
                             marker_pattern_shape="" if single else "/", marker_pattern_fgcolor="#374151",
                             text=[_esc(label)] * len(t.index), textposition="inside", textangle=-90,
                             insidetextanchor="start", textfont=dict(size=11), cliponaxis=False,
                             hovertemplate="%{fullData.name}: %{y:.2f}\u00d7<extra>%{x}</extra>"))
    fig.add_hline(y=1.0, line=dict(color="#111827", width=1, dash="dot"))
    fig.update_layout(barmode="group", hovermode="closest")
    fig.update_yaxes(title_text="speed-up (\u00d7)", rangemode="tozero")
    return _layout(fig, "Speed-up over the target alone (measured, same prompts; dotted: target alone)", height=320)


# --------------------------------------------------------------------------------------------
# Bandit playground (results of metasd.bandits.playground.simulate)


def playground_probability_figure(results: Sequence[Any], colors: Mapping[str, str], max_points: int = 400) -> go.Figure:
    """One stacked arm-probability panel per policy, side by side."""
    n = max(len(results), 1)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig = make_subplots(rows=rows, cols=cols, shared_yaxes=True, subplot_titles=[_esc(r.policy) for r in results],
                        horizontal_spacing=0.04, vertical_spacing=0.16)
    for k, r in enumerate(results):
        T = len(r.arms)
        step = max(1, -(-T // max_points))  # ceil: at most max_points points
        x = list(range(1, T + 1, step))
        for i, name in enumerate(r.names):
            c = colors.get(name, PALETTE[i % len(PALETTE)])
            fig.add_trace(go.Scatter(x=x, y=r.probabilities[::step, i], mode="lines", stackgroup=f"s{k}",
                                     name=_esc(name), legendgroup=_esc(name), showlegend=k == 0,
                                     line=dict(width=0.6, color=c), fillcolor=_rgba(c, 0.5),
                                     hovertemplate="%{fullData.name}: %{y:.2f}<extra></extra>"),
                          row=k // cols + 1, col=k % cols + 1)
    fig.update_yaxes(range=[0, 1.0001])
    fig.update_annotations(font_size=11)
    fig.update_layout(hovermode="closest")
    return _layout(fig, "Arm probabilities over rounds", height=60 + 230 * rows)


def playground_regret_figure(results: Sequence[Any]) -> go.Figure:
    """Cumulative (pseudo-)regret of each policy, on one set of axes."""
    fig = go.Figure()
    for k, r in enumerate(results):
        T = len(r.regret)
        step = max(1, -(-T // 600))
        fig.add_trace(go.Scatter(x=list(range(1, T + 1, step)), y=r.regret[::step], mode="lines", name=_esc(r.policy),
                                 line=dict(width=2, color=PALETTE[k % len(PALETTE)]),
                                 hovertemplate="%{fullData.name}: %{y:.1f}<extra></extra>"))
    fig.update_xaxes(title_text="round")
    fig.update_yaxes(title_text="tokens lost", rangemode="tozero")
    fig.update_layout(hovermode="closest")
    return _layout(fig, "Cumulative regret vs the best drafter (known rates)", height=320)


def playground_table(results: Sequence[Any]) -> pd.DataFrame:
    rows = []
    for r in results:
        rows.append({
            "policy": r.policy,
            "final regret": round(float(r.regret[-1]), 1) if len(r.regret) else 0.0,
            "best arm share": round(float((r.arms == r.best).mean()), 3) if len(r.arms) else 0.0,
            "tokens / call": round(float(r.tokens.mean()), 3) if len(r.tokens) else 0.0,
            "speed-up": round(float(r.tokens.sum() / r.time.sum()), 3) if len(r.time) else 0.0,
            **{f"pulls {n}": int((r.arms == i).sum()) for i, n in enumerate(r.names)},
        })
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Drafter lanes (metasd/decoding/lanes.py): one row per drafter under the answer, one cell per token

LANES_EMPTY = "Drafter lanes appear here when the answer ends: for every drafter, where it would have been accepted."
# Self-contained styles (the lanes are also embedded in Compare's side-by-side cells): a cell's fill height is
# its number (the second channel beside colour); an outline marks the drafter pulled that round, a rule each
# round's start; focus or hover shows the cell's drafter, token and number.
_LANES_CSS = (
    "<style>.lanes-view{border:1px solid #d1d5db;border-radius:10px;background:#fff;padding:6px 8px;margin-top:6px}"
    ".lanes-view .lanes-key{font-size:.78rem;color:#374151;margin:0 0 4px}"
    ".lanes-scroll{overflow-x:auto;max-height:260px;overflow-y:auto}"
    ".lanes-scroll:focus-visible,.lanes td:focus-visible{outline:2px solid #4338ca;outline-offset:1px}"
    ".lanes{border-collapse:collapse;font-size:.74rem;color:#111827}"
    ".lanes th[scope=row]{position:sticky;left:0;background:#fff;text-align:left;font-weight:600;padding:0 6px 0 0;"
    "white-space:nowrap;z-index:1}"
    ".lanes th[scope=row] .share{font-weight:400;color:#374151}"
    ".lanes thead th{font-weight:400;white-space:pre;padding:0 1px;max-width:3em;overflow:hidden;text-overflow:clip;"
    "border-bottom:3px solid var(--c,#9ca3af);height:1.4em}"
    ".lanes td{min-width:9px;height:18px;padding:0!important;border-left:1px solid #f3f4f6;"
    "background:linear-gradient(to top,var(--c) calc(var(--v)*100%),#eef0f3 0)!important}"
    ".lanes .b{border-left:2px solid #6b7280}"
    ".lanes td.p{box-shadow:inset 0 0 0 2px #111827}"
    ".lanes td{position:relative}.lanes td:focus::after,.lanes td:hover::after{content:attr(aria-label);"
    "position:absolute;left:0;bottom:20px;"
    "background:#111827;color:#fff;padding:2px 6px;border-radius:4px;white-space:nowrap;z-index:5;font-size:.75rem}"
    ".lanes tbody tr:first-child td:focus::after,.lanes tbody tr:first-child td:hover::after{bottom:auto;top:20px}</style>"
)


_FIRST_STOP = ' tabindex="0"'


def _cell_class(start: bool, pulled: bool) -> str:
    """A lane cell's class attribute: b at a round's start, p where its drafter was pulled; none when neither."""
    c = " ".join(x for x, on in (("b", start), ("p", pulled)) if on)
    return f' class="{c}"' if c else ""


def _lane_tip(name: str, piece: str, j: int, v: float, pulled: str, rnd: int) -> str:
    # Which drafter was pulled at a token is the same down its column (the column header's title says it); a
    # cell names it only where it is the cell's own drafter: the label is most of a cell's bytes.
    was = ", pulled" if pulled == name else ""
    return f"{name}, token {j + 1} \u201c{_visible(piece)}\u201d: {v:.2f} (round {rnd}{was})"


def _token_meta(rounds: Sequence[RoundEvent]) -> list[tuple[str, str, int, bool]]:
    """Per emitted token: its text piece, the drafter pulled in its round, the round, whether it starts the round."""
    out = []
    for ev in rounds:
        for j, _ in enumerate(ev.emitted):
            piece = ev.emitted_text[j] if j < len(ev.emitted_text) else ""
            out.append((piece, ev.drafter, ev.round, j == 0))
    return out


def lanes_html(rounds: Sequence[RoundEvent], lanes: Mapping[str, Sequence[float]], colors: Mapping[str, str],
               *, empty: str = LANES_EMPTY, title: str = "Drafter lanes") -> str:
    """The lanes under an answer: a header row of the answer's tokens (underlined in the colour of the drafter
    pulled for them), then one row per drafter, each cell filled to the drafter's acceptance probability there.
    Lanes longer than the rounds shown (a replay still playing) are cut to the tokens so far."""
    meta = _token_meta(rounds)
    names = [n for n in lanes if lanes[n]]
    if not meta or not names:
        return _LANES_CSS + f'<div class="lanes-view"><p class="lanes-key">{_esc(empty)}</p></div>'
    n = min(len(meta), min(len(lanes[d]) for d in names))
    head = "".join(f'<th scope="col"{_cell_class(start, False)} style="--c:{colors.get(who, TARGET_COLOR)}" '
                   f'title="{_esc(f"token {j + 1}, round {rnd}: {who} pulled")}">{_esc(_visible(piece))}</th>'
                   for j, (piece, who, rnd, start) in enumerate(meta[:n]))
    rows = []
    for d in names:
        lane = lanes[d]
        # One tab stop per table (its first cell), not one per cell: 512 tokens of ten drafters were 5,120 stops
        # between a keyboard user and the rest of the page. The arrow keys move between cells (text.HEAD).
        cells = "".join(
            f'<td{_FIRST_STOP if d == names[0] and j == 0 else ""}{_cell_class(start, who == d)}'
            f' style="--v:{lane[j]:.3f}" aria-label="{_esc(_lane_tip(d, piece, j, lane[j], who, rnd))}"></td>'
            for j, (piece, who, rnd, start) in enumerate(meta[:n]))
        share = sum(lane[:n]) / n
        rows.append(f'<tr data-drafter="{_esc(d)}" style="--c:{colors.get(d, TARGET_COLOR)}"><th scope="row">'
                    f'{_esc(d)} <span class="share">{share:.0%}</span></th>{cells}</tr>')
    key = ("fill = the drafter's acceptance probability at each token, given the true text before it \u00b7 "
           "outlined = pulled \u00b7 dark rule = a round's start \u00b7 % = share it would have drafted \u00b7 "
           "hover a cell, or Tab to the first and move with the arrow keys")
    return (_LANES_CSS + f'<div class="lanes-view"><p class="lanes-key"><b>{_esc(title)}</b> \u00b7 {_esc(key)}</p>'
            f'<div class="lanes-scroll" tabindex="0" role="region" aria-label="{_esc(title)}: one row per drafter">'
            f'<table class="lanes"><thead><tr><th scope="row">token</th>{head}</tr></thead><tbody>{"".join(rows)}'
            "</tbody></table></div></div>")


_THIRDS = " \u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"


def _where(parts: Sequence[float]) -> str:
    """Three block glyphs, one per third of the answer: how much of it the drafter would have drafted there."""
    return "".join(_THIRDS[min(8, round(8 * x))] for x in parts)


LANE_GRID_NOTE = "share of the answer \u00b7 where (first, middle, last third)"


def lane_grid(rows: Sequence[Mapping[str, Any]], names: Sequence[str]) -> pd.DataFrame:
    """Compare's prompts x drafters grid: per prompt (question_id, category, lanes), each drafter's share of
    the answer it would have drafted and, as three glyphs, where in the answer."""
    cols = ["prompt", "task", *names]
    out = []
    for r in rows:
        lanes = r.get("lanes") or {}
        cell = {"prompt": str(r.get("question_id", "")), "task": str(r.get("category", ""))}
        for d in names:
            lane = list(lanes.get(d) or [])
            if not lane:
                cell[d] = "\u2013"
                continue
            k = len(lane)
            parts = [sum(lane[i * k // 3 : (i + 1) * k // 3]) / max(1, (i + 1) * k // 3 - i * k // 3) for i in range(3)]
            cell[d] = f"{sum(lane) / k:.0%} {_where(parts)}"
        out.append(cell)
    return pd.DataFrame(out, columns=cols)
