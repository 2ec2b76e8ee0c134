"""The app started exactly as users and hosts start it: a separate process, a scrubbed environment.

The in-process server of tests/app_server.py never runs `app.py`'s own start-up (argument parsing,
`server_address()`, what happens after "Running on local URL"), and the test process's environment
can hide a fault (a GRADIO_* variable, PYTHONPATH). These tests run the real command lines with an
environment built from scratch and keep each process in its own process group, killed in a finally.

`started()` and `scrubbed_env()` are shared with tests/test_readme.py.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import yaml

from tests.app_server import free_port

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 120
PROMPT = "Translate to French: good morning"

# No proxy for our own requests, whatever the test process's environment says.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def scrubbed_env(**extra: str) -> dict[str, str]:
    """An environment built from scratch, as a user's shell would give it: no GRADIO_* variables, no
    PYTHONPATH. One torch/OpenMP thread keeps the server light on a 2-core machine; unbuffered output
    so that a dead or killed process's captured output is complete."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME") or str(Path.home()),  # the converted model lives in ~/.cache/metasd
        "LANG": "C.UTF-8",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    env.update(extra)
    return env


def http_status(url: str, timeout: float = 5.0) -> int | None:
    """The HTTP status of GET url, or None when nothing answers."""
    try:
        with _opener.open(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, urllib.error.URLError):
        return None


@dataclass
class Served:
    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def listen_addresses(self) -> set[str]:
        """The addresses the process (or a child: `make run`, `sh -c`) listens on at this port."""
        procs = [psutil.Process(self.proc.pid)]
        procs += procs[0].children(recursive=True)
        found: set[str] = set()
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                for c in p.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN and c.laddr.port == self.port:
                        found.add(c.laddr.ip)
        return found


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the whole process group, then SIGKILL what is left; always reaps the leader."""
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break  # nothing left in the group
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)
        if proc.poll() is not None and not _group_alive(proc.pid):
            break
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_ready(served: Served, timeout_s: float = READY_TIMEOUT_S) -> float:
    """Poll GET / until it answers 200; fails with the process's output if it dies or never answers.
    Returns the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        rc = served.proc.poll()
        if rc is not None:
            pytest.fail(f"the app exited with status {rc} before answering on {served.url}:\n{served.output()}")
        if http_status(served.url, timeout=2) == 200:
            return time.monotonic() - t0
        time.sleep(0.5)
    pytest.fail(f"the app did not answer 200 on {served.url} within {timeout_s} s:\n{served.output()}")


@contextlib.contextmanager
def started(cmd: str | Sequence[str], env: dict[str, str], port: int, *,
            timeout_s: float = READY_TIMEOUT_S) -> Iterator[Served]:
    """Start `cmd` in the repository root (a string runs through `sh -c`, as a host runs a command
    line), wait until GET / answers 200 on 127.0.0.1:port, yield; the process group is always killed."""
    argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    fd, name = tempfile.mkstemp(prefix="metasd-start-", suffix=".log")
    log = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        served = Served(proc, port, log)
        try:
            wait_ready(served, timeout_s)
            yield served
        finally:
            _kill_group(proc)
    finally:
        log.unlink(missing_ok=True)


def non_loopback_ipv4() -> list[str]:
    """This machine's IPv4 addresses other than 127.x (none in a loopback-only sandbox)."""
    ips = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}
    with contextlib.suppress(OSError):
        ips.add(socket.gethostbyname(socket.gethostname()))
    return sorted(ip for ip in ips if not ip.startswith("127."))


def assert_binds_all_interfaces(served: Served) -> None:
    addrs = served.listen_addresses()
    assert addrs & {"0.0.0.0", "::"}, (f"a hosted start must listen on all interfaces; port {served.port} is bound to "
                                       f"{sorted(addrs) or 'nothing this process owns'}:\n{served.output()}")
    for ip in non_loopback_ipv4():  # and it really answers there
        assert http_status(f"http://{ip}:{served.port}/") == 200, f"no answer on {ip}:{served.port}"


# ----------------------------------------------------------------------------------------------


@pytest.mark.offline_model
@pytest.mark.timeout(300)
def test_python_app_py_serves_stays_up_and_streams():
    """`python app.py --port N`: answers, is still up 20 s later (the analytics crash came right after
    "Running on local URL"), streams /generate through gradio_client, and exits on SIGTERM."""
    from gradio_client import Client

    port = free_port()
    with started([sys.executable, "app.py", "--port", str(port)], scrubbed_env(), port) as served:
        assert served.listen_addresses() == {"127.0.0.1"}, "a local start must not be reachable from outside"
        time.sleep(20)
        assert served.proc.poll() is None, f"the app died after starting:\n{served.output()}"
        assert http_status(served.url) == 200, f"/ stopped answering:\n{served.output()}"

        client = Client(served.url, verbose=False)
        job = client.submit(PROMPT, max_new_tokens=16, api_name="/generate")
        updates = list(job)
        assert updates, "no update streamed from /generate"
        final_html = updates[-1][0]
        assert 'class="tok' in final_html, f"the final token view has no token spans: {final_html[:500]!r}"
        client.close()

        assert served.proc.poll() is None, f"the app died while serving:\n{served.output()}"
        out = served.output()
        assert "Running on local URL" in out, out
        assert "Traceback" not in out, out
        # Made at start-up, once the model was ready: not on the first page load, beside a class's first Run.
        assert "playground's opening simulation ready" in out, out

        served.proc.terminate()
        try:
            served.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the app did not exit within 30 s of SIGTERM:\n{served.output()}")


