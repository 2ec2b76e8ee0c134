"""MetaSD Studio: the live visualizer. Only the Gradio layer over the engine's event stream.

This file composes the page from one builder per tab (metasd/ui/tabs.py), gives it its theme, CSS and
keyboard script, and serves it. Handlers live in metasd/ui/ (its docstring maps it) and what they share in one
metasd.ui.server.Server that main() makes and build_demo binds into them; every view is a pure function in
metasd/ui/viz.py (events -> HTML, figures, tables). Nothing is re-exported here: tests and scripts import
handlers and settings from the metasd/ui/ module that defines them, and make a Server of their own.

    python app.py            # http://127.0.0.1:7860 (0.0.0.0:$PORT where the host sets PORT / SPACE_ID)
"""

import argparse
import importlib.util
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

# The app never phones home: gradio reads this at import time (Blocks also gets analytics_enabled=False).
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"

import gradio as gr  # noqa: E402
import torch  # noqa: E402

from metasd import settings  # noqa: E402

try:  # every METASD_* setting checked before any module reads one: a bad value is one line, not a traceback
    settings.check()
except settings.SettingError as e:
    sys.exit(f"error: {e}")

from metasd.core.validation import UPLOAD_MAX_BYTES  # noqa: E402
from metasd.decoding.loading import cache_root  # noqa: E402
from metasd.drafting.registry import load_plugins  # noqa: E402
from metasd.ui.bundles import WAIT_IN_REQUESTS, default_preset  # noqa: E402
from metasd.ui.compare import cancel_compare  # noqa: E402
from metasd.ui.config import (  # noqa: E402
    ASSETS,
    BATCH,
    GEN_CONCURRENCY,
    GENERATE_HANDLERS,
    HAS_CUDA,
    HOSTED,
    MAX_WAITING,
    QUEUE_SIZE,
    ROOT,
    TORCH_THREADS,
)
from metasd.ui.errors import name_input_errors  # noqa: E402
from metasd.ui.files import TMP_MAX_AGE_S  # noqa: E402
from metasd.ui.generate import start_rounds, stop_generation  # noqa: E402
from metasd.ui.playground import playground_default  # noqa: E402
from metasd.ui.replay import stop_replay  # noqa: E402
from metasd.ui.server import Server  # noqa: E402
from metasd.ui.session import gradio_unread, quiet_queue  # noqa: E402
from metasd.ui.tabs import build_compare_tab, build_generate_tab, build_playground_tab, build_replay_tab  # noqa: E402
from metasd.ui.text import HEAD, HERO  # noqa: E402


def build_demo(server: Server) -> gr.Blocks:
    """The page: a header, then the Generate, Compare, Replay and Bandit playground tabs, every handler bound to
    `server` (metasd/ui/server.py: the models, the line, the stops, the temp dir)."""
    # Operator plugins (metasd.drafting.registry): modules named by whoever runs the server, never by the page;
    # loaded here, not on import. Their drafters join every preset's list, each with a colour of its own.
    load_plugins(settings.value("METASD_PLUGINS"))
    preset0 = default_preset()
    drafters0, _ = server.presets.drafters(preset0)  # drawn while the models may still load
    # delete_cache: gradio's copies of served files (run logs hold prompts) go after an hour.
    # analytics_enabled=False in code: the app never phones home, whatever the host's environment says.
    with gr.Blocks(title="MetaSD Studio", delete_cache=(TMP_MAX_AGE_S, TMP_MAX_AGE_S), analytics_enabled=False) as demo:
        baselines = gr.State({})
        record = gr.State(None)
        gr.HTML(HERO.format(pill="GPU" if HAS_CUDA else "CPU \u00b7 offline"))
        with gr.Tabs(elem_id="tabs") as tabs:
            build_generate_tab(server, preset0, drafters0, baselines, record, GENERATE_HANDLERS)
            link = build_compare_tab(server, preset0)
            build_replay_tab(server, demo, tabs, drafters0, link)
            build_playground_tab(server, demo)
        # A closed tab ends its generation (gradio also drops the run when the page's stream closes).
        demo.unload(server.bind(stop_generation))
        demo.unload(server.bind(cancel_compare))
        demo.unload(server.bind(stop_replay))
    name_input_errors(demo)  # a value gradio cannot take gets a message naming its field, not a bare "Error"
    return demo


# Fonts as gradio Font objects, never plain strings: launch() compares the theme with the built-in
# ones and a plain string breaks that comparison. System fonts only: the page loads nothing from outside.
THEME = gr.themes.Soft(primary_hue="indigo", neutral_hue="slate",
                       font=[gr.themes.Font(f) for f in ("Inter", "ui-sans-serif", "system-ui", "sans-serif")],
                       font_mono=[gr.themes.Font(f) for f in ("ui-monospace", "JetBrains Mono", "Menlo", "monospace")]).set(
    # WCAG AA contrast (4.5:1): the Soft theme's indigo-500 labels, buttons and tabs and its slate-400 hints
    # fall short (axe-core counts 8+ findings on a bare page); one or two shades darker pass.
    block_label_text_color="*primary_700", block_title_text_color="*primary_700", color_accent="*primary_600",
    body_text_color_subdued="*neutral_600", input_placeholder_color="*neutral_500",
    button_primary_background_fill="*primary_600", button_primary_background_fill_hover="*primary_700",
    button_primary_border_color="*primary_600", button_primary_border_color_hover="*primary_700",
    checkbox_label_background_fill_selected="*primary_600", slider_color="*primary_600",
)
CSS = (ASSETS / "style.css").read_text(encoding="utf-8")


