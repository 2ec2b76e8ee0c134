"""Bring your own drafter: `register_drafter(name, make)` makes `name` a drafter everywhere.

    from metasd import Drafter, register_drafter

    class EchoLast(Drafter): ...                       # reset / propose / predict, see metasd.drafting.drafters
    register_drafter("echo-last", lambda bundle: EchoLast("echo-last"), kind="model-free",
                     description="repeats the last token")

The name then works wherever a preset's drafter name does: `generate(..., drafters=[...])`,
`single:<name>`, the CLI, `bench`, and the app's drafter list (with a colour of its own). `make(bundle)`
is called once per request and must return a fresh Drafter (per-request state lives in it).

Built-in drafters go through the same registry: each module that defines a drafter registers a factory
for its preset kind (`register_kind`), and `make_drafter(bundle, name)` builds a preset's drafter from its
kind's factory or a plugin's from its `make`. `SPEC_KINDS` is the one list of kinds.

This module stays light (no torch) so that the pure view functions can ask for a drafter's kind.

Plugins are modules that call `register_drafter` when imported. The app and the CLI import those
named in `METASD_PLUGINS` (comma-separated importable module paths), which only whoever runs them
sets: nothing typed into the web page ever imports anything.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from metasd.core.validation import InvalidInput
from metasd.models.presets import PRESETS, DrafterSpec

# A Drafter (metasd.drafting.drafters) is named `Any` here: importing that module would pull in torch and
# make this one import it back (it registers its kinds here). Bundle.make_drafters checks the type.
Drafter = Any
# The one list of kinds: a preset's DrafterSpec.kind -> the family `python -m metasd drafters`, the page's
# legend and plugins use (docs/DESIGN.md §3).
SPEC_KINDS = {"prompt-lookup": "model-free", "token-recycling": "model-free", "retrieval": "model-free",
              "layer-skip": "self", "model": "model", "distilled": "distilled", "white-box": "white-box"}
KINDS = tuple(dict.fromkeys(SPEC_KINDS.values()))  # model-free, self, model, distilled, white-box
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Registered:
    name: str
    make: Callable[[Any], Drafter]
    kind: str
    description: str
    module: str


_registry: dict[str, Registered] = {}
# Built-in drafters: spec kind -> factory(bundle, spec), registered by the module that defines the drafter.
_factories: dict[str, Callable[[Any, DrafterSpec], Drafter]] = {}


def register_kind(kind: str, factory: Callable[[Any, DrafterSpec], Drafter]) -> None:
    """Make a preset's drafters of `kind` buildable: factory(bundle, spec) -> a fresh Drafter."""
    if kind not in SPEC_KINDS:
        raise ValueError(f"drafter kind {kind!r}: one of {', '.join(SPEC_KINDS)}")
    _factories[kind] = factory


def make_drafter(bundle: Any, name: str) -> Drafter:
    """A fresh per-request drafter: the preset's own (its kind's factory), else a registered plugin."""
    spec = bundle.specs.get(name)
    if spec is None:
        return make_registered(name, bundle)
    factory = _factories.get(spec.kind)
    if factory is None:
        raise InvalidInput(f"drafter {name!r}: no factory is registered for kind {spec.kind!r}")
    return factory(bundle, spec)


def kind_of(spec: DrafterSpec) -> str:
    """The family a preset's drafter is reported as."""
    return SPEC_KINDS.get(spec.kind, spec.kind)


def kind_by_name(name: str) -> str | None:
    """A drafter's family from its name: the presets' drafters, then the registered ones (None: unknown,
    e.g. a name in a replayed run file from elsewhere)."""
    for p in PRESETS.values():
        for s in p.drafters:
            if s.name == name:
                return kind_of(s)
    reg = _registry.get(name)
    return reg.kind if reg is not None else None


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
    d = _registry[name].make(bundle)
    if isinstance(getattr(d, "name", None), str) and d.name != name:
        d.name = name  # events and stats are keyed by the registered name (Bundle.make_drafters checks the type)
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
