"""Run files: one saved generation that can be replayed anywhere, without a model.

A run file is the `generate --json` document (prompt, text, token_ids, rounds, stats, config),
extended with what a replay needs: `format` and `version`, the preset and its target, the drafters
in play and their colours, the settings, and the software versions. The CLI's `--json`, the page's
JSON download and the gallery in assets/runs/ all write this one format; `replay` and the page's
Replay tab read it back.

Loading is plain JSON parsing and type checks (never pickle, never code): a size cap, the format
tag, and every round checked field by field against the bounds in metasd.core.validation (names, draft
lengths, drafters, rounds, text per token, recorded times clamped to what a real round takes), so a bad
file gets one clear message naming the field, and the token view of an accepted file stays within
RENDER_FACTOR x its size (checked before anything is rendered).
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from metasd.core.events import DrafterStats, RoundEvent, Summary
from metasd.core.validation import (
    LABEL_MAX_CHARS,
    RENDER_FACTOR,
    RENDER_FLOOR,
    RUN_MAX_BYTES,
    RUN_MAX_DRAFT,
    RUN_MAX_DRAFTERS,
    RUN_MAX_FIELD_KEYS,
    RUN_MAX_ROUNDS,
    RUN_MAX_TEXT_CHARS,
    RUN_MAX_TOKEN_CHARS,
    RUN_MAX_TOKEN_ID,
    RUN_ROUND_MAX_MS,
    InvalidInput,
)

FORMAT = "metasd-run"
VERSION = 2  # 2: `lanes` (metasd/decoding/lanes.py); version 1 files load without them
MAX_BYTES = RUN_MAX_BYTES  # the bounds live in metasd.core.validation, stated once
MAX_ROUNDS = RUN_MAX_ROUNDS
# What the token view spends per token besides its text and its drafter's name (tags, classes, the hover
# text with p, q and the acceptance probability): measured at most ~330 bytes; see rendered_bytes.
SPAN_BYTES = 400


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("metasd-studio", "torch", "transformers", "gradio"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            continue
    return out


def run_document(prompt: str, rounds: Sequence[RoundEvent], summary: Summary | None, *, preset: str = "",
                 target: str = "", drafters: Sequence[str] = (), colors: Mapping[str, str] | None = None,
                 settings: Mapping[str, Any] | None = None,
                 lanes: Mapping[str, Sequence[float]] | None = None) -> dict[str, Any]:
    """The run file: the `generate --json` object plus what a replay needs (and the drafter lanes)."""
    text = summary.text if summary else "".join("".join(ev.emitted_text) for ev in rounds)
    return {
        "prompt": prompt,
        "text": text,
        "token_ids": list(summary.token_ids) if summary else [t for ev in rounds for t in ev.emitted],
        "rounds": [ev.to_json() for ev in rounds],
        "stats": summary.stats_json() if summary else None,
        "config": dict(summary.config) if summary else {},
        "format": FORMAT,
        "version": VERSION,
        "preset": preset,
        "target": target,
        "drafters": list(drafters),
        "colors": dict(colors or {}),
        "settings": dict(settings or {}),
        "software": versions(),
        "lanes": {d: [round(float(x), 4) for x in lane] for d, lane in (lanes or {}).items()},
    }


@dataclass(frozen=True)
class Replay:
    """A loaded run: the events to re-play and how it was made."""

    prompt: str
    rounds: list[RoundEvent]
    summary: Summary | None
    preset: str
    target: str
    drafters: list[str]
    colors: dict[str, str]
    settings: dict[str, Any] = field(default_factory=dict)
    lanes: dict[str, list[float]] = field(default_factory=dict)  # empty for version 1 files


# Every round field a run file must have: those without a default (the optional ones, such as the lanes'
# `scores` and a tree round's details, are the engine's and not read back).
_ROUND_TYPES: dict[str, Any] = {f.name: f.type for f in fields(RoundEvent)
                                if f.default is MISSING and f.default_factory is MISSING}


def _num(x: Any, what: str, lo: float = -1e12, hi: float = 1e12) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float) or (isinstance(x, float) and not math.isfinite(x)):
        raise InvalidInput(f"{what} must be a number")
    if not lo <= x <= hi:
        raise InvalidInput(f"{what} must be between {lo:g} and {hi:g}")
    return float(x)


def _int(x: Any, what: str, lo: int = 0, hi: int = 10**9) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise InvalidInput(f"{what} must be an integer")
    if not lo <= x <= hi:
        raise InvalidInput(f"{what} must be between {lo:,} and {hi:,}")
    return x


def _ms(x: Any, what: str) -> float:
    """A recorded time in ms: a non-negative number, clamped to what a real round can take."""
    if isinstance(x, int) and not isinstance(x, bool) and x > RUN_ROUND_MAX_MS:
        return RUN_ROUND_MAX_MS  # an integer beyond any float converts to nothing: clamp it first
    return min(_num(x, what, 0.0, math.inf), RUN_ROUND_MAX_MS)


def _ints(x: Any, what: str, max_len: int = RUN_MAX_DRAFT + 1) -> tuple[int, ...]:
    if not isinstance(x, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in x):
        raise InvalidInput(f"{what} must be a list of token ids")
    if len(x) > max_len:
        raise InvalidInput(f"{what} has {len(x):,} tokens; the limit is {max_len:,}")
    if x and not 0 <= min(x) <= max(x) <= RUN_MAX_TOKEN_ID:
        raise InvalidInput(f"{what}: token ids must be between 0 and {RUN_MAX_TOKEN_ID:,}")
    return tuple(x)


def _strs(x: Any, what: str, lengths: tuple[int, ...]) -> tuple[str, ...]:
    """A list of token texts, one per token (`lengths`: the counts allowed), each at most RUN_MAX_TOKEN_CHARS."""
    if not isinstance(x, list) or not all(isinstance(v, str) for v in x):
        raise InvalidInput(f"{what} must be a list of strings")
    if len(x) not in lengths:
        raise InvalidInput(f"{what} must have one text per token ({' or '.join(map(str, sorted(set(lengths))))})")
    if any(len(v) > RUN_MAX_TOKEN_CHARS for v in x):
        raise InvalidInput(f"{what}: a token's text is at most {RUN_MAX_TOKEN_CHARS} characters")
    return tuple(x)


def _name(x: Any, what: str) -> str:
    if not isinstance(x, str) or not x:
        raise InvalidInput(f"{what} must be a drafter name (text)")
    if len(x) > LABEL_MAX_CHARS:
        raise InvalidInput(f"{what} has {len(x):,} characters; a drafter name is at most {LABEL_MAX_CHARS}")
    return x


def _floats(x: Any, what: str, n: int) -> tuple[float, ...]:
    """Per drafted position: probabilities in [0, 1], at most one per drafted token (absent: none)."""
    if not isinstance(x, list):
        return ()
    if len(x) > n:
        raise InvalidInput(f"{what} has {len(x)} values for {n} drafted tokens")
    return tuple(_num(v, what, 0.0, 1.0) for v in x)


def _arm_map(x: Any, what: str, optional: bool) -> dict[str, float | None]:
    if not isinstance(x, dict):
        raise InvalidInput(f"{what} must be an object")
    if len(x) > RUN_MAX_DRAFTERS:
        raise InvalidInput(f"{what} names {len(x):,} drafters; the limit is {RUN_MAX_DRAFTERS}")
    return {_name(k, f"{what}: a key"): None if optional and v is None else _num(v, what, -1e6, 1e6)
            for k, v in x.items()}


def _round(i: int, r: Any) -> RoundEvent:
    at = f"round {i + 1} of the run file"
    if not isinstance(r, dict):
        raise InvalidInput(f"{at} is not an object")
    missing = [k for k in _ROUND_TYPES if k not in r]
    if missing:
        raise InvalidInput(f"{at} lacks {', '.join(missing)}")
    if not isinstance(r["bonus"], bool) or not isinstance(r["regret_measured"], bool):
        raise InvalidInput(f"{at}: bonus and regret_measured must be true or false")
    draft = _ints(r["draft"], f"{at}: draft", RUN_MAX_DRAFT)
    emitted = _ints(r["emitted"], f"{at}: emitted", len(draft) + 1)
    accepted = _int(r["accepted"], f"{at}: accepted", 0, 10**9)
    if accepted > len(draft):
        raise InvalidInput(f"{at}: accepted must be within the draft (0 to {len(draft)})")
    if not emitted:
        raise InvalidInput(f"{at}: a round emits at least one token")
    return RoundEvent(
        round=_int(r["round"], f"{at}: round", 0, 10**7), drafter=_name(r["drafter"], f"{at}: drafter"),
        draft=draft, accepted=accepted, emitted=emitted,
        target_token=_int(r["target_token"], f"{at}: target_token", 0, RUN_MAX_TOKEN_ID), bonus=r["bonus"],
        p_draft=_floats(r["p_draft"], f"{at}: p_draft", len(draft)),
        q_draft=_floats(r["q_draft"], f"{at}: q_draft", len(draft)),
        accept_prob=_floats(r["accept_prob"], f"{at}: accept_prob", len(draft)),
        reward=_num(r["reward"], f"{at}: reward", -1e6, 1e6),
        rewards=_arm_map(r["rewards"], f"{at}: rewards", True),
        probabilities={k: float(v) for k, v in _arm_map(r["probabilities"], f"{at}: probabilities", False).items()},
        regret=_num(r["regret"], f"{at}: regret"), regret_measured=r["regret_measured"],
        draft_ms=_ms(r["draft_ms"], f"{at}: draft_ms"), verify_ms=_ms(r["verify_ms"], f"{at}: verify_ms"),
        overhead_ms=_ms(r["overhead_ms"], f"{at}: overhead_ms"),
        new_tokens=_int(r["new_tokens"], f"{at}: new_tokens", 0, 10**8),
        emitted_text=_strs(r["emitted_text"], f"{at}: emitted_text", (len(emitted),)),
        draft_text=_strs(r["draft_text"], f"{at}: draft_text", (0, len(draft))),
        **_tree_fields(r, at),
    )


def _branch(b: Any, at: str) -> dict[str, Any]:
    """One folded branch of a token-tree round (metasd.decoding.tree.other_branches), checked field by field."""
    if not isinstance(b, dict):
        raise InvalidInput(f"{at} is not an object")
    toks = _ints(b.get("tokens"), f"{at}: tokens", RUN_MAX_DRAFT)
    names = b.get("drafters") or []
    if not isinstance(names, list) or len(names) > RUN_MAX_DRAFTERS:
        raise InvalidInput(f"{at}: drafters must be a list of at most {RUN_MAX_DRAFTERS} names")
    return {"drafter": _name(b.get("drafter"), f"{at}: drafter"), "drafters": [_name(n, f"{at}: drafters") for n in names],
            "from": _int(b.get("from", 0), f"{at}: from", 0, RUN_MAX_DRAFT), "tokens": list(toks),
            "text": list(_strs(b.get("text", []), f"{at}: text", (0, len(toks)))),
            "accepted": _int(b.get("accepted", 0), f"{at}: accepted", 0, RUN_MAX_DRAFT)}


def _tree_fields(r: dict[str, Any], at: str) -> dict[str, Any]:
    """A round's optional token-tree fields (absent in chain rounds of older files): read back so a replay
    shows the folded branches and the budget as the live run did."""
    out: dict[str, Any] = {}
    for k in ("ids_verified", "tree_budget"):
        if k in r:
            out[k] = _int(r[k], f"{at}: {k}", 0, RUN_MAX_DRAFTERS * (RUN_MAX_DRAFT + 1))
    for k in ("regret_single", "regret_tree_ms"):
        if k in r:
            out[k] = _num(r[k], f"{at}: {k}")
    if "draft_extra" in r:
        if not isinstance(r["draft_extra"], bool):
            raise InvalidInput(f"{at}: draft_extra must be true or false")
        out["draft_extra"] = r["draft_extra"]
    for k in ("tree_share", "credit", "split_ms"):
        if k in r:
            out[k] = {n: float(v) for n, v in _arm_map(r[k], f"{at}: {k}", False).items()}
    branches = r.get("branches", [])
    if not isinstance(branches, list) or len(branches) > RUN_MAX_DRAFTERS:
        raise InvalidInput(f"{at}: branches must be a list of at most {RUN_MAX_DRAFTERS}")
    if branches:
        out["branches"] = tuple(_branch(b, f"{at}: branch {j + 1}") for j, b in enumerate(branches))
    return out


def _small_object(x: Any, what: str) -> dict[str, Any]:
    """settings / config: an object of at most RUN_MAX_FIELD_KEYS short entries (kept, shown nowhere as markup)."""
    if x is None:
        return {}
    if not isinstance(x, dict):
        raise InvalidInput(f"{what} must be an object")
    if len(x) > RUN_MAX_FIELD_KEYS or any(len(k) > LABEL_MAX_CHARS for k in x):
        raise InvalidInput(f"{what} has too many or too long entries (at most {RUN_MAX_FIELD_KEYS})")
    if "priors_weight" in x:  # the final status line prints it as a number
        _num(x["priors_weight"], f"{what}.priors_weight", 0.0, 1e9)
    return dict(x)


def _drafter_stats(per: Any) -> tuple[DrafterStats, ...]:
    if not isinstance(per, dict) or len(per) > RUN_MAX_DRAFTERS:
        raise InvalidInput(f"stats.drafters must be an object of at most {RUN_MAX_DRAFTERS} drafters")
    out = []
    for n, d in per.items():
        at = f"stats.drafters[{_name(n, 'stats.drafters: a key')!r}]"
        if not isinstance(d, dict):
            raise InvalidInput(f"{at} must be an object")
        out.append(DrafterStats(n, _int(d.get("pulls"), f"{at}.pulls"), _int(d.get("drafted"), f"{at}.drafted"),
                                _int(d.get("accepted"), f"{at}.accepted"), _num(d.get("mean_reward"), f"{at}.mean_reward"),
                                _num(d.get("draft_s"), f"{at}.draft_s", 0.0), _num(d.get("verify_s"), f"{at}.verify_s", 0.0)))
    return tuple(out)


def _summary(doc: dict[str, Any]) -> Summary | None:
    st = doc.get("stats")
    if st is None:
        return None  # a stopped or partial run saved before its summary
    if not isinstance(st, dict):
        raise InvalidInput("stats must be an object")
    missing = [k for k in ("new_tokens", "target_calls", "mean_accepted", "wall_s", "tokens_per_s") if k not in st]
    if missing:
        raise InvalidInput(f"stats of the run file are incomplete: {', '.join(missing)} missing")

    def f(k: str, lo: float = 0.0) -> float:
        return _num(st.get(k, 0.0), f"stats.{k}", lo)

    reason = st.get("stop_reason", "")
    if not isinstance(reason, str) or len(reason) > LABEL_MAX_CHARS:
        raise InvalidInput(f"stats.stop_reason must be text of at most {LABEL_MAX_CHARS} characters")
    return Summary(
        prompt=doc["prompt"], text=doc["text"], token_ids=_ints(doc.get("token_ids"), "token_ids", 10**7),
        new_tokens=_int(st["new_tokens"], "stats.new_tokens"), target_calls=_int(st["target_calls"], "stats.target_calls"),
        mean_accepted=f("mean_accepted"), wall_s=f("wall_s"), tokens_per_s=f("tokens_per_s"), draft_s=f("draft_s"),
        verify_s=f("verify_s"), overhead_s=f("overhead_s"), prefill_s=f("prefill_s"), stop_reason=reason,
        regret=f("regret", -1e12), regret_measured=st.get("regret_measured", False) is True,
        drafters=_drafter_stats(st.get("drafters") or {}), config=_small_object(doc.get("config"), "config"),
        ids_verified=_int(st.get("ids_verified", 0), "stats.ids_verified"),
    )


def _load_json(data: bytes | str) -> dict[str, Any]:
    if isinstance(data, str):
        data = data.encode("utf-8", "replace")
    if len(data) > MAX_BYTES:
        raise InvalidInput(f"the run file has {len(data):,} bytes; the limit is {MAX_BYTES:,}")
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise InvalidInput("the run file is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise InvalidInput(f"the run file is not JSON (line {e.lineno}: {e.msg})") from None
    except RecursionError:
        raise InvalidInput("the run file is not a run: it is nested too deeply") from None
    except ValueError as e:  # e.g. an integer with more digits than Python converts
        raise InvalidInput(f"the run file has a value out of range ({str(e)[:80]})") from None
    if not isinstance(doc, dict):
        raise InvalidInput("the run file must be a JSON object")
    return doc


def _names_and_colors(doc: dict[str, Any], events: list[RoundEvent]) -> tuple[list[str], dict[str, str]]:
    """The drafters in play (at most RUN_MAX_DRAFTERS distinct names in the whole file) and their colours."""
    drafters = doc.get("drafters") or []
    if not isinstance(drafters, list) or len(drafters) > RUN_MAX_DRAFTERS:
        raise InvalidInput(f"drafters must be a list of at most {RUN_MAX_DRAFTERS} names")
    drafters = [_name(d, "drafters: an entry") for d in drafters]
    known = set(drafters)
    for ev in events:
        known.add(ev.drafter)
        known.update(ev.probabilities)
        known.update(ev.rewards)
        if len(known) > RUN_MAX_DRAFTERS:
            raise InvalidInput(f"the run file names more than {RUN_MAX_DRAFTERS} drafters")
    colors = doc.get("colors") or {}
    # Colours go into style attributes: only #rrggbb, nothing else gets through.
    if not isinstance(colors, dict) or len(colors) > RUN_MAX_DRAFTERS or not all(
            isinstance(v, str) and re.fullmatch(r"#[0-9A-Fa-f]{6}", v) for v in colors.values()):
        raise InvalidInput("colors must map drafter names to #rrggbb colours")
    colors = {_name(k, "colors: a key"): v for k, v in colors.items()}
    return drafters or list(events[0].probabilities), colors


def check_lanes(lanes: Any, known: set[str], emitted: int) -> dict[str, list[float]]:
    """A run file's optional `lanes`: drafter -> one number in [0, 1] per emitted token, known drafters only."""
    if lanes is None:
        return {}
    if not isinstance(lanes, dict) or len(lanes) > RUN_MAX_DRAFTERS:
        raise InvalidInput(f"lanes must be an object of at most {RUN_MAX_DRAFTERS} drafters")
    out = {}
    for name, xs in lanes.items():
        if name not in known:
            raise InvalidInput(f"lanes names {str(name)[:LABEL_MAX_CHARS]!r}, which is not a drafter of this run")
        if not isinstance(xs, list) or len(xs) != emitted:
            raise InvalidInput(f"lanes[{name!r}] must have one value per emitted token ({emitted})")
        out[name] = [_num(x, f"lanes[{name!r}]", 0.0, 1.0) for x in xs]
    return out


