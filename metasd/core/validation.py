"""Input validation in one place, for the engine, the CLI and the app.

Every problem raises `InvalidInput` with a message that names the setting and its range;
callers show it as it is (a CLI error line, a `gr.Error`), never a traceback.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from metasd.bandits.policies import POLICIES, single_drafter
from metasd.core import defaults

T = TypeVar("T")

REWARDS = ("bd", "be", "throughput")
PRICES = ("auto", "measured", "fixed")  # defaults.PRICES says what each means
MAX_PROMPT_CHARS = 32_000
PROMPT_SET_MAX_BYTES = 1_000_000  # an uploaded Spec-Bench JSONL (the real one is ~150 KB)
PROMPT_SET_MAX_LINES = 5_000
PLAYGROUND_MAX_DRAFTERS = 8
LABEL_MAX_CHARS = 64  # drafter names, categories and question ids shown back in the page

# ---- What one visitor may make the server do: every bound in one place (README "Bounds" lists them). ----
# Run files (metasd.core.runfile.parse_run; the Replay tab, the CLI's `replay`).
RUN_MAX_BYTES = 4_000_000  # a 1024-token run with full information is ~1.5 MB, without it ~0.6 MB
RUN_MAX_ROUNDS = 5_000
RUN_MAX_DRAFTERS = 32  # distinct drafter names in one file (a preset has <= 10, plugins add a few)
RUN_MAX_DRAFT = 64  # drafted tokens per round (the page's gamma is <= 16; adaptive drafting stays below 64)
RUN_MAX_TOKEN_CHARS = 256  # text of one token
RUN_MAX_TEXT_CHARS = 2 * MAX_PROMPT_CHARS  # prompt and text of a run
RUN_MAX_FIELD_KEYS = 64  # entries of the settings and config objects
RUN_ROUND_MAX_MS = 10_000.0  # a recorded draft, verify or overhead time is clamped to this (a real round: ~0.1 s)
RUN_MAX_TOKEN_ID = 2**31 - 1
# The token view of an accepted run file is at most RENDER_FACTOR x its size + RENDER_FLOOR bytes (the
# gallery's runs render to 0.3-0.9x their size); a file that would render larger is refused before rendering.
RENDER_FACTOR = 4
RENDER_FLOOR = 65_536
REPLAY_MAX_S = 120.0  # a replay's wall time at most: a longer recording (or a slow speed) is played faster
# Gradio's upload cap: the largest file any upload takes (run files; prompt sets are checked at their own cap).
UPLOAD_MAX_BYTES = max(RUN_MAX_BYTES, PROMPT_SET_MAX_BYTES)
# Compare: one call's prompt characters (all prompts together) x max new tokens. Decoding is bounded by
# COMPARE_MAX_PROMPTS x COMPARE_MAX_NEW_TOKENS; this bounds the prompts' passes (the issue's 30 prompts of 18,000
# characters at 256 tokens, about 2 hours here, is 138M). The 14 built-in examples at 256 tokens: 0.6M.
COMPARE_MAX_WORK = 3_000_000


def check_compare_work(prompts: Sequence[str], max_new_tokens: int, limit: int = COMPARE_MAX_WORK) -> int:
    """The work of one Compare call (total prompt characters x max new tokens), or InvalidInput saying the bound
    and what would fit, before anything runs."""
    chars = sum(len(p) for p in prompts)
    work = chars * max_new_tokens
    if work > limit:
        fit = max(0, limit // max(chars, 1))
        raise InvalidInput(f"this comparison is {len(prompts)} prompt(s) of {chars:,} characters x {max_new_tokens} new "
                           f"tokens = {work:,}; one run may do at most {limit:,} (characters x new tokens): use at most "
                           f"{limit // max_new_tokens:,} characters at {max_new_tokens} tokens"
                           + (f", or at most {fit} new tokens" if fit >= 1 else "") + ", or fewer prompts")
    return work


# Bandit playground: policies x rounds x drafters of one simulation. The page's default is 48,000 (under a
# second); 320,000 is e.g. 4 policies x 20,000 rounds x 4 drafters, at most ~25 s here (Thompson, 8 drafters).
PLAYGROUND_MAX_WORK = 320_000
LIMITS = {
    "gamma": (1, 16),
    "max_new_tokens": (1, 4096),
    "temperature": (0.0, 2.0),
    "top_p": (0.01, 1.0),  # top-p of 0 would leave nothing to sample
    "top_k": (0, 1_000_000),
    "seed": (0, 2**32 - 1),
    # The app's Compare tab and bandit playground
    "per_category": (1, 10),
    "rounds": (1, 20_000),  # the playground draws rounds x drafters x gamma numbers up front
    "spread": (0.5, 50.0),
    "acceptance": (0.0, 1.0),
    "cost": (0.0, 100.0),
}


class InvalidInput(ValueError):
    """Bad input from a user: the message is meant to be shown to them."""


@dataclass(frozen=True)
class Settings:
    drafters: tuple[str, ...]
    # The request defaults every entry point shares (metasd/core/defaults.py); gamma: generate() puts the
    # preset's own in when none is given.
    policy: str = defaults.POLICY
    reward: str = defaults.REWARD
    gamma: int = 4
    max_new_tokens: int = defaults.MAX_NEW_TOKENS
    temperature: float = defaults.TEMPERATURE
    top_p: float = defaults.TOP_P
    top_k: int = defaults.TOP_K
    seed: int = defaults.SEED
    chat_template: bool = True
    full_info: bool = False
    # How fast the output comes, never what it is: score model-free drafters on every verified chunk,
    # adapt each drafter's draft length to its recent runs, let drafters with nothing to propose sleep.
    free_feedback: bool = True
    adaptive: bool = defaults.ADAPTIVE  # off: docs/DESIGN.md §2, Adaptive draft length
    sleeping: bool = True
    # Start the bandit from the preset's informed priors (metasd/bandits/priors.py) where it has them; False is
    # the paper's setting, every arm unknown.
    priors: bool = True
    # Where the plans' milliseconds come from (defaults.PRICES): how fast the output comes, and whether a sampled
    # run's seed repeats it; never what distribution it has.
    prices: str = defaults.PRICES


def number(name: str, value: Any, integer: bool, limits: tuple[float, float] | None = None) -> float | int:
    """`value` as a finite number (an int when `integer`) within LIMITS[name], or InvalidInput naming it."""
    lo, hi = limits or LIMITS[name]
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    if isinstance(value, bool) or value is None:
        raise InvalidInput(f"{name} must be a number between {lo} and {hi}, got {shown}")
    if isinstance(value, str) and len(value) > 40:
        raise InvalidInput(f"{name} must be a number between {lo} and {hi}, got {shown}")
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        raise InvalidInput(f"{name} must be a number between {lo} and {hi}, got {shown}") from None
    if not math.isfinite(x):
        raise InvalidInput(f"{name} must be a finite number between {lo} and {hi}, got {shown}")
    if integer:
        if x != int(x):
            raise InvalidInput(f"{name} must be a whole number between {lo} and {hi}, got {shown}")
        x = value if isinstance(value, int) else int(x)  # exact for ints beyond float precision
    if not lo <= x <= hi:
        raise InvalidInput(f"{name} must be between {lo} and {hi}, got {shown}")
    return x


def clean_prompt(prompt: Any, max_chars: int = MAX_PROMPT_CHARS) -> str:
    """The prompt as text the tokenizer can take: NFC-normalised, control characters removed.

    Newlines and tabs stay; other control and format characters (NUL, escape sequences, bidi
    overrides, unpaired surrogates) are dropped because they only confuse the tokenizer.
    """
    if not isinstance(prompt, str):
        raise InvalidInput(f"the prompt must be text, got {type(prompt).__name__}")
    if len(prompt) > 2 * max_chars:  # refuse a huge paste before spending time normalising it
        raise InvalidInput(f"the prompt has {len(prompt):,} characters; the limit is {max_chars:,}")
    text = prompt.encode("utf-8", "replace").decode("utf-8") if _has_surrogates(prompt) else prompt
    text = unicodedata.normalize("NFC", text)
    text = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co"))
    if not text.strip():
        raise InvalidInput("the prompt is empty: type a question or pick an example")
    if len(text) > max_chars:
        raise InvalidInput(f"the prompt has {len(text):,} characters; the limit is {max_chars:,}")
    return text


def _has_surrogates(s: str) -> bool:
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def arm_names(available: list[str], drafters: Any, policy: Any, default: list[str] | None) -> list[str]:
    """The drafters asked for (a list or a comma-separated string), each one `available`; none named: `default` (else
    every available one) with the drafter a single:<drafter> policy names."""
    if drafters is None or drafters == "" or drafters == []:
        names = list(default or available)
        arm = single_drafter(policy)
        if arm is not None and arm in available and arm not in names:
            names.append(arm)
        return names
    if isinstance(drafters, str):
        drafters = [d.strip() for d in drafters.split(",") if d.strip()]
    if not isinstance(drafters, list | tuple) or not all(isinstance(d, str) for d in drafters):
        raise InvalidInput("drafters must be a list of drafter names")
    unknown = [d for d in drafters if d not in available]
    if unknown:
        raise InvalidInput(f"unknown drafter(s) {', '.join(map(repr, unknown))}; this preset has {', '.join(available)}")
    return list(dict.fromkeys(drafters))


def validate_settings(available: list[str], drafters: Any = None, policy: Any = defaults.POLICY, reward: Any = defaults.REWARD,
                      gamma: Any = 4, max_new_tokens: Any = defaults.MAX_NEW_TOKENS, temperature: Any = defaults.TEMPERATURE,
                      top_p: Any = defaults.TOP_P, top_k: Any = defaults.TOP_K, seed: Any = defaults.SEED,
                      chat_template: Any = True, full_info: Any = defaults.FULL_INFO, free_feedback: Any = True,
                      adaptive: Any = defaults.ADAPTIVE, sleeping: Any = True, priors: Any = not defaults.COLD,
                      prices: Any = defaults.PRICES, max_new_tokens_limit: int | None = None,
                      default: list[str] | None = None) -> Settings:
    """Check every generation setting against `available` drafters and the limits above.

    With no drafters named, the arms are `default` (else all available), plus the one a
    single:<drafter> policy names.
    """
    names = arm_names(available, drafters, policy, default)
    if not names:
        raise InvalidInput("choose at least one drafter")
    if not isinstance(policy, str):
        raise InvalidInput("policy must be a name")
    arm = single_drafter(policy)
    if arm is not None:
        if arm not in names:
            chosen = ", ".join(names)
            raise InvalidInput(f"policy {policy!r} names drafter {arm!r}, which is not among the chosen drafters ({chosen})")
    elif policy not in POLICIES:
        raise InvalidInput(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)} or single:<drafter>")
    if reward not in REWARDS:
        raise InvalidInput(f"unknown reward {reward!r}; choose one of {', '.join(REWARDS)}")
    if prices not in PRICES:
        raise InvalidInput(f"unknown prices {prices!r}; choose one of {', '.join(PRICES)}")
    # A caller's own cap (the app's) is the range the user is told about.
    top = LIMITS["max_new_tokens"][1] if max_new_tokens_limit is None else min(max_new_tokens_limit, LIMITS["max_new_tokens"][1])
    mnt = number("max_new_tokens", max_new_tokens, True, (1, top))
    full = bool(full_info) or POLICIES.get(policy) is not None and POLICIES[policy].needs_full_info
    return Settings(
        drafters=tuple(names),
        policy=policy,
        reward=reward,
        gamma=int(number("gamma", gamma, True)),
        max_new_tokens=int(mnt),
        temperature=float(number("temperature", temperature, False)),
        top_p=float(number("top_p", top_p, False)),
        top_k=int(number("top_k", top_k, True)),
        seed=int(number("seed", seed, True)),
        chat_template=bool(chat_template),
        full_info=full,
        free_feedback=bool(free_feedback),
        adaptive=bool(adaptive),
        sleeping=bool(sleeping),
        priors=bool(priors),
        prices=prices,
    )


def clean_label(value: Any, what: str, max_chars: int = LABEL_MAX_CHARS) -> str:
    """A short name shown back in the page (drafter, category, question id): one line of printable text."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise InvalidInput(f"{what} must be text, got {type(value).__name__}")
    text = unicodedata.normalize("NFC", str(value)).encode("utf-8", "replace").decode("utf-8")
    text = " ".join("".join(ch if unicodedata.category(ch)[0] not in "CZ" or ch == " " else " " for ch in text).split())
    return text[:max_chars]


