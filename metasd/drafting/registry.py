"""Bring your own drafter: `register_drafter(name, make)` makes `name` a drafter everywhere.

    from metasd import Drafter, register_drafter

    class EchoLast(Drafter): ...                       # reset / propose / predict, see metasd.drafting.drafters
    register_drafter("echo-last", lambda bundle: EchoLast("echo-last"), kind="model-free",
                     description="repeats the last token")

The name then works wherever a preset's drafter name does: `generate(..., drafters=[...])`,
`single:<name>`, the CLI, `bench`, and the app's drafter list (with a colour of its own). `make(bundle)`
is called once per request and must return a fresh Drafter (per-request state lives in it).

Plugins are modules that call `register_drafter` when imported. The app and the CLI import those
named in `METASD_PLUGINS` (comma-separated importable module paths), which only whoever runs them
sets: nothing typed into the web page ever imports anything.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from metasd.core.validation import InvalidInput

if TYPE_CHECKING:
    from metasd.drafting.drafters import Drafter

# What `python -m metasd drafters` reports as a drafter's kind (docs/DESIGN.md §3).
KINDS = ("model-free", "self", "model", "distilled", "white-box")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Registered:
    name: str
    make: Callable[[Any], Drafter]
    kind: str
    description: str
    module: str


_registry: dict[str, Registered] = {}


def register_drafter(name: str, make: Callable[[Any], Drafter], *, kind: str = "model-free",
                     description: str = "") -> None:
    """Make `name` usable wherever a drafter name is. Re-registering a name replaces it (a reloaded plugin)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name.startswith("single"):
        raise ValueError(f"drafter name {name!r}: use 1-64 letters, digits, '.', '_' or '-' (not starting with 'single')")
    if not callable(make):
        raise TypeError("make must be a callable: make(bundle) -> Drafter")
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {', '.join(KINDS)}")
    module = getattr(make, "__module__", "") or ""
    _registry[name] = Registered(name, make, kind, description or f"registered by {module or 'a plugin'}", module)


def registered() -> dict[str, Registered]:
    """Every registered drafter, by name (in registration order)."""
    return dict(_registry)


def unregister_drafter(name: str) -> None:
    _registry.pop(name, None)


def make_registered(name: str, bundle: Any) -> Drafter:
    from metasd.drafting.drafters import Drafter

    d = _registry[name].make(bundle)
    if not isinstance(d, Drafter):
        raise InvalidInput(f"drafter {name!r}: its make(bundle) returned {type(d).__name__}, not a metasd Drafter")
    if d.name != name:
        d.name = name  # events and stats are keyed by the registered name
    return d


def load_plugins(spec: str | None) -> list[str]:
    """Import the comma-separated plugin modules (an operator's `METASD_PLUGINS`); returns the names of the
    drafters they registered. A module that cannot be imported is an error naming it, never skipped."""
    before = set(_registry)
    for mod in (m.strip() for m in (spec or "").split(",")):
        if not mod:
            continue
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", mod):
            raise ValueError(f"METASD_PLUGINS: {mod!r} is not an importable module path")
        try:
            importlib.import_module(mod)
        except Exception as e:
            raise RuntimeError(f"METASD_PLUGINS: could not import {mod!r}: {type(e).__name__}: {e}") from e
    return [n for n in _registry if n not in before]