def rendered_bytes(events: Sequence[RoundEvent]) -> int:
    """An upper bound on the token view's HTML for these rounds (metasd.ui.viz.round_spans), computed without
    rendering: per token SPAN_BYTES, its escaped text, and its drafter's escaped name three times."""
    esc: dict[str, int] = {}
    total = 0
    for ev in events:
        name = esc.setdefault(ev.drafter, len(html.escape(ev.drafter, quote=True)))
        pieces = (*ev.emitted_text, *ev.draft_text[ev.accepted:])
        n = len(ev.emitted) + max(0, len(ev.draft) - ev.accepted)
        total += n * (SPAN_BYTES + 3 * name) + sum(len(html.escape(t, quote=True)) + 2 for t in pieces)
        total += 10 * max(0, len(ev.draft) - ev.accepted - len(ev.draft_text[ev.accepted:]))  # "<id>" stand-ins
        if len(ev.draft) > ev.accepted:  # the round's group of rejected pieces: its mark's hover repeats them (repr)
            total += 192 + name + sum(8 * len(t) for t in ev.draft_text[ev.accepted:]) + 10 * (len(ev.draft) - ev.accepted)
        # a tree round's folded branches (viz.tree_fold_spans): one hover line per branch; repr and escaping
        # grow a character to at most 8 bytes ("\\x00" is 4, escaped "&#x27;" 6)
        total += 256 * bool(ev.branches) + sum(
            128 + 8 * sum(map(len, b["text"])) + sum(len(html.escape(n, quote=True)) + 2 for n in b["drafters"])
            for b in ev.branches)
    return total


