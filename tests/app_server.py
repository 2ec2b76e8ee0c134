"""The app served in-process for the API and browser tests (one server per test process).

Import the `app_url` fixture into a test module: `from tests.app_server import app_url  # noqa: F401`.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_lock = threading.Lock()
_server: dict[str, object] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve() -> str:
    """Start the app once (offline preset, loaded before the first request) and return its URL."""
    with _lock:
        if "url" not in _server:
            import app
            from metasd.ui.bundles import get_bundle

            get_bundle("offline")
            demo = app.build_demo()
            port = free_port()
            app.launch(demo, host="127.0.0.1", port=port, prevent_thread_lock=True, quiet=True)
            _server.update(url=f"http://127.0.0.1:{port}/", demo=demo)
            atexit.register(demo.close)
        return str(_server["url"])


@pytest.fixture(scope="session")
def app_url() -> str:
    return serve()
