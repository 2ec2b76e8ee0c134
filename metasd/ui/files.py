"""The app's own files: a private temp dir (mode 0700) for the download buttons' run logs and results,
kept bounded over a long session, and uploads read only up to their size limit."""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import gradio as gr

from metasd.core.runfile import run_document
from metasd.core.validation import InvalidInput
from metasd.models.presets import PRESETS
from metasd.ui import viz
from metasd.ui.session import RunRecord

TMP_MAX_AGE_S = 3600  # run logs older than this are deleted (gradio serves its own copy meanwhile)
TMP_MAX_FILES = 400


class AppFiles:
    """A server's own temp dir (mode 0700, removed at exit): the download buttons' run logs and results, Compare's
    run files for Replay; bounded over a long session. The only folder the server serves files from."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="metasd-app-"))
        atexit.register(shutil.rmtree, self.root, True)

    def stem(self, *parts: Any) -> Path:
        """`metasd-<part>-...-<timestamp>` inside a fresh directory with a random name: files are named by what
        they hold, and nobody can guess where they are (a run log holds the user's prompt)."""
        folder = self.root / uuid.uuid4().hex
        folder.mkdir(mode=0o700)
        names = [re.sub(r"[^A-Za-z0-9_-]+", "-", str(x)).strip("-") or "run" for x in parts]
        return folder / "-".join(["metasd", *names, time.strftime("%Y%m%d-%H%M%S")])

    def prune(self) -> None:
        """Keep the temp dir bounded over a long session: drop old entries (a run's folder of downloads, or a
        file), then the oldest beyond the cap."""
        try:
            entries = sorted((e.stat().st_mtime, e) for e in self.root.iterdir())
        except OSError:
            return
        now = time.time()
        for i, (mtime, e) in enumerate(entries):
            if now - mtime > TMP_MAX_AGE_S or i < len(entries) - TMP_MAX_FILES:
                if e.is_dir():
                    shutil.rmtree(e, ignore_errors=True)
                else:
                    e.unlink(missing_ok=True)


_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(x: Any) -> Any:
    """A cell a spreadsheet shows as text: visitor text starting like a formula (=, +, -, @) gets a leading quote
    (CSV injection); numbers stay numbers."""
    return "'" + x if isinstance(x, str) and x.startswith(_FORMULA) else x


def safe_csv(df: Any, path: Path) -> None:
    """df as CSV at `path`, every text cell passed through csv_cell."""
    df.map(csv_cell).to_csv(path, index=False)


def write_logs(files: AppFiles, record: RunRecord | None):
    """The per-round log as CSV and JSON, in the server's own temp dir, for the download buttons."""
    if not record or not record.rounds:
        return gr.update(value=None, interactive=False), gr.update(value=None, interactive=False)
    files.prune()
    stem = files.stem(record.preset, record.settings.get("policy", "run"))
    safe_csv(viz.rounds_frame(record.rounds), stem.with_suffix(".csv"))
    obj = run_document(record.prompt, record.rounds, record.summary, preset=record.preset,
                       target=PRESETS[record.preset].target if record.preset in PRESETS else "",
                       drafters=record.drafters or list(record.rounds[0].probabilities),
                       colors=viz.drafter_colors(record.all_drafters or list(record.rounds[0].probabilities)),
                       settings=record.settings, lanes=record.lanes)
    stem.with_suffix(".json").write_text(json.dumps(obj, ensure_ascii=False, indent=1), encoding="utf-8")
    return (gr.update(value=str(stem.with_suffix(".csv")), interactive=True),
            gr.update(value=str(stem.with_suffix(".json")), interactive=True))


def read_upload(upload: Any, limit: int, what: str, missing: str) -> tuple[bytes, str]:
    """The bytes and file name of a file gradio stored for this request (it accepts only its own uploads),
    size-checked before reading. `what` names the file in the size message; `missing` says what to upload."""
    path = getattr(upload, "path", None) or getattr(upload, "name", None) or upload
    if not path or not isinstance(path, str | os.PathLike):
        raise InvalidInput(missing)
    try:
        size = os.stat(path).st_size
        if size > limit:
            raise InvalidInput(f"the {what} has {size:,} bytes; the limit is {limit:,}")
        with open(path, "rb") as f:
            return f.read(limit + 1), Path(path).name
    except OSError:
        raise InvalidInput("the uploaded file could not be read; upload it again") from None