def assert_hosted(served: Served) -> None:
    """A hosted start: answers, listens on all interfaces, keeps running."""
    assert http_status(served.url) == 200
    assert_binds_all_interfaces(served)
    assert served.proc.poll() is None, served.output()


@pytest.mark.offline_model
@pytest.mark.timeout(240)
def test_hosted_start_binds_all_interfaces_on_port():
    """Started as a Hugging Face Space starts it: `python app.py` with $SPACE_ID, $PORT and SYSTEM=spaces
    (how Gradio recognises a Space) set, no flags, and the `spaces` package importable, so app.py wraps its
    handlers in `spaces.GPU` (effect-free off ZeroGPU). It serves $PORT on 0.0.0.0 and a generation streams
    through gradio_client."""
    from gradio_client import Client

    check = subprocess.run([sys.executable, "-c", "import spaces"], capture_output=True, text=True, timeout=120,
                           env=scrubbed_env())
    assert check.returncode == 0, f"the spaces package must be installed (requirements-dev.txt):\n{check.stderr}"
    port = free_port()
    env = scrubbed_env(SPACE_ID="user/metasd-test", SYSTEM="spaces", PORT=str(port))
    with started([sys.executable, "app.py"], env, port) as served:
        assert_hosted(served)
        client = Client(served.url, verbose=False)
        out = client.predict(PROMPT, max_new_tokens=8, api_name="/generate")
        client.close()
        assert 'class="tok' in out[0], out[0][-2000:]
        assert served.proc.poll() is None, served.output()
        assert not tracebacks(served.output()), served.output()


def tracebacks(output: str) -> list[int]:
    """Line numbers of tracebacks in a server's output, leaving out those Python prints for exceptions it
    ignores in finalizers ("Exception ignored in: ..."): with SYSTEM=spaces Gradio starts the `spaces`
    package's reload server, whose start-up leaves a few such event-loop finalizer messages; nothing fails."""
    lines = output.splitlines()
    return [i for i, line in enumerate(lines)
            if line.startswith("Traceback (most recent call last)")
            and not (i > 0 and lines[i - 1].startswith("Exception ignored in"))]


@pytest.mark.offline_model
@pytest.mark.timeout(200)
def test_spacefile_run_command_serves():
    """The Spacefile micro's `run:` command line, run as the host would: repository root, $PORT set."""
    spec = yaml.safe_load((ROOT / "Spacefile").read_text(encoding="utf-8"))
    micros = spec["micros"]
    assert len(micros) == 1, micros
    run = micros[0]["run"]
    assert isinstance(run, str) and run.strip(), run
    program = shlex.split(run)[0]
    assert (ROOT / program).exists() or program.startswith("python"), f"run: names {program!r}, which is not here"
    for path in micros[0].get("include", []):  # what the micro ships must exist
        assert (ROOT / path).exists(), f"Spacefile include {path!r} does not exist"

    port = free_port()
    with started(run, scrubbed_env(PORT=str(port)), port) as served:
        assert_hosted(served)


@pytest.mark.offline_model
@pytest.mark.timeout(200)
def test_operator_plugins_join_the_page():
    """METASD_PLUGINS, set by whoever starts the server: the plugin's drafter is offered and runs."""
    from gradio_client import Client

    port = free_port()
    env = scrubbed_env(METASD_PLUGINS="tests.plugins.echo_drafter")
    with started([sys.executable, "app.py", "--port", str(port)], env, port) as served:
        client = Client(served.url, verbose=False)
        out = client.predict("Count: 1, 1, 1, 1, 1,", drafters=["prompt-lookup", "echo-last"], policy="single:echo-last",
                             max_new_tokens=12, api_name="/generate")
        assert 'data-drafter="echo-last"' in out[0], out[0][-2000:]  # in the legend, with a colour of its own
        assert "Traceback" not in served.output()
    # A plugin that cannot be imported stops the start with a message naming it, instead of serving without it.
    p = subprocess.run([sys.executable, "app.py", "--port", str(free_port())], cwd=ROOT, capture_output=True, text=True,
                       env=scrubbed_env(METASD_PLUGINS="no_such_plugin"), timeout=120)
    assert p.returncode != 0 and "could not import 'no_such_plugin'" in p.stderr, p.stderr[-2000:]