def server_address() -> tuple[str, int]:
    """127.0.0.1 by default; 0.0.0.0 where the host says so ($GRADIO_SERVER_NAME, $PORT, $SPACE_ID)."""
    hosted = bool(os.environ.get("PORT") or os.environ.get("SPACE_ID"))
    host = os.environ.get("GRADIO_SERVER_NAME") or ("0.0.0.0" if hosted else "127.0.0.1")
    port = int(os.environ.get("PORT") or os.environ.get("GRADIO_SERVER_PORT") or 7860)
    return host, port


def no_missing_imports(*names: str) -> None:
    """Mark absent optional modules as absent once. gradio tries `import matplotlib` twice around every event
    it processes; without matplotlib each try searches sys.path again, on the event loop, in the interpreter the
    engine shares (with 32 streams, a tenth of the event loop's time under the interpreter lock)."""
    for name in names:
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            sys.modules[name] = None  # `import name` now fails at once, as it would after the search


def launch(server: Server, demo: gr.Blocks | None = None, host: str | None = None, port: int | None = None,
           **kwargs: Any):
    """Queue (bounded) and serve the page (built for `server` where not given); returns what Blocks.launch
    returns."""
    demo = demo or build_demo(server)
    h, p = server_address()
    # Gradio's queue is bounded, but Generate's handlers all start at once and wait in the app's own line
    # (server.model), which tells each run its place, or that the class is full; the handlers' threads need room.
    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=GEN_CONCURRENCY)
    quiet_queue(demo)  # gradio's queue polls every 1 ms: ~10% of a core on an idle server
    server.streams.unread = gradio_unread(demo)  # a run whose stream nobody reads leaves the line within seconds
    no_missing_imports("matplotlib")
    kwargs.setdefault("max_threads", GENERATE_HANDLERS + 40)
    logging.getLogger("metasd.app").info(
        "serving: %d generation(s) at once on the model, up to %d waiting in line (then: the class is full); "
        "%d torch thread(s) per generation (%s)", GEN_CONCURRENCY, MAX_WAITING, TORCH_THREADS,
        "hosted: every core" if HOSTED else "local: a core left to the browser")
    kwargs.setdefault("share", False)  # no public share link unless the caller asks for one
    # Uploads: gradio's cap is the largest file any tab takes (a run file, RUN_MAX_BYTES); each handler then
    # checks its own cap (a prompt set: PROMPT_SET_MAX_BYTES) with a message of its own.
    # Files are served only from the app's temp dir (and gradio's own upload/cache dirs); the source
    # tree and the model cache are blocked outright, whatever else is configured.
    served = [server.files.root.resolve(), Path(gr.utils.get_upload_folder()).resolve()]
    blocked = [str(d.resolve()) for d in (ROOT, cache_root()) if not any(x.is_relative_to(d.resolve()) for x in served)]
    return demo.launch(server_name=host or h, server_port=port or p, theme=THEME, css=CSS, head=HEAD, footer_links=["api"],
                       allowed_paths=[str(server.files.root)], blocked_paths=blocked, max_file_size=UPLOAD_MAX_BYTES, **kwargs)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="MetaSD Studio: the live visualizer")
    ap.add_argument("--host", default=None, help="bind address (default 127.0.0.1, or 0.0.0.0 when hosted)")
    ap.add_argument("--port", type=int, default=None, help="port (default $PORT or 7860)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("metasd.app").info("settings (python -m metasd config; docs/DESIGN.md §11):\n  %s",
                                         "\n  ".join(settings.describe()))
    if not HAS_CUDA:
        # The main thread stays out of torch's thread pools: loading with one thread leaves no OpenMP team
        # behind it, and each generation's worker then gets its threads without contention
        # (metasd.serving.streaming.in_fresh_thread).
        torch.set_num_threads(1)
    load_plugins(settings.value("METASD_PLUGINS"))  # a plugin that fails stops the start before any model loads
    server = Server()
    if BATCH or HOSTED or not WAIT_IN_REQUESTS:
        # Load first: the shared rounds' processes fork from the loaded models before the server starts its threads;
        # a host shows its own page until the port answers; on a GPU a request does not wait for a load.
        bundle = server.presets.get(default_preset())
        if BATCH:
            logging.getLogger("metasd.app").info(start_rounds(server, bundle))
    else:
        # A local CPU start serves the page while the models load (on a machine's first start the offline target
        # is converted first): a Run pressed meanwhile waits for them, told what the load is doing.
        server.presets.start_loading(default_preset())
    _prepare_playground(server)
    launch(server, host=a.host, port=a.port)


def _prepare_playground(server: Server) -> None:
    """The playground's opening simulation, made before the page is served (0.5 s in this process) instead of on
    the first page load, beside a class's first Run (metasd/ui/playground.py, playground_default)."""
    log = logging.getLogger("metasd.app")
    try:
        t = time.perf_counter()
        playground_default(server)
        log.info("playground's opening simulation ready (%.1f s)", time.perf_counter() - t)
    except Exception as e:  # noqa: BLE001  (the first page load tries again; the log says why)
        log.warning("playground's opening simulation not made at start-up: %s", e)


if __name__ == "__main__":
    main()
