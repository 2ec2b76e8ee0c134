"""Input validation in one place, for the engine, the CLI and the app.

Every problem raises `InvalidInput` with a message that names the setting and its range;
callers show it as it is (a CLI error line, a `gr.Error`), never a traceback.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass
from typing import Any

from metasd.policies import POLICIES

REWARDS = ("bd", "be", "throughput")
MAX_PROMPT_CHARS = 32_000
LIMITS = {
    "gamma": (1, 16),
    "max_new_tokens": (1, 4096),
    "temperature": (0.0, 2.0),
    "top_p": (0.01, 1.0),  # top-p of 0 would leave nothing to sample
    "top_k": (0, 1_000_000),
    "seed": (0, 2**32 - 1),
}


class InvalidInput(ValueError):
    """Bad input from a user: the message is meant to be shown to them."""


@dataclass(frozen=True)
class Settings:
    drafters: tuple[str, ...]
    policy: str = "metasd-ucb"
    reward: str = "bd"
    gamma: int = 4
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    chat_template: bool = True
    full_info: bool = False


def _number(name: str, value: Any, integer: bool) -> float | int:
    lo, hi = LIMITS[name]
    if isinstance(value, bool) or value is None:
        raise InvalidInput(f"{name} must be a number between {lo} and {hi}, got {value!r}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"{name} must be a number between {lo} and {hi}, got {value!r}") from None
    if not math.isfinite(x):
        raise InvalidInput(f"{name} must be a finite number between {lo} and {hi}, got {value!r}")
    if integer:
        if x != int(x):
            raise InvalidInput(f"{name} must be a whole number between {lo} and {hi}, got {value!r}")
        x = int(x)
    if not lo <= x <= hi:
        raise InvalidInput(f"{name} must be between {lo} and {hi}, got {value!r}")
    return x


def clean_prompt(prompt: Any, max_chars: int = MAX_PROMPT_CHARS) -> str:
    """The prompt as text the tokenizer can take: NFC-normalised, control characters removed.

    Newlines and tabs stay; other control and format characters (NUL, escape sequences, bidi
    overrides, unpaired surrogates) are dropped because they only confuse the tokenizer.
    """
    if not isinstance(prompt, str):
        raise InvalidInput(f"the prompt must be text, got {type(prompt).__name__}")
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


def validate_settings(available: list[str], drafters: Any = None, policy: Any = "metasd-ucb",
                      reward: Any = "bd", gamma: Any = 4, max_new_tokens: Any = 128,
                      temperature: Any = 0.0, top_p: Any = 1.0, top_k: Any = 0, seed: Any = 0,
                      chat_template: Any = True, full_info: Any = False,
                      max_new_tokens_limit: int | None = None) -> Settings:
    """Check every generation setting against `available` drafters and the limits above."""
    if drafters is None or drafters == "" or drafters == []:
        names = list(available)
    else:
        if isinstance(drafters, str):
            drafters = [d.strip() for d in drafters.split(",") if d.strip()]
        if not isinstance(drafters, list | tuple) or not all(isinstance(d, str) for d in drafters):
            raise InvalidInput("drafters must be a list of drafter names")
        unknown = [d for d in drafters if d not in available]
        if unknown:
            raise InvalidInput(f"unknown drafter(s) {', '.join(map(repr, unknown))}; this preset has {', '.join(available)}")
        names = list(dict.fromkeys(drafters))
    if not names:
        raise InvalidInput("choose at least one drafter")
    if not isinstance(policy, str):
        raise InvalidInput("policy must be a name")
    if policy.startswith(("single:", "fixed:")):
        arm = policy.split(":", 1)[1]
        if arm not in names:
            chosen = ", ".join(names)
            raise InvalidInput(f"policy {policy!r} names drafter {arm!r}, which is not among the chosen drafters ({chosen})")
    elif policy not in POLICIES:
        raise InvalidInput(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)} or single:<drafter>")
    if reward not in REWARDS:
        raise InvalidInput(f"unknown reward {reward!r}; choose one of {', '.join(REWARDS)}")
    mnt = _number("max_new_tokens", max_new_tokens, True)
    if max_new_tokens_limit is not None and mnt > max_new_tokens_limit:
        raise InvalidInput(f"max_new_tokens must be between 1 and {max_new_tokens_limit} here, got {max_new_tokens!r}")
    full = bool(full_info) or POLICIES.get(policy) is not None and POLICIES[policy].needs_full_info
    return Settings(
        drafters=tuple(names),
        policy=policy,
        reward=reward,
        gamma=int(_number("gamma", gamma, True)),
        max_new_tokens=int(mnt),
        temperature=float(_number("temperature", temperature, False)),
        top_p=float(_number("top_p", top_p, False)),
        top_k=int(_number("top_k", top_k, True)),
        seed=int(_number("seed", seed, True)),
        chat_template=bool(chat_template),
        full_info=full,
    )