def markdown_literal(value: Any, max_chars: int = LABEL_MAX_CHARS) -> str:
    """A visitor's text shown inside Markdown as literal text: one short line, every markup character (tags,
    links, emphasis, table pipes) backslash-escaped."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>~&])", r"\\\1", clean_label(value, "text", max_chars))


def parse_prompt_set(data: bytes | str, max_bytes: int = PROMPT_SET_MAX_BYTES,
                     max_lines: int = PROMPT_SET_MAX_LINES, int_ids: bool = False) -> list[dict[str, Any]]:
    """Prompts from JSONL in Spec-Bench's format (question_id, category, turns; the first turn is the
    prompt): the one parser for uploads, the benchmark's prompt files and the page's examples.

    Checks size, encoding and every line; a problem raises InvalidInput naming the line.
    Returns [{"question_id", "category", "prompt"}] with each prompt passed through clean_prompt and
    labels made printable text (`int_ids` keeps integer question ids as they are, as Spec-Bench has them).
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "replace")
    if len(data) > max_bytes:
        raise InvalidInput(f"the prompt file has {len(data):,} bytes; the limit is {max_bytes:,}")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InvalidInput(f"the prompt file is not UTF-8 text (bad byte at offset {e.start})") from None
    lines = text.splitlines()
    if len(lines) > max_lines:
        raise InvalidInput(f"the prompt file has {len(lines):,} lines; the limit is {max_lines:,}")
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            msg = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
            raise InvalidInput(f"line {i} of the prompt file is not JSON ({msg})") from None
        turns = obj.get("turns") if isinstance(obj, dict) else None
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise InvalidInput(f"line {i} of the prompt file needs \"turns\": a list whose first item is the prompt")
        try:
            prompt = clean_prompt(turns[0])
            qid = obj.get("question_id", i)
            if not (int_ids and isinstance(qid, int) and not isinstance(qid, bool)):
                qid = clean_label(qid, "question_id") or str(i)
            category = clean_label(obj.get("category") or "uncategorised", "category") or "uncategorised"
        except InvalidInput as e:
            raise InvalidInput(f"line {i} of the prompt file: {e}") from None
        out.append({"question_id": qid, "category": category, "prompt": prompt})
    if not out:
        raise InvalidInput("the prompt file has no prompts")
    return out