def parse_run(data: bytes | str) -> Replay:
    """A run file's content, checked. Raises InvalidInput with one clear message for anything else."""
    size = len(data.encode("utf-8", "replace") if isinstance(data, str) else data)
    doc = _load_json(data)
    if doc.get("format") != FORMAT:
        shown = doc.get("format") if isinstance(doc.get("format"), str | int | None) else "?"
        raise InvalidInput(f"not a MetaSD run file (format {str(shown)[:40]!r}; expected {FORMAT!r}): save one with "
                           "`python -m metasd generate --json` or the page's JSON download")
    if not isinstance(doc.get("version"), int) or doc["version"] > VERSION:
        raise InvalidInput(f"run file version {str(doc.get('version'))[:20]!r} is newer than this app reads ({VERSION})")
    rounds = doc.get("rounds")
    if not isinstance(rounds, list) or not rounds:
        raise InvalidInput("the run file has no rounds")
    if len(rounds) > MAX_ROUNDS:
        raise InvalidInput(f"the run file has {len(rounds):,} rounds; the limit is {MAX_ROUNDS:,}")
    for k in ("prompt", "text"):
        if not isinstance(doc.get(k), str) or len(doc[k]) > RUN_MAX_TEXT_CHARS:
            raise InvalidInput(f"the run file needs its {k} (text of at most {RUN_MAX_TEXT_CHARS:,} characters)")
    events = [_round(i, r) for i, r in enumerate(rounds)]
    drafters, colors = _names_and_colors(doc, events)
    lanes = check_lanes(doc.get("lanes"), {*drafters, *(ev.drafter for ev in events)}, sum(len(ev.emitted) for ev in events))
    limit = RENDER_FACTOR * size + RENDER_FLOOR
    if rendered_bytes(events) > limit:
        raise InvalidInput(f"the run file would render to more than {limit:,} bytes of token view "
                           f"({RENDER_FACTOR} x its size + {RENDER_FLOOR:,}): its rounds are not a real run's")
    labels = {k: doc.get(k) or "" for k in ("preset", "target")}
    if not all(isinstance(v, str) and len(v) <= 2 * LABEL_MAX_CHARS for v in labels.values()):
        raise InvalidInput(f"preset and target must be names of at most {2 * LABEL_MAX_CHARS} characters")
    return Replay(prompt=doc["prompt"], rounds=events, summary=_summary(doc), preset=labels["preset"],
                  target=labels["target"], drafters=drafters, colors=colors,
                  settings=_small_object(doc.get("settings") if isinstance(doc.get("settings"), dict) else None,
                                         "settings"),
                  lanes=lanes)
