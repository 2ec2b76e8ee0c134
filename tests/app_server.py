"""The app served in-process for the API and browser tests (one server per test process).

Import the `app_url` fixture into a test module: `from tests.app_server import app_url  # noqa: F401`. Tests that
call the handlers directly use the same Server (`page_server()`): its loaded models, its stops, its line.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_lock = threading.RLock()
_server: dict[str, object] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def page_server():
    """This test process's one metasd.ui.server.Server, made on first use."""
    with _lock:
        if "server" not in _server:
            from metasd.ui.server import Server

            _server["server"] = Server()
        return _server["server"]


def serve() -> str:
    """Start the app once (offline preset, loaded before the first request) and return its URL."""
    with _lock:
        if "url" not in _server:
            import app

            server = page_server()
            server.presets.get("offline")
            demo = app.build_demo(server)
            port = free_port()
            app.launch(server, demo, host="127.0.0.1", port=port, prevent_thread_lock=True, quiet=True)
            _server.update(url=f"http://127.0.0.1:{port}/", demo=demo)
            atexit.register(demo.close)
        return str(_server["url"])


@pytest.fixture(scope="session")
def app_url() -> str:
    return serve()
