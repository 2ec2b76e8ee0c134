"""One colour and one underline per drafter, the same in every view.

A drafter's colour is a function of its name: the drafters of the presets (every preset, offline's
first) hold fixed slots of `PALETTE`, so prompt lookup is the same blue on the offline page and on a
hub preset, in Generate, Compare, Replay, run files, the gallery and the CLI. A drafter no preset
names (a plugin, a test's drafter, a run file from elsewhere) takes a free slot from a hash of its
name, skipping the slots of the other drafters of its view (`universe`: the bundle's or run's whole
list, so that a view showing a few of them colours them as the full view does).

Colour is never the only channel: each slot also has its own underline style, and names are written
beside colours wherever there is room.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Iterable, Mapping, Sequence

# Okabe-Ito's colour-blind-safe eight (black and yellow left out: black reads as text, yellow is
# invisible as an underline), darkened where too light, then Paul Tol's darker "muted" colours.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#9E7C00", "#56B4E9", "#E69F00", "#332288", "#882255",
           "#117733", "#7A5230", "#AA4499", "#44AA99", "#999933", "#661100", "#6699CC")
# Ten looks (CSS has five styles; thickness and offset make the rest), by slot.
UNDERLINES = ("solid", "double", "dotted", "dashed", "wavy", "heavy", "heavy-dashed", "heavy-wavy", "far",
              "far-dotted")
TARGET_COLOR = "#6B7280"  # the target's own tokens and plain steps


@functools.cache
def canonical_names() -> tuple[str, ...]:
    """Every preset's drafters, offline's first, each once: the names that own a palette slot."""
    from metasd.models.presets import PRESETS

    names: dict[str, None] = {}
    for key in sorted(PRESETS, key=lambda k: k != "offline"):
        for d in PRESETS[key].drafters:
            names.setdefault(d.name, None)
    return tuple(names)


def drafter_colors(names: Sequence[str], universe: Iterable[str] = ()) -> dict[str, str]:
    """The colour of each of `names`, in their order; `universe`: every drafter the view could show."""
    canon = {n: i for i, n in enumerate(canonical_names()) if i < len(PALETTE)}
    everyone = list(dict.fromkeys([*universe, *names]))
    out: dict[str, str] = {n: PALETTE[canon[n]] for n in everyone if n in canon}
    used = set(out.values())
    # Names no preset owns, each from its own hash: stable whichever subset a view shows.
    for n in sorted((n for n in everyone if n not in canon), key=lambda n: (zlib.crc32(n.encode()), n)):
        start = zlib.crc32(n.encode()) % len(PALETTE)
        free = [PALETTE[(start + k) % len(PALETTE)] for k in range(len(PALETTE))]
        c = next((c for c in free if c not in used), PALETTE[start])  # more drafters than colours: underlines differ
        out[n] = c
        used.add(c)
    return {n: out[n] for n in names}


def underline_at(slot: int) -> str:
    """The underline of a palette slot. Slots past the tenth shift by five, so the hub presets' own
    drafters (slots 10-12) do not repeat the looks of prompt lookup and token recycling (0, 1)."""
    return UNDERLINES[(slot + 5 * (slot // len(UNDERLINES))) % len(UNDERLINES)]


def underlines(colors: Mapping[str, str]) -> dict[str, str]:
    """Every drafter's second channel besides colour: an underline style, by its colour's palette slot (by its
    place in `colors` for a colour from outside the palette). Views with many drafters call this once."""
    slot = {c: i for i, c in enumerate(PALETTE)}
    return {n: underline_at(slot.get(c, i)) for i, (n, c) in enumerate(colors.items())}


def underline_of(colors: Mapping[str, str], name: str) -> str:
    """One drafter's underline ("none" for a name the view does not colour)."""
    return underlines(colors).get(name, "none")
