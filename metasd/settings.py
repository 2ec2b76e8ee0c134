"""Every `METASD_*` setting in one place: its type, its default, what it changes and when to change it.

The operator's environment is read here and only here (`value`), each value parsed and checked: a bad one is an
error naming the setting and what it takes, raised when the server or a command starts (`check`), never a
traceback from deep inside. `python -m metasd config` prints every setting with its effective value and where it
came from; the server's start-up log prints the same (`describe`). docs/DESIGN.md §11 is the table, kept equal to
this registry by tests/test_settings.py.

Some defaults depend on the machine (a GPU, the cores, a hosted start): `Machine` says which, computed once.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class SettingError(ValueError):
    """A setting's value that cannot be used: the message names the setting, the value and what it takes."""


class Machine:
    """What the machine-dependent defaults read: a GPU (torch is imported only when that is asked), the cores, and
    whether a host serves the page (SPACE_ID or PORT set)."""

    cores = os.cpu_count() or 2

    @functools.cached_property
    def cuda(self) -> bool:
        import torch  # only here: reading a setting that does not depend on a GPU never imports torch

        return torch.cuda.is_available()

    @property
    def hosted(self) -> bool:
        return bool(os.environ.get("SPACE_ID") or os.environ.get("PORT"))

    @property
    def browser_beside(self) -> bool:
        """A local start on a small CPU machine: the browser most likely draws on the engine's own cores, and
        every frame it draws slows the run it shows (docs/BENCHMARKS.md, *The page's own cost*)."""
        return not self.hosted and self.cores <= 4 and not self.cuda


@functools.cache
def machine() -> Machine:
    return Machine()


@dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[str], Any]  # raises ValueError with what it takes
    default: Callable[[Machine], Any]
    default_text: str  # the default as the docs give it
    what: str  # what it changes
    when: str  # when to change it


def _int(lo: int, hi: int = 10**9) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text.strip())
        except ValueError:
            raise ValueError(f"a whole number from {lo} to {hi}") from None
        if not lo <= n <= hi:
            raise ValueError(f"a whole number from {lo} to {hi}")
        return n
    return parse