def first_per_category(items: Sequence[T], n: int, category: Callable[[T], str] = lambda it: it["category"]) -> list[T]:
    """The first `n` items of each category, in the order given."""
    seen: Counter[str] = Counter()
    out = []
    for it in items:
        c = category(it)
        if seen[c] < n:
            seen[c] += 1
            out.append(it)
    return out


@dataclass(frozen=True)
class PlaygroundSettings:
    drafters: tuple[tuple[str, float, float], ...]  # (name, acceptance, cost)
    policies: tuple[str, ...]
    gamma: int
    rounds: int
    reward: str
    full_info: bool
    spread: float
    seed: int


def validate_playground(rows: Any, policies: Any, gamma: Any, rounds: Any, reward: Any, full_info: Any,
                        spread: Any, seed: Any) -> PlaygroundSettings:
    """The bandit playground's settings: synthetic drafters (name, acceptance, cost) and the simulation."""
    if not isinstance(rows, list | tuple) or not all(isinstance(r, dict) for r in rows):
        raise InvalidInput("the drafter table must have the columns drafter, acceptance, cost")
    drafters = []
    for i, r in enumerate(rows, 1):
        raw = r.get("drafter")
        if raw is None or (isinstance(raw, float) and math.isnan(raw)) or not str(raw).strip():
            continue  # an empty row
        name = clean_label(raw, f"drafter name in row {i}")
        if not name:
            continue
        acc = float(number("acceptance", r.get("acceptance"), False))
        cost = float(number("cost", r.get("cost"), False))
        drafters.append((name, acc, cost))
    if not drafters:
        raise InvalidInput("the playground needs at least one drafter (a row with a name)")
    if len(drafters) > PLAYGROUND_MAX_DRAFTERS:
        raise InvalidInput(f"the playground takes at most {PLAYGROUND_MAX_DRAFTERS} drafters, got {len(drafters)}")
    if len({d[0] for d in drafters}) != len(drafters):
        raise InvalidInput("drafter names must be distinct")
    if isinstance(policies, str):
        policies = [policies]
    if not isinstance(policies, list | tuple) or not policies:
        raise InvalidInput("pick at least one policy")
    unknown = [p for p in policies if not isinstance(p, str) or p not in POLICIES]
    if unknown:
        raise InvalidInput(f"unknown policy {unknown[0]!r}; choose from {', '.join(POLICIES)}")
    if reward not in REWARDS:
        raise InvalidInput(f"unknown reward {reward!r}; choose one of {', '.join(REWARDS)}")
    st = PlaygroundSettings(
        drafters=tuple(drafters), policies=tuple(dict.fromkeys(policies)),
        gamma=int(number("gamma", gamma, True)), rounds=int(number("rounds", rounds, True)), reward=reward,
        full_info=bool(full_info), spread=float(number("spread", spread, False)), seed=int(number("seed", seed, True)),
    )
    work = len(st.policies) * st.rounds * len(st.drafters)
    if work > PLAYGROUND_MAX_WORK:  # bounded before it starts (#27)
        fit = PLAYGROUND_MAX_WORK // (len(st.policies) * len(st.drafters))
        raise InvalidInput(f"{len(st.policies)} policies x {st.rounds:,} rounds x {len(st.drafters)} drafters = {work:,}; "
                           f"one simulation may do at most {PLAYGROUND_MAX_WORK:,}: use at most {fit:,} rounds, "
                           "or fewer policies or drafters")
    return st
