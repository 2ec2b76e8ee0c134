"""The shape of the code, read from the source: no import circles, a pure view module, short functions,
one registry of drafter kinds and one set of request defaults."""

from __future__ import annotations

import argparse
import ast
import inspect
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "metasd"
MAX_FUNCTION_LINES = 60

# Functions over MAX_FUNCTION_LINES, by "path:qualified name". Empty now: a function that grows past the limit
# fails below; an entry here that is no longer long fails too, so the list can only shrink.
LONG_FUNCTIONS: dict[str, int] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `path` imports anywhere: at its top, inside functions, under TYPE_CHECKING."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import; the package uses absolute ones"
            if node.module is None:
                continue
            for a in node.names:  # `from metasd.core import defaults` imports the module metasd.core.defaults
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in known else node.module)
    return {m for m in found if m in known}


@cache
def import_graph() -> dict[str, frozenset[str]]:
    known = modules()
    return {m: frozenset(imported(p, known) - {m}) for m, p in known.items()}


def find_cycle(graph: dict[str, frozenset[str]]) -> list[str] | None:
    """One import circle of `graph` (a list of modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def closure(graph: dict[str, frozenset[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return seen - {start}


def test_cycle_finder_finds_a_planted_circle():
    """The check below can fail: a circle planted in a copy of the real graph is found."""
    graph = dict(import_graph())
    graph["metasd.models.presets"] = graph["metasd.models.presets"] | {"metasd.decoding.loading"}
    cycle = find_cycle(graph)
    assert cycle is not None and "metasd.models.presets" in cycle and cycle[0] == cycle[-1], cycle


def test_the_import_graph_counts_imports_inside_functions(tmp_path):
    pkg = tmp_path / "metasd"
    pkg.mkdir()
    (pkg / "a.py").write_text("def f():\n    from metasd import b\n", encoding="utf-8")
    (pkg / "b.py").write_text("import metasd.a\n", encoding="utf-8")
    known = {"metasd.a": pkg / "a.py", "metasd.b": pkg / "b.py"}
    graph = {m: frozenset(imported(p, known) - {m}) for m, p in known.items()}
    assert find_cycle(graph) == ["metasd.a", "metasd.b", "metasd.a"]


def test_no_import_circles():
    graph = import_graph()
    assert len(graph) > 40 and all(graph[m] <= set(graph) for m in graph)
    cycle = find_cycle(graph)
    assert cycle is None, f"import circle: {' -> '.join(cycle)}"


# The packages, lowest first (docs/DESIGN.md §2): a module imports only from its own package and from packages of
# a lower layer; the three applications of layer 7 do not import one another.
LAYERS = {
    "metasd.paths": 0, "metasd.settings": 0,
    "metasd.bandits": 1,  # policies, priors, the playground's simulated arms: no models
    "metasd.core": 2,  # the vocabulary: settings, validation, sampling, events, run files, costs, pass messages
    "metasd.models": 3,  # presets, CPU linear packing, ZeroGPU durations
    "metasd.drafting": 4,  # the drafters, their registry and files
    "metasd.decoding": 5,  # loading a preset into a Bundle, the round loop, token trees, lanes, prompts
    "metasd.serving": 6,  # shared rounds, their processes, the engine in a worker with the waiting line
    "metasd.benchmark": 7, "metasd.training": 7, "metasd.ui": 7,
    "metasd.cli": 8,
    "metasd.__main__": 9, "metasd": 9,
}


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or module in LAYERS else module


def against_the_order(graph: dict[str, frozenset[str]]) -> list[str]:
    """Every import of `graph` that goes up the layers or sideways into another package of the same layer."""
    bad = []
    for m, deps in graph.items():
        a = package_of(m)
        for d in deps:
            b = package_of(d)
            if a != b and (LAYERS[b] > LAYERS[a] or (LAYERS[b] == LAYERS[a] and a != "metasd")):
                bad.append(f"{m} -> {d}")
    return sorted(bad)


def package_graph(graph: dict[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        out.setdefault(package_of(m), set()).update(package_of(d) for d in deps)
    return {p: frozenset(ds - {p}) for p, ds in out.items()}


def test_every_package_has_a_layer_and_imports_follow_the_order():
    graph = import_graph()
    assert {package_of(m) for m in graph} <= set(LAYERS), {package_of(m) for m in graph} - set(LAYERS)
    assert against_the_order(graph) == []
    assert find_cycle(package_graph(graph)) is None


def test_the_order_check_finds_an_import_up_the_layers():
    """The check above can fail: drafters importing the engine (the circle the packages once had) is reported."""
    graph = dict(import_graph())
    graph["metasd.drafting.drafters"] = graph["metasd.drafting.drafters"] | {"metasd.decoding.engine"}
    assert against_the_order(graph) == ["metasd.drafting.drafters -> metasd.decoding.engine"]
    assert find_cycle(package_graph(graph)) is not None


# What a module-level name of metasd/ui/ may not be made from: objects that hold state between requests.
STATEFUL_CALLS = {"Lock", "RLock", "Event", "Condition", "Semaphore", "OrderedDict", "defaultdict", "deque", "dict",
                  "set", "list", "mkdtemp", "Server", "Presets", "FairSlots", "SharedRounds", "FrameBudget",
                  "StopRegistry", "Streams", "Simulator", "Timings", "ParsedRuns", "Once", "AppFiles"}
MUTATORS = {"append", "extend", "insert", "update", "pop", "popitem", "clear", "setdefault", "add", "discard", "remove",
            "move_to_end"}


def _called_name(node: ast.AST) -> str:
    f = node.func if isinstance(node, ast.Call) else None
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def module_state(source: str) -> list[str]:
    """Where a module keeps state at module level: `global`, a name bound to a stateful object (STATEFUL_CALLS,
    or a dict/list/set a function of the module changes), a memoising decorator, or a function changing a
    module-level name (item or attribute assignment, a mutating method)."""
    tree = ast.parse(source)
    names = {t.id for n in tree.body if isinstance(n, ast.Assign | ast.AnnAssign)
             for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    found = [f"{n.lineno}: global" for n in ast.walk(tree) if isinstance(n, ast.Global)]
    for n in tree.body:
        value = n.value if isinstance(n, ast.Assign | ast.AnnAssign) else None
        for c in [c for c in ast.walk(value) if isinstance(c, ast.Call)] if value is not None else []:
            call = _called_name(c)
            filled = call in {"dict", "list", "set"} and (c.args or c.keywords)  # a constant built by a call
            if call in STATEFUL_CALLS and not filled:
                found.append(f"{n.lineno}: {call}() at module level")
        if isinstance(n, ast.FunctionDef):
            found += [f"{d.lineno}: @{ast.unparse(d)}" for d in n.decorator_list
                      if any(w in ast.unparse(d) for w in ("cache", "lru_cache"))]
    funcs = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)]
    for f in funcs:
        local = {a.arg for a in ast.walk(f.args) if isinstance(a, ast.arg)} if not isinstance(f, ast.Lambda) else set()
        for node in ast.walk(f):
            target = None
            if isinstance(node, ast.Assign | ast.AugAssign | ast.Delete):
                for t in (node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]):
                    if isinstance(t, ast.Subscript | ast.Attribute) and isinstance(t.value, ast.Name):
                        target = t.value.id
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS \
                    and isinstance(node.func.value, ast.Name):
                target = node.func.value.id
            if target in names and target not in local:
                found.append(f"{node.lineno}: {target} changed in a function")
    return found


def test_the_state_finder_finds_planted_state():
    """The check below can fail: each way of keeping state at module level is found, constants are not."""
    planted = ("import threading, functools\nLOCK = threading.Lock()\n_CACHE = {}\nNAMES = ['a']\nK = dict(a=3)\n"
               "def f(x):\n    _CACHE[x] = 1\n    NAMES.append(x)\n\n@functools.cache\ndef g():\n    return K\n"
               "def h(NAMES):\n    NAMES.append(1)\n    return K\n")
    assert module_state(planted) == ["2: Lock() at module level", "10: @functools.cache", "7: _CACHE changed in a function",
                                     "8: NAMES changed in a function"]


def test_the_page_keeps_its_state_in_a_server_object():
    """metasd/ui/ keeps no state in its modules (docs/DESIGN.md §2): what requests share (the models, the line, the
    stops, the caches, the temp dir) lives in the Server that app.build_demo makes and binds into the handlers, so
    a test or a script makes a fresh one and a reader finds every piece of it in metasd/ui/server.py."""
    found = {str(p.relative_to(ROOT)): module_state(p.read_text(encoding="utf-8"))
             for p in sorted((PACKAGE / "ui").glob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_view_module_sits_below_the_engine():
    """metasd/ui/viz.py is pure: nothing it imports, however indirectly, loads models, runs the engine or
    benchmarks."""
    below = closure(import_graph(), "metasd.ui.viz")
    heavy = {"metasd.decoding.engine", "metasd.decoding.loading", "metasd.decoding.catalog", "metasd.drafting.drafters",
             "metasd.benchmark.bench", "metasd.serving.streaming"}
    assert not below & heavy, sorted(below & heavy)
    assert "metasd.drafting.registry" in below  # its kind lookup


# ----------------------------------------------------------------------------------------------
# Function length


def long_functions() -> dict[str, int]:
    found: dict[str, int] = {}
    for path in [*sorted(PACKAGE.rglob("*.py")), ROOT / "app.py"]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        stack: list[tuple[ast.AST, str]] = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                name = f"{prefix}{child.name}" if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef
                                                              | ast.ClassDef) else prefix
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = child.end_lineno - child.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        found[f"{path.relative_to(ROOT)}:{name}"] = lines
                stack.append((child, f"{name}." if name != prefix else prefix))
    return found


def test_long_function_finder_measures_what_it_should(tmp_path, monkeypatch):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    code = f"class K:\n    def short(self):\n        pass\n\n    def long(self):\n{body.replace('    ', '        ')}\n"
    (tmp_path / "metasd").mkdir()
    (tmp_path / "metasd" / "m.py").write_text(code, encoding="utf-8")
    (tmp_path / "app.py").write_text("def f():\n    pass\n", encoding="utf-8")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path / "metasd")
    assert long_functions() == {"metasd/m.py:K.long": MAX_FUNCTION_LINES + 1}


def test_no_function_over_60_lines():
    found = long_functions()
    new = {k: v for k, v in found.items() if k not in LONG_FUNCTIONS}
    assert not new, f"functions over {MAX_FUNCTION_LINES} lines (split them): {new}"
    shrunk = sorted(set(LONG_FUNCTIONS) - set(found))
    assert not shrunk, f"no longer over {MAX_FUNCTION_LINES} lines, take them off LONG_FUNCTIONS: {shrunk}"


# ----------------------------------------------------------------------------------------------
# One registry, one set of defaults


def test_one_list_of_drafter_kinds():
    """Every preset's drafter kind has a factory in the one registry, and reports a family plugins can use."""
    import metasd.decoding.loading  # noqa: F401 (imports the modules that register the built-in kinds)
    from metasd.drafting import registry
    from metasd.models.presets import PRESETS

    kinds = {s.kind for p in PRESETS.values() for s in p.drafters}
    assert kinds <= set(registry.SPEC_KINDS), sorted(kinds - set(registry.SPEC_KINDS))
    assert set(registry._factories) == set(registry.SPEC_KINDS), sorted(set(registry.SPEC_KINDS) ^ set(registry._factories))
    assert set(registry.SPEC_KINDS.values()) == set(registry.KINDS)
    with pytest.raises(ValueError):
        registry.register_kind("no-such-kind", lambda bundle, spec: None)