def _float(lo: float, hi: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            x = float(text.strip())
        except ValueError:
            raise ValueError(f"a number from {lo:g} to {hi:g}") from None
        if not lo <= x <= hi:  # NaN fails this too
            raise ValueError(f"a number from {lo:g} to {hi:g}")
        return x
    return parse


def _flag(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise ValueError("1 or 0 (also true/false, yes/no, on/off)")


def _text(text: str) -> str:
    return text.strip()


SETTINGS: tuple[Setting, ...] = (
    Setting("METASD_PRESET", _text, lambda m: "", "the offline preset",
            "the preset the page opens with (and the one a GPU server's shared rounds hold)",
            "a GPU Space serving a hub preset"),
    Setting("METASD_PLUGINS", _text, lambda m: "", "none",
            "comma-separated modules imported at start-up that register drafters (register_drafter)",
            "to offer your own drafter; never named by the page"),
    Setting("METASD_CACHE", _text, lambda m: "", "$XDG_CACHE_HOME/metasd or ~/.cache/metasd",
            "where the offline model's converted weights are kept",
            "a read-only home, or a shared cache"),
    Setting("METASD_PACKED_LINEAR", _flag, lambda m: True, "1",
            "CPU float32 linear layers on oneDNN-packed weights (verifying several ids costs about one step)",
            "0 to compare against torch's default kernels"),
    Setting("METASD_CONCURRENCY", _int(1, 64), lambda m: 2 if m.cuda else 1, "2 on a GPU, else 1",
            "generations that hold the model at once outside the shared rounds",
            "a large GPU"),
    Setting("METASD_MAX_WAITING", _int(0, 10_000), lambda m: 48, "48",
            "runs that may wait in the app's line (each told its place); one more is told the class is full",
            "a larger class"),
    Setting("METASD_QUEUE_SIZE", _int(1, 100_000), lambda m: 64, "64",
            "gradio's own queue, for events that found no handler",
            "rarely"),
    Setting("METASD_TORCH_THREADS", _int(0, 1024), lambda m: 0, "0 (hosted: every core's share; local: one fewer "
            "than the cores' share, for the browser)", "torch threads of a generation",
            "to measure, or a machine with many cores"),
    Setting("METASD_BATCH", _flag, lambda m: m.hosted and not m.cuda, "1 where hosted on a CPU, else 0",
            "shared rounds: one target pass verifies every running request's drafts",
            "1 to try them locally or on a GPU (untried there)"),
    Setting("METASD_PASS_BLOCK", _int(0, 4096), lambda m: 256 if m.cuda else 0, "256 on a GPU, else 0 (chosen at "
            "start-up: none where rows are invariant, else the smallest block that is)",
            "rows per row-wise call of every shared pass (batch-invariant blocks)",
            "to force blocks on a CPU, or another size on a GPU"),
    Setting("METASD_ROUNDS_PROCESS", _int(0, 256), lambda m: m.cores, "one per core (0 on a GPU)",
            "processes the shared rounds run in (0: in the server's process)",
            "to measure; more than the cores gains nothing"),
    Setting("METASD_ROUNDS_NICE", _int(-20, 19), lambda m: 10, "10",
            "the rounds' processes' niceness below the server's", "0 to run them at the server's priority"),
    Setting("METASD_CROWD_THREADS", _int(0, 1024), lambda m: 1, "1",
            "torch threads of each rounds process while more than one run is served (0: as for a run alone)",
            "to measure"),
    Setting("METASD_BATCH_DRAFTS", _flag, lambda m: True, "1",
            "every running request's model-drafter forward on one drafter in one pass", "0 to compare"),
    Setting("METASD_BATCH_SLOWDOWN", _float(1.0, 1000.0), lambda m: 12.0, "12",
            "a shared pass may cost at most this many solo passes (bounds the requests per pass)",
            "lower for faster streams in a smaller class"),
    Setting("METASD_MAX_BATCH", _int(1, 1024), lambda m: 32, "32", "the most requests in one shared pass",
            "a larger class on a larger machine"),
    Setting("METASD_KV_BUDGET_MB", _int(1, 10**7), lambda m: 4096, "4096",
            "memory for the shared requests' KV caches (bounds the requests per pass)", "a smaller machine"),
    Setting("METASD_PREFIX_MB", _int(0, 10**7), lambda m: 256, "256",
            "prompt passes kept for the next run of the same prompt (a class running the examples reads each once)",
            "0 to turn off"),
    Setting("METASD_MAX_BUNDLES", _int(1, 16), lambda m: 2 if m.cuda else 1, "2 on a GPU, else 1",
            "presets kept loaded at once", "a GPU with room for more"),
    Setting("METASD_FRAME_FPS", _float(0.5, 120.0), lambda m: 3.0 if m.browser_beside else 8.0,
            "3 on a local CPU start with up to 4 cores, else 8",
            "token-view frames a second of one stream at most", "a slow client; higher for smoother streams"),
    Setting("METASD_PLOT_INTERVAL", _float(0.0, 60.0), lambda m: 2.0 if m.browser_beside else 1.0,
            "2.0 on a local CPU start with up to 4 cores, else 1.0",
            "seconds between redraws of the figures and the table while a run streams",
            "higher for slow browsers"),
    Setting("METASD_SERVER_FPS", _float(1.0, 10_000.0), lambda m: 32.0, "32",
            "frames a second for the whole server, shared by its open streams", "a faster server"),
)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def value(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The setting's effective value: the environment's, parsed and checked (SettingError if it cannot be used),
    or the default on this machine. An empty value counts as unset."""
    s = BY_NAME[name]
    raw = (os.environ if environ is None else environ).get(name, "")
    if not raw.strip():
        return s.default(machine())
    try:
        return s.parse(raw)
    except ValueError as e:
        raise SettingError(f"{name}={raw!r} cannot be used: it takes {e}") from None


def check(environ: Mapping[str, str] | None = None) -> None:
    """Every setting the environment sets, parsed at once (a server or a command starting): the first bad one is a
    SettingError. Defaults need no check (nor the GPU probe some of them make)."""
    env = os.environ if environ is None else environ
    for s in SETTINGS:
        if env.get(s.name, "").strip():
            value(s.name, env)


def effective(environ: Mapping[str, str] | None = None) -> list[tuple[str, Any, str]]:
    """(name, effective value, where it came from: 'environment' or 'default') for every setting."""
    env = os.environ if environ is None else environ
    return [(s.name, value(s.name, env), "environment" if env.get(s.name, "").strip() else "default")
            for s in SETTINGS]


def describe(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per setting, for `python -m metasd config` and the server's start-up log."""
    rows = effective(environ)
    width = max(len(n) for n, _, _ in rows)
    return [f"{n:<{width}}  {_shown(v, BY_NAME[n]):<12} ({src})" for n, v, src in rows]


def _shown(v: Any, s: Setting) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if v == "":
        return f"unset: {s.default_text}"
    return f"{v:g}" if isinstance(v, float) else str(v)


def docs_table() -> str:
    """The settings as a Markdown table: name, default, what it changes, when to change it."""
    lines = ["| setting | default | what it changes | when to change it |", "| --- | --- | --- | --- |"]
    lines += [f"| `{s.name}` | {s.default_text} | {s.what} | {s.when} |" for s in SETTINGS]
    return "\n".join(lines)
