"""Run files: one saved generation that can be replayed anywhere, without a model.

A run file is the `generate --json` document (prompt, text, token_ids, rounds, stats, config),
extended with what a replay needs: `format` and `version`, the preset and its target, the drafters
in play and their colours, the settings, and the software versions. The CLI's `--json`, the page's
JSON download and the gallery in assets/runs/ all write this one format; `replay` and the page's
Replay tab read it back.

Loading is plain JSON parsing and type checks (never pickle, never code): a size cap, the format
tag, and every round checked field by field, so a bad file gets one clear message.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from metasd.core.events import DrafterStats, RoundEvent, Summary
from metasd.core.validation import InvalidInput

FORMAT = "metasd-run"
VERSION = 2  # 2: `lanes` (metasd/core/lanes.py); version 1 files load without them
MAX_BYTES = 16_000_000  # a 1024-token run with full information is ~1.5 MB
MAX_ROUNDS = 5_000


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


# Every round field a run file must have (`scores` is the engine's, for the lanes: not in rounds).
_ROUND_TYPES: dict[str, Any] = {f.name: f.type for f in fields(RoundEvent) if f.name != "scores"}


def _num(x: Any, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float) or (isinstance(x, float) and not math.isfinite(x)):
        raise InvalidInput(f"{what} must be a number")
    return float(x)


def _ints(x: Any, what: str) -> tuple[int, ...]:
    if not isinstance(x, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in x):
        raise InvalidInput(f"{what} must be a list of token ids")
    return tuple(x)


def _strs(x: Any, what: str) -> tuple[str, ...]:
    if not isinstance(x, list) or not all(isinstance(v, str) for v in x):
        raise InvalidInput(f"{what} must be a list of strings")
    return tuple(x)


def _round(i: int, r: Any) -> RoundEvent:
    at = f"round {i + 1} of the run file"
    if not isinstance(r, dict):
        raise InvalidInput(f"{at} is not an object")
    missing = [k for k in _ROUND_TYPES if k not in r]
    if missing:
        raise InvalidInput(f"{at} lacks {', '.join(missing)}")
    if not isinstance(r["drafter"], str) or not isinstance(r["bonus"], bool) or not isinstance(r["regret_measured"], bool):
        raise InvalidInput(f"{at}: drafter, bonus or regret_measured has the wrong type")
    probs, rewards = r["probabilities"], r["rewards"]
    if not isinstance(probs, dict) or not isinstance(rewards, dict):
        raise InvalidInput(f"{at}: probabilities and rewards must be objects")
    for k in ("round", "accepted", "target_token", "new_tokens"):
        if not isinstance(r[k], int) or isinstance(r[k], bool):
            raise InvalidInput(f"{at}: {k} must be an integer")
    draft, emitted = _ints(r["draft"], f"{at}: draft"), _ints(r["emitted"], f"{at}: emitted")
    if not 0 <= r["accepted"] <= len(draft) or not emitted:
        raise InvalidInput(f"{at}: accepted must be within the draft, and a round emits at least one token")
    return RoundEvent(
        round=r["round"], drafter=r["drafter"], draft=draft, accepted=r["accepted"], emitted=emitted,
        target_token=r["target_token"], bonus=r["bonus"],
        p_draft=tuple(_num(v, f"{at}: p_draft") for v in r["p_draft"]) if isinstance(r["p_draft"], list) else (),
        q_draft=tuple(_num(v, f"{at}: q_draft") for v in r["q_draft"]) if isinstance(r["q_draft"], list) else (),
        accept_prob=tuple(_num(v, f"{at}: accept_prob") for v in r["accept_prob"])
        if isinstance(r["accept_prob"], list) else (),
        reward=_num(r["reward"], f"{at}: reward"),
        rewards={str(k): None if v is None else _num(v, f"{at}: rewards") for k, v in rewards.items()},
        probabilities={str(k): _num(v, f"{at}: probabilities") for k, v in probs.items()},
        regret=_num(r["regret"], f"{at}: regret"), regret_measured=r["regret_measured"],
        draft_ms=_num(r["draft_ms"], f"{at}: draft_ms"), verify_ms=_num(r["verify_ms"], f"{at}: verify_ms"),
        overhead_ms=_num(r["overhead_ms"], f"{at}: overhead_ms"), new_tokens=r["new_tokens"],
        emitted_text=_strs(r["emitted_text"], f"{at}: emitted_text"), draft_text=_strs(r["draft_text"], f"{at}: draft_text"),
    )


def _summary(doc: dict[str, Any]) -> Summary | None:
    st = doc.get("stats")
    if st is None:
        return None  # a stopped or partial run saved before its summary
    if not isinstance(st, dict):
        raise InvalidInput("stats must be an object")
    try:
        per = st.get("drafters") or {}
        stats = tuple(DrafterStats(str(n), int(d["pulls"]), int(d["drafted"]), int(d["accepted"]), float(d["mean_reward"]),
                                   float(d["draft_s"]), float(d["verify_s"])) for n, d in per.items())
        return Summary(
            prompt=str(doc["prompt"]), text=str(doc["text"]), token_ids=_ints(doc["token_ids"], "token_ids"),
            new_tokens=int(st["new_tokens"]), target_calls=int(st["target_calls"]),
            mean_accepted=float(st["mean_accepted"]), wall_s=float(st["wall_s"]), tokens_per_s=float(st["tokens_per_s"]),
            draft_s=float(st.get("draft_s", 0.0)), verify_s=float(st.get("verify_s", 0.0)),
            overhead_s=float(st.get("overhead_s", 0.0)), prefill_s=float(st.get("prefill_s", 0.0)),
            stop_reason=str(st.get("stop_reason", "")), regret=float(st.get("regret", 0.0)),
            regret_measured=bool(st.get("regret_measured", False)), drafters=stats,
            config=dict(doc.get("config") or {}),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InvalidInput(f"stats of the run file are incomplete or mistyped ({type(e).__name__}: {e})") from None


def parse_run(data: bytes | str) -> Replay:
    """A run file's content, checked. Raises InvalidInput with one clear message for anything else."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if len(data) > MAX_BYTES:
        raise InvalidInput(f"the run file has {len(data):,} bytes; the limit is {MAX_BYTES:,}")
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise InvalidInput("the run file is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise InvalidInput(f"the run file is not JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(doc, dict):
        raise InvalidInput("the run file must be a JSON object")
    if doc.get("format") != FORMAT:
        raise InvalidInput(f"not a MetaSD run file (format {doc.get('format')!r}; expected {FORMAT!r}): save one with "
                           "`python -m metasd generate --json` or the page's JSON download")
    if not isinstance(doc.get("version"), int) or doc["version"] > VERSION:
        raise InvalidInput(f"run file version {doc.get('version')!r} is newer than this app reads ({VERSION})")
    rounds = doc.get("rounds")
    if not isinstance(rounds, list) or not rounds:
        raise InvalidInput("the run file has no rounds")
    if len(rounds) > MAX_ROUNDS:
        raise InvalidInput(f"the run file has {len(rounds):,} rounds; the limit is {MAX_ROUNDS:,}")
    if not isinstance(doc.get("prompt"), str) or not isinstance(doc.get("text"), str):
        raise InvalidInput("the run file needs its prompt and text")
    events = [_round(i, r) for i, r in enumerate(rounds)]
    drafters = doc.get("drafters") or []
    colors = doc.get("colors") or {}
    if not isinstance(drafters, list) or not all(isinstance(d, str) for d in drafters):
        raise InvalidInput("drafters must be a list of names")
    # Colours go into style attributes: only #rrggbb, nothing else gets through.
    if not isinstance(colors, dict) or not all(isinstance(v, str) and re.fullmatch(r"#[0-9A-Fa-f]{6}", v)
                                               for v in colors.values()):
        raise InvalidInput("colors must map drafter names to #rrggbb colours")
    settings = doc.get("settings") if isinstance(doc.get("settings"), dict) else {}
    lanes = parse_lanes(doc.get("lanes"), sum(len(ev.emitted) for ev in events))
    return Replay(prompt=doc["prompt"], rounds=events, summary=_summary(doc), preset=str(doc.get("preset") or ""),
                  target=str(doc.get("target") or ""), drafters=list(drafters) or list(events[0].probabilities),
                  colors={str(k): v for k, v in colors.items()}, settings=settings,
                  lanes=lanes)


def parse_lanes(lanes: Any, n_tokens: int) -> dict[str, list[float]]:
    """The `lanes` of a run file (absent before version 2: none): per drafter name, one number in [0, 1]
    per emitted token."""
    if lanes is None:
        return {}
    if not isinstance(lanes, dict) or len(lanes) > 64:
        raise InvalidInput("lanes must map at most 64 drafter names to lists of numbers")
    out = {}
    for name, lane in lanes.items():
        if not isinstance(lane, list) or len(lane) != n_tokens:
            raise InvalidInput(f"lane {str(name)[:64]!r} must have one number per emitted token ({n_tokens})")
        values = [_num(x, f"lane {str(name)[:64]!r}") for x in lane]
        if any(not 0.0 <= x <= 1.0 for x in values):
            raise InvalidInput(f"lane {str(name)[:64]!r} has a number outside [0, 1]")
        out[str(name)] = values
    return out