def test_one_set_of_request_defaults():
    """The CLI (and its --help) and the page's API and policy box start from metasd.core.defaults."""
    from metasd.cli import _generate_args
    from metasd.core import defaults
    from metasd.ui.config import PAGE_POLICY
    from metasd.ui.generate import generate_view

    parser = argparse.ArgumentParser()
    _generate_args(parser.add_subparsers(dest="command"))
    cli = vars(parser.parse_args(["generate", "hi"]))
    api = {k: p.default for k, p in inspect.signature(generate_view).parameters.items()}
    for name in ("policy", "reward", "gamma", "max_new_tokens", "temperature", "top_p", "seed", "full_info", "cold"):
        value = getattr(defaults, name.upper())
        assert api[name] == value, (name, api[name], value)
        assert cli[name] == value, (name, cli[name], value)
    assert PAGE_POLICY == defaults.POLICY
    help_text = parser._subparsers._group_actions[0].choices["generate"].format_help()
    assert " ".join(defaults.describe().split()) in " ".join(help_text.split())


def test_commands_that_need_no_model_import_neither_torch_nor_transformers():
    """`--help`, a refused `generate` and `replay` answer in a moment: they must not pull in the model stack
    (about 10 s of imports on a 2-core machine). The bad prompt and setting are refused before any loading."""
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from metasd.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "codes = [main(['generate', '']), main(['generate', 'hi', '--gamma', '0']),\n"
        "         main(['generate', 'hi', '--drafters', 'nope']), main(['replay', sys.argv[1], '--speed', '0'])]\n"
        "print(codes, sorted(m for m in ('torch', 'transformers', 'gradio', 'pandas') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", code, str(ROOT / "assets" / "runs" / "ex-chat-1.json")],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "[2, 2, 2, 0] []", p.stdout[-500:]
    assert "the prompt is empty" in p.stderr and "gamma must be between" in p.stderr and "'nope'" in p.stderr
