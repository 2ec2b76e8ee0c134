"""MetaSD: lossless multi-drafter speculative decoding with a bandit choosing the drafter each round.

The public names are imported on first use (PEP 562), so that `python -m metasd --help` and the
other commands that need no model do not pay for importing torch and transformers."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOME = {
    "generate": "metasd.decoding.engine", "run": "metasd.decoding.engine", "target_greedy": "metasd.decoding.engine",
    "RoundEvent": "metasd.core.events", "Summary": "metasd.core.events",
    "InvalidInput": "metasd.core.validation",
    "Draft": "metasd.drafting.drafters", "Drafter": "metasd.drafting.drafters", "Verified": "metasd.drafting.drafters",
    "load_plugins": "metasd.drafting.registry", "register_drafter": "metasd.drafting.registry",
    "Bundle": "metasd.decoding.loading", "load_bundle": "metasd.decoding.loading",
    "DEFAULT_PRESET": "metasd.models.presets", "PRESETS": "metasd.models.presets",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'metasd' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # once imported, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])


if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from metasd.core.events import RoundEvent, Summary
    from metasd.core.validation import InvalidInput
    from metasd.decoding.engine import generate, run, target_greedy
    from metasd.decoding.loading import Bundle, load_bundle
    from metasd.drafting.drafters import Draft, Drafter, Verified
    from metasd.drafting.registry import load_plugins, register_drafter
    from metasd.models.presets import DEFAULT_PRESET, PRESETS

__all__ = ["generate", "run", "target_greedy", "RoundEvent", "Summary", "Bundle", "load_bundle",
           "DEFAULT_PRESET", "PRESETS", "InvalidInput", "Drafter", "Draft", "Verified", "register_drafter",
           "load_plugins"]
