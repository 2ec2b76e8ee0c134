"""README smoke tests: every command and code block README.md shows runs, in a tiny version, as shown.

Commands come from the README's fenced shell blocks (a line that does not start with blanks is a
command; indented or backslash-continued lines belong to it). Each kind of command has a smoke test
below that runs the same program and subcommand as a subprocess in a scrubbed environment; a command
of a new kind fails `test_every_readme_command_has_a_smoke_test` until a smoke test covers it.
Flags, policy and reward names, methods, JSON fields, API parameters and file paths shown in the
README are checked against the code, so renaming one without the README fails here.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
from functools import cache

import pytest

from tests.app_server import free_port
from tests.test_start import ROOT, scrubbed_env, started

README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "BENCHMARKS.md"  # the full, dated tables and the commands that made them
CLI_TIMEOUT_S = 180

# (program, subcommand) of every command kind that has a smoke test in this file.
COVERED = {("make", "run"), ("make", "test"), ("metasd", "generate"), ("metasd", "bench"), ("metasd", "drafters"),
           ("metasd", "replay"), ("metasd", "priors"), ("metasd", "config"), ("metasd.training.train", None),
           ("metasd.training.corpus", None), ("scripts/load_users.py", None), ("scripts/ab_bench.py", None),
           ("scripts/measure_page_examples.py", None), ("scripts/build_datastore.py", None),
           ("scripts/profile_one_id.py", None), ("scripts/seed_repeats.py", None)}

# Files the README names that do not exist: none. An entry here would fail the test once the file
# exists (or the README stops naming it), so the list cannot go stale.
KNOWN_MISSING: set[str] = set()

# Files the README names as outputs of a command (not files of the repository).
OUTPUT_FILES = {"results.csv", "rounds.csv", "summary.md", "report.html"}

ROUND_FIELDS = ("drafter", "draft", "accepted", "emitted", "reward", "probabilities", "draft_ms", "verify_ms")
STATS_FIELDS = ("new_tokens", "target_calls", "mean_accepted", "wall_s", "tokens_per_s")
TOP_FIELDS = ("prompt", "text", "token_ids", "rounds", "stats", "config")
RESULT_COLUMNS = ("method", "question_id", "category", "new_tokens", "wall_s", "target_calls", "mean_accepted",
                  "identical_to_baseline")


# ----------------------------------------------------------------------------------------------
# Reading the README


@cache
def readme() -> str:
    return README.read_text(encoding="utf-8")


@cache
def benchmarks() -> str:
    return BENCHMARKS.read_text(encoding="utf-8")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return re.findall(r"^```([\w+-]*)[ \t]*\n(.*?)^```[ \t]*$", text, re.M | re.S)


def python_blocks() -> list[str]:
    return [body for lang, body in fenced_blocks(readme()) if lang in ("python", "py")]


@cache
def shell_commands(doc: str = "readme") -> tuple[str, ...]:
    """Every command line of a document's shell blocks (the README's, or docs/BENCHMARKS.md's),
    continuation lines joined, comments dropped."""
    cmds: list[str] = []
    for lang, body in fenced_blocks(readme() if doc == "readme" else benchmarks()):
        if lang not in ("bash", "sh", "shell", "console"):
            continue
        continued = False
        for raw in body.splitlines():
            line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
            if not line.strip():
                continued = False
                continue
            if cmds and (continued or raw[:1].isspace()):
                cmds[-1] = f"{cmds[-1]} {line.strip().removesuffix(chr(92)).rstrip()}"
            else:
                cmds.append(line.removesuffix("\\").rstrip())
            continued = line.endswith("\\")
    return tuple(cmds)


def kind(cmd: str) -> tuple[str, str | None]:
    """(program, subcommand) of a command line: ("make", "run"), ("metasd", "bench"), ("metasd.training.train", None)."""
    tokens = shlex.split(cmd)
    if tokens[0] == "make":
        return "make", tokens[1] if len(tokens) > 1 else None
    if re.fullmatch(r"(\.venv/bin/)?python3?", tokens[0]) and len(tokens) > 2 and tokens[1] == "-m":
        module = tokens[2]
        if module == "metasd":
            return module, tokens[3] if len(tokens) > 3 else None
        return module, None
    if re.fullmatch(r"(\.venv/bin/)?python3?", tokens[0]) and len(tokens) > 1 and tokens[1].startswith("scripts/"):
        return tokens[1], None
    return tokens[0], cmd


def commands_of(key: tuple[str, str | None], doc: str = "readme") -> list[str]:
    found = [c for c in shell_commands(doc) if kind(c) == key]
    assert found or doc != "readme", (
        f"the README shows no {' '.join(k for k in key if k)} command any more: drop its smoke test")
    return found


def all_commands_of(key: tuple[str, str | None]) -> list[str]:
    """The README's commands of a kind, then docs/BENCHMARKS.md's."""
    return commands_of(key) + commands_of(key, "benchmarks")


def program(cmd: str) -> str:
    """The interpreter a README command names: `.venv/bin/python` is this repository's own."""
    first = shlex.split(cmd)[0]
    if "/" in first:
        path = ROOT / first
        assert path.exists(), f"the README runs {first}, which does not exist"
        return str(path)
    return sys.executable


def flags(cmd: str) -> list[str]:
    return sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", cmd)))


def run(argv: list[str], timeout: float = CLI_TIMEOUT_S, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env=scrubbed_env(), capture_output=True, text=True, timeout=timeout, **kwargs)


def ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, (f"{shlex.join(p.args)} exited {p.returncode}\n"
                               f"stdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}")
    return p


@cache
def help_text(*args: str) -> str:
    """`<the README's python> -m <module> [sub] --help`, run once per session."""
    return ok(run([readme_python(), "-m", *args, "--help"])).stdout


def readme_python() -> str:
    """The interpreter the README's CLI blocks use (`.venv/bin/python`: this repository's own)."""
    return program(commands_of(("metasd", "generate"))[0])


# ----------------------------------------------------------------------------------------------
# The README's commands


def test_readme_has_commands_and_snippets():
    assert len(shell_commands()) >= 5, shell_commands()
    assert len(python_blocks()) >= 2, "the README's library and gradio_client snippets"


def test_every_readme_command_has_a_smoke_test():
    unknown = sorted({c for c in shell_commands() + shell_commands("benchmarks") if kind(c) not in COVERED})
    assert not unknown, f"README or BENCHMARKS commands without a smoke test in tests/test_readme.py: {unknown}"


def test_benchmarks_doc_has_commands():
    """docs/BENCHMARKS.md gives the command of its runs: bench and training ones at least."""
    kinds = {kind(c) for c in shell_commands("benchmarks")}
    assert {("metasd", "bench"), ("metasd.training.train", None)} <= kinds, kinds


@pytest.mark.timeout(120)
def test_readme_subcommands_are_real():
    """Every `python -m metasd <sub>` named anywhere in the README (prose, tables, blocks) exists."""
    listed = re.search(r"\{([\w,-]+)\}", help_text("metasd"))
    assert listed, help_text("metasd")
    real = set(listed.group(1).split(","))
    named = set(re.findall(r"(?:\.venv/bin/)?python3? -m metasd ([A-Za-z][\w-]*)", readme() + benchmarks()))
    assert named, "the README names no metasd subcommand"
    assert named <= real, f"the README names subcommands the CLI lacks: {sorted(named - real)} (it has {sorted(real)})"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("key", [("metasd", "generate"), ("metasd", "bench"), ("metasd", "drafters"),
                                 ("metasd", "replay"), ("metasd.training.train", None)],
                         ids=["generate", "bench", "drafters", "replay", "train"])
def test_readme_flags_exist(key):
    """Every flag the README (or docs/BENCHMARKS.md) shows for a command is in that command's --help."""
    module, sub = key
    text = help_text(module, *([sub] if sub else []))
    shown = sorted({f for cmd in all_commands_of(key) for f in flags(cmd)})
    assert shown, commands_of(key)
    missing = [f for f in shown if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)]
    assert not missing, f"flags the README shows for {module} {sub or ''} but --help lacks: {missing}\n{text}"


def test_readme_inline_flags_exist():
    """Inline mentions such as `--reward bd` or `--draft-vocab` belong to some command."""
    inline = set(re.findall(r"`(--[a-z][a-z0-9-]*)[^`]*`", readme()))
    shell = {f for c in shell_commands() for f in flags(c)}
    pip = {"--no-deps"}  # pip's, in the set-up prose
    texts = (help_text("metasd", "generate") + help_text("metasd", "bench") + help_text("metasd.training.train")
             + help_text("metasd.training.corpus"))
    missing = [f for f in sorted(inline - shell - pip) if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", texts)]
    assert not missing, f"flags named in the README's prose that no command has: {missing}"


def test_readme_policy_reward_and_dtype_choices_are_real():
    import torch

    from metasd.bandits.policies import POLICIES
    from metasd.core.validation import REWARDS

    (synopsis,) = commands_of(("metasd", "generate"))
    choices = dict(re.findall(r"\[--([a-z-]+) ([^\]\s]*\|[^\]\s]*)\]", synopsis))
    assert {"policy", "reward", "dtype"} <= set(choices), choices
    policies = choices["policy"].split("|")
    assert set(policies) - {"single:<drafter>"} <= set(POLICIES), sorted(set(policies) - set(POLICIES))
    assert set(POLICIES) <= set(policies), f"policies the README's synopsis leaves out: {sorted(set(POLICIES) - set(policies))}"
    assert set(choices["reward"].split("|")) == set(REWARDS), choices["reward"]
    for name in choices["dtype"].split("|"):
        assert isinstance(getattr(torch, name, None), torch.dtype), name
    for name in re.findall(r"`--policy ([\w-]+)`", readme()):
        assert name in POLICIES, name
    for name in re.findall(r"`--reward ([\w-]+)`", readme()):
        assert name in REWARDS, name


def test_readme_presets_and_methods_are_real():
    from metasd.benchmark.bench import parse_methods
    from metasd.models.presets import PRESETS

    table = re.findall(r"^\| `([\w.-]+)`", readme(), re.M)
    assert table, "the Presets table"
    assert set(table) == set(PRESETS), f"README presets {sorted(table)} vs code {sorted(PRESETS)}"
    for name in re.findall(r"METASD_PRESET` to `([\w.-]+)`|`(qwen[\w.-]+)`", readme()):
        assert (name[0] or name[1]) in PRESETS, name

    offline = PRESETS["offline"]
    models = [d.name for d in offline.drafters if d.kind not in ("prompt-lookup", "token-recycling", "retrieval")]
    for cmd in all_commands_of(("metasd", "bench")):
        m = re.search(r"--methods (\S+)", cmd)
        if m and "," in m.group(1) and "m1" not in m.group(1):
            shown = m.group(1).split(",")
            parsed = [x.name for x in parse_methods(m.group(1), offline.drafter_names, models)]
            assert parsed == shown, (shown, parsed)
            full = method_rows(benchmarks().split("\n## Spec-Bench", 1)[1].split("\n## ", 1)[0])
            assert list(full) == shown, f"BENCHMARKS' Spec-Bench table's methods {list(full)} vs the command's {shown}"
            headline = method_rows(readme().split("## Benchmarks", 1)[1].split("\n## ", 1)[0])
            assert headline, "the README's headline benchmark table"
            for method, row in headline.items():  # the README's rows are the full table's, figure for figure
                assert full.get(method) == row, f"README row {method!r} differs from docs/BENCHMARKS.md: {row!r}"
            break
    else:
        pytest.fail("no benchmark command with a --methods list in the README or docs/BENCHMARKS.md")


def method_rows(section: str) -> dict[str, str]:
    """method -> its cells, from the first table of a section whose rows read `| method | 1.23x | ...`."""
    tables = re.findall(r"(?:^\|.*\n?)+", section, re.M)
    for table in tables:
        rows = re.findall(r"^\| (\**[\w:.@+-]+\**) (\| [\d.]+x.*)$", table, re.M)
        if rows:
            return {name.strip("*"): cells.replace("*", "") for name, cells in rows}
    return {}


def test_readme_json_contract_is_documented():
    """The fields this file checks in `generate --json` are the ones the README promises."""
    for name in TOP_FIELDS + ROUND_FIELDS + STATS_FIELDS:
        assert f'"{name}"' in readme(), f"the README's --json contract no longer names {name!r}"
    for name in RESULT_COLUMNS[-1:]:
        assert f"`{name}`" in readme(), name


@pytest.mark.offline_model
@pytest.mark.timeout(CLI_TIMEOUT_S)
def test_generate_json(tmp_path):
    (cmd,) = commands_of(("metasd", "generate"))
    prompt = "Translate to French: good morning"
    p = ok(run([program(cmd), "-m", "metasd", "generate", prompt, "--max-new-tokens", "8", "--json"]))
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, f"--json must print exactly one JSON object, got:\n{p.stdout}"
    obj = json.loads(p.stdout)
    assert isinstance(obj, dict)
    assert set(TOP_FIELDS) <= set(obj), sorted(obj)
    assert obj["prompt"] == prompt
    assert isinstance(obj["text"], str) and obj["text"]
    stats = obj["stats"]
    assert set(STATS_FIELDS) <= set(stats), sorted(stats)
    assert 1 <= stats["new_tokens"] <= 8
    assert len(obj["token_ids"]) == stats["new_tokens"]
    assert all(isinstance(t, int) for t in obj["token_ids"])
    assert obj["rounds"] and all(set(ROUND_FIELDS) <= set(r) for r in obj["rounds"]), obj["rounds"][:1]
    assert sum(len(r["emitted"]) for r in obj["rounds"]) == stats["new_tokens"]
    assert stats["target_calls"] >= 1 and stats["wall_s"] > 0 and stats["tokens_per_s"] > 0
    assert isinstance(obj["config"], dict) and obj["config"].get("max_new_tokens") == 8, obj["config"]


@pytest.mark.offline_model
@pytest.mark.timeout(CLI_TIMEOUT_S)
@pytest.mark.parametrize("args", [[""], ["hello", "--gamma", "0"], ["hello", "--drafters", "no-such-drafter"]],
                         ids=["empty-prompt", "gamma-0", "unknown-drafter"])
def test_generate_bad_input_is_one_error_line_status_2(args):
    """README: bad input prints one `error:` line and exits with status 2."""
    (cmd,) = commands_of(("metasd", "generate"))
    p = run([program(cmd), "-m", "metasd", "generate", *args, "--json"])
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert p.returncode == 2, f"exit {p.returncode}\n{p.stderr[-3000:]}"
    assert len(errors) == 1, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    assert p.stdout == "", p.stdout


@pytest.mark.offline_model
@pytest.mark.timeout(CLI_TIMEOUT_S)
def test_bench_two_prompts(tmp_path):
    cmd = commands_of(("metasd", "bench"))[0]
    prompts = tmp_path / "question.jsonl"
    rows = [{"question_id": 1, "category": "translation", "turns": ["Translate to French: good morning"]},
            {"question_id": 2, "category": "summarization",
             "turns": ["Summarize in one sentence: the bakery opens at seven and sells rye bread and tea."]}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "out"
    ok(run([program(cmd), "-m", "metasd", "bench", "--prompts", str(prompts), "--per-category", "1",
            "--max-new-tokens", "8", "--methods", "baseline,single:prompt-lookup", "--threads", "1", "--out", str(out)]))
    for name in sorted(OUTPUT_FILES):  # the README: writes results.csv, rounds.csv, summary.md, report.html
        assert (out / name).is_file(), f"bench did not write {name}: {sorted(p.name for p in out.iterdir())}"
    with (out / "results.csv").open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        assert set(RESULT_COLUMNS) <= set(reader.fieldnames or ()), reader.fieldnames
        results = list(reader)
    assert {(r["method"], r["question_id"]) for r in results} == {
        (m, q) for m in ("baseline", "single:prompt-lookup") for q in ("1", "2")}, results
    assert all(r["identical_to_baseline"].lower() in ("true", "1", "1.0") for r in results), results
    assert (out / "summary.md").read_text(encoding="utf-8").strip()


@pytest.mark.timeout(120)
def test_priors_command(tmp_path):
    cmd = commands_of(("metasd", "priors"))[0]
    prompts = tmp_path / "question.jsonl"
    rows = [{"question_id": i, "category": c, "turns": [t]} for i, (c, t) in enumerate([
        ("qa", "What is the capital of France?"), ("qa", "Name a large ocean."),
        ("summarization", "Summarize: the bakery opens at seven and sells rye bread. The bakery opens at seven."),
        ("summarization", "Summarize: the train leaves at noon. It arrives in Lyon at three. The train is red.")])]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "priors.json"
    # The README's --drafters (the default arms and others), each measured, in one run cut to a few tokens.
    words = shlex.split(cmd)
    arms = next(words[i + 1] for i, x in enumerate(words) if x == "--drafters").split(",")
    ok(run([program(cmd), "-m", "metasd", "priors", "--prompts", str(prompts), "--skip-per-category", "1",
            "--per-category", "1", "--max-new-tokens", "6", "--drafters", ",".join(arms), "--out", str(out)]))
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["preset"] == "offline" and doc["meta"]["prompts"] == ["1", "3"]  # the first of each category skipped
    assert set(doc["means"]) == {"bd", "be"} and all(0 <= v <= 1 for m in doc["means"].values() for v in m.values())
    assert set(doc["means"]["bd"]) == set(arms), doc["means"]
    bad = run([program(cmd), "-m", "metasd", "priors", "--prompts", str(prompts), "--skip-per-category", "5",
               "--out", str(out)])
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error:"), bad.stderr
    bad = run([program(cmd), "-m", "metasd", "priors", "--prompts", str(prompts), "--skip-per-category", "1",
               "--drafters", "retrieval", "--out", str(out)])
    assert bad.returncode == 2 and "must include every default arm" in bad.stderr, bad.stderr


@pytest.mark.timeout(300)
def test_load_users_command():
    """The class-at-once measurement, as BENCHMARKS.md runs it, with two users and a few tokens."""
    cmds = commands_of(("scripts/load_users.py", None), "benchmarks")
    assert sorted(flags(c) for c in cmds) == sorted([["--max-new-tokens", "--users"],
                                                     ["--max-new-tokens", "--users"],
                                                     ["--beside", "--engine-only", "--max-new-tokens", "--users"],
                                                     ["--max-new-tokens", "--users"],
                                                     ["--draft-batching", "--engine-only", "--max-new-tokens", "--users"],
                                                     ["--draft-batching", "--max-new-tokens", "--users"],
                                                     ["--batching", "--max-new-tokens", "--users"],
                                                     ["--batching", "--distinct", "--max-new-tokens", "--users"],
                                                     ["--engine-only", "--max-new-tokens", "--users"],
                                                     ["--drafters", "--engine-only", "--max-new-tokens", "--users"],
                                                     ["--drafters", "--engine-only", "--max-new-tokens", "--users"],
                                                     ["--engine-only", "--max-new-tokens", "--prompts", "--users"],
                                                     ["--drafters", "--engine-only", "--max-new-tokens", "--prompts",
                                                      "--users"],
                                                     ["--max-new-tokens", "--users"],
                                                     ["--max-new-tokens", "--tree-users", "--users"],
                                                     ["--engine-only", "--max-new-tokens", "--policy", "--users"],
                                                     ["--engine-only", "--max-new-tokens", "--policy", "--users"],
                                                     ["--max-new-tokens", "--users"]]), cmds
    # every flag of the server's commands but one: each user on a prompt of its own
    cmd = next(c for c in cmds if "--distinct" in flags(c))
    beside = next(c for c in cmds if "--beside" in flags(c))
    p = ok(run([program(cmd), "scripts/load_users.py", "--users", "2", "--max-new-tokens", "8", "--prompts", "2",
                "--timeout", "120", "--batching", "on", "--distinct", "--tree-users", "1"], timeout=280))
    rows = [line for line in p.stdout.splitlines() if line.startswith("| 2 | on |")]
    assert len(rows) == 1, p.stdout
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[5] == "2 / 0 / 0", rows[0]  # both served, nobody told to wait or turned away
    assert cells[7] == "2 of 2", rows[0]  # each answer is its solo answer
    assert cells[-1] == "0", rows[0]  # no errors
    # One of the two asked for metasd-tree (a tree run in the class): served, its answer its solo answer.
    assert re.search(r"# 2 users with 1 metasd-tree: chain runs' aggregate [\d.]+ tok/s over 1 runs; tree runs "
                     r"served 1, their answers solo: 1", p.stdout), p.stdout
    # As a Space: the rounds in processes of their own, one per core.
    assert f"# shared rounds in process{'es' if (os.cpu_count() or 1) > 1 else ''} " in p.stdout, p.stdout
    # The engine alone, each request's drafter forwards on their own (drafting together is on in the server run),
    # with a process of plain Python work beside it (BENCHMARKS' second command), every user on token trees.
    p = ok(run([program(beside), "scripts/load_users.py", "--users", "2", "--max-new-tokens", "8", "--prompts", "2",
                "--engine-only", "--draft-batching", "off", "--beside", "process", "--beside-share", "0.1",
                "--policy", "metasd-tree"], timeout=280))
    rows = [line for line in p.stdout.splitlines()
            if line.startswith("| 2 | engine only, metasd-tree, process beside (10% of a core) |")]
    assert len(rows) == 1 and "| 2 of 2 |" in rows[0], p.stdout  # the same answers on the engine alone
    import psutil

    left = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"]) if "--busy" in (p.info["cmdline"] or [])]
    assert not left, f"the process beside outlived its run: {left}"


def test_train_help():
    cmds = commands_of(("metasd.training.train", None))
    assert len(cmds) == 3, cmds  # the distilled drafters, the white-box heads, and continuing a head
    assert any("--resume assets/drafters/" in c for c in cmds), cmds
    usage = help_text("metasd.training.train")
    assert "usage:" in usage
    for cmd in cmds:
        assert program(cmd) == readme_python(), cmd  # help_text runs the README's interpreter
        for flag, value in re.findall(r"(--[\w-]+) ([\w-]+)", cmd):
            assert flag in usage, (flag, cmd)
            if flag in ("--domain", "--kind"):
                assert value in usage, (value, cmd)
        line = next((x for x in readme().splitlines() if cmd.split()[-1] in x and "metasd.training.train" in x), "")
        for other in re.findall(r"also: ([\w, ]+)", line):
            for name in other.replace(" ", "").split(","):
                assert name in usage, name


@pytest.mark.offline_model
@pytest.mark.timeout(300)
def test_corpus_command(tmp_path):
    """The README's data command, cut to one shard of two short answers in a temporary folder; rerun, it
    finds the shard done and makes nothing (the resume)."""
    (cmd,) = commands_of(("metasd.training.corpus", None))
    argv = [a.replace("data/corpus", str(tmp_path / "corpus")) for a in shlex.split(cmd)]
    argv += ["--only", "0", "--prompts-per-shard", "2", "--max-new-tokens", "4", "--batch", "2"]
    first = ok(run(argv, timeout=240))
    assert "shard 0 code/train: 2 answers" in first.stderr, first.stderr[-800:]
    man = json.loads((tmp_path / "corpus" / "manifest.json").read_text(encoding="utf-8"))
    assert man["shards"] == 1 and man["licences"] and 0 < man["answer_tokens"] <= 8
    again = ok(run(argv, timeout=240))
    assert "1 shards done, 0 to make" in again.stderr, again.stderr[-800:]


def test_make_targets():
    """`make test` (a dry run: the whole suite is what runs this file) names lint and pytest."""
    for cmd in commands_of(("make", "test")):
        p = ok(subprocess.run(shlex.split(cmd) + ["-n"], cwd=ROOT, env=scrubbed_env(), capture_output=True, text=True,
                              timeout=60))
        assert "ruff check" in p.stdout and "pytest" in p.stdout, p.stdout
    for cmd in commands_of(("make", "run")):
        p = ok(subprocess.run(shlex.split(cmd) + ["-n", "-o", ".venv/.installed"], cwd=ROOT, env=scrubbed_env(),
                              capture_output=True, text=True, timeout=60))
        assert "app.py" in p.stdout, p.stdout


# ----------------------------------------------------------------------------------------------
# The README's python snippets


def snippet(marker: str) -> str:
    found = [b for b in python_blocks() if marker in b]
    assert len(found) == 1, f"expected one python block with {marker!r} in the README, found {len(found)}"
    return found[0]


def fewer_tokens(code: str) -> str:
    small, n = re.subn(r"max_new_tokens=\d+", "max_new_tokens=8", code)
    assert n >= 1, f"no max_new_tokens=N to shrink in the README's snippet:\n{code}"
    return small


@pytest.mark.timeout(CLI_TIMEOUT_S)
def test_replay_command():
    (cmd,) = commands_of(("metasd", "replay"))
    run_file = shlex.split(cmd)[4]
    assert (ROOT / run_file).exists(), run_file
    p = ok(run([program(cmd), "-m", "metasd", "replay", run_file, "--speed", "0"]))
    assert "stopped by" in p.stdout


@pytest.mark.timeout(CLI_TIMEOUT_S)
def test_ab_bench_command():
    """The A/B command as BENCHMARKS.md runs it: its own flags are in its --help, and the rest go to bench's, whose
    --help has them (a full run takes two revisions' benchmarks: tests/test_bench.py covers its parts)."""
    cmds = commands_of(("scripts/ab_bench.py", None), "benchmarks")
    assert cmds, "docs/BENCHMARKS.md runs scripts/ab_bench.py"
    own = ok(run([program(cmds[0]), "scripts/ab_bench.py", "--help"])).stdout + help_text("metasd", "bench")
    for cmd in cmds:  # every A/B the document quotes
        missing = [f for f in flags(cmd) if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", own)]
        assert not missing, (cmd, missing)


@pytest.mark.offline_model
@pytest.mark.timeout(CLI_TIMEOUT_S)
def test_datastore_from_a_corpus_command(tmp_path):
    """BENCHMARKS.md's datastore grown from a corpus: on a corpus folder of two answers (one train, one eval shard),
    the shipped datastore's answers and the train shard's are stored, nothing answered anew, the card says so."""
    from metasd.training.corpus import write_shard

    (cmd,) = commands_of(("scripts/build_datastore.py", None), "benchmarks")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_shard(corpus, 0, [([1, 2, 3], [40, 41, 2]), ([4, 5], [50, 51, 52])], {"domain": "qa", "split": "train"})
    write_shard(corpus, 1, [([6], [60, 2])], {"domain": "qa", "split": "eval"})
    argv = [a.replace("data/corpus", str(corpus)).replace("/tmp/store", str(tmp_path / "store"))
            for a in shlex.split(cmd)[1:]]
    ok(run([program(cmd), *argv]))
    meta = json.loads((tmp_path / "store" / "offline.json").read_text(encoding="utf-8"))
    shipped = json.loads((ROOT / "assets" / "datastore" / "offline.json").read_text(encoding="utf-8"))
    assert meta["documents"] == shipped["documents"] + 2 and meta["tokens"] == shipped["tokens"] + 6
    assert meta["corpus"]["answers"] == 2 and meta["domains"]["qa"] == 2 and meta["prompts_considered"] == 512
    assert "2 of them from the corpus" in (tmp_path / "store" / "offline.md").read_text(encoding="utf-8")


@pytest.mark.timeout(CLI_TIMEOUT_S)
def test_page_examples_command():
    """The page's own speed-ups as BENCHMARKS.md measures them: its flags are in its --help and every example it
    names is one of the page's (a full run drives Chromium against a started app for minutes: the browser tests
    cover those parts)."""
    (cmd,) = commands_of(("scripts/measure_page_examples.py", None), "benchmarks")
    usage = ok(run([program(cmd), "scripts/measure_page_examples.py", "--help"])).stdout
    assert all(f in usage for f in flags(cmd)), (flags(cmd), usage)
    named = re.search(r"--only (\S+)", cmd).group(1).split(",")
    ids = {e["question_id"] for e in json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))}
    assert named and set(named) <= ids, sorted(set(named) - ids)


@pytest.mark.timeout(CLI_TIMEOUT_S)
def test_profile_one_id_command(tmp_path):
    """BENCHMARKS' one-id profile, cut to one prompt and two passes: both kernels timed, a row per product."""
    (cmd,) = commands_of(("scripts/profile_one_id.py", None), "benchmarks")
    prompts = tmp_path / "question.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["Name a large ocean."]}) + "\n",
                       encoding="utf-8")
    p = ok(run([program(cmd), "scripts/profile_one_id.py", "--prompts", str(prompts), "--count", "1", "--tokens", "2"]))
    assert re.search(r"^packed: [\d.]+ ms a token", p.stdout, re.M) and re.search(r"^default: [\d.]+ ms", p.stdout, re.M)
    rows = [x for x in p.stdout.splitlines() if x.startswith(("| packed |", "| default |"))]
    assert any("aten::mm" in x for x in rows) and any("other ops" in x for x in rows), p.stdout
    assert all(f in cmd for f in ("--count", "--tokens")), cmd


@pytest.mark.timeout(CLI_TIMEOUT_S)
def test_seed_repeats_command():
    """BENCHMARKS' sampled runs by their prices, cut to one prompt and four tokens: its flags are the script's, and
    every pair's row says how many prompts gave one text; fixed prices give one text on every prompt."""
    (cmd,) = commands_of(("scripts/seed_repeats.py", None), "benchmarks")
    usage = ok(run([program(cmd), "scripts/seed_repeats.py", "--help"])).stdout
    assert all(f in usage for f in flags(cmd)), (flags(cmd), usage)
    p = ok(run([program(cmd), "scripts/seed_repeats.py", "--prompts", "examples", "--per-category", "1",
                "--max-new-tokens", "4", "--repeats", "2", "--policies", "metasd-tree"]))
    rows = [x for x in p.stdout.splitlines() if x.startswith("| metasd-tree |")]
    assert len(rows) == 2 and rows[1].startswith("| metasd-tree | fixed |"), p.stdout
    assert re.search(r"\| (\d+) of \1 \|$", rows[1]), rows[1]


@pytest.mark.timeout(CLI_TIMEOUT_S)
def test_config_command():
    (cmd,) = commands_of(("metasd", "config"))
    p = ok(run([program(cmd), "-m", "metasd", "config"]))
    assert "METASD_BATCH " in p.stdout and "(default)" in p.stdout


@pytest.mark.timeout(CLI_TIMEOUT_S)
def test_drafters_command():
    (cmd,) = commands_of(("metasd", "drafters"))
    rows = json.loads(ok(run([program(cmd), "-m", "metasd", "drafters", "--json"])).stdout)
    assert rows and all({"name", "kind", "description"} <= set(r) for r in rows)


@pytest.mark.offline_model
@pytest.mark.timeout(CLI_TIMEOUT_S)
def test_bring_your_own_drafter_snippet_runs():
    code = fewer_tokens(snippet("register_drafter"))
    p = ok(run([sys.executable, "-c", code]))
    assert "drafter='echo-last'" in p.stdout and "Summary(" in p.stdout, p.stdout[-2000:]


@pytest.mark.offline_model
@pytest.mark.timeout(CLI_TIMEOUT_S)
def test_library_snippet_runs():
    code = fewer_tokens(snippet("RoundEvent"))
    p = ok(run([sys.executable, "-c", code]))
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    assert len(lines) >= 2, f"expected a line per round and one for the summary:\n{p.stdout}"


@pytest.mark.offline_model
@pytest.mark.timeout(300)
def test_make_run_serves_and_gradio_client_snippet_runs():
    """`make run` (its set-up step taken as done), then the README's gradio_client snippet against it,
    and the README's description of /generate's parameters against the served API."""
    from gradio_client import Client

    (cmd,) = commands_of(("make", "run"))
    code = fewer_tokens(snippet("gradio_client"))
    port = free_port()
    # The README's app URL is the default port; the test takes a free one (gradio's and app.py's variable).
    env = scrubbed_env(GRADIO_SERVER_PORT=str(port))
    with started([*shlex.split(cmd), "-o", ".venv/.installed"], env, port) as served:
        assert served.listen_addresses() == {"127.0.0.1"}, served.listen_addresses()
        code, n = re.subn(r"http://127\.0\.0\.1:7860/?", served.url, code)
        assert n == 1, "the snippet's URL is no longer the README's http://127.0.0.1:7860/"
        code += "\nassert 'class=\"tok' in token_html, token_html[:500]\nprint('ok')\n"
        p = ok(run([sys.executable, "-c", code]))
        assert p.stdout.strip().endswith("ok"), p.stdout

        documented = re.search(r"first\s+parameter\s+is\s+`(\w+)`;\s+the\s+others\s+are\s+keyword\s+parameters\s+"
                               r"with\s+defaults:\s+(.*?)\.", readme(), re.S)
        assert documented, "the README's description of /generate's parameters"
        first, rest = documented.group(1), re.findall(r"`(\w+)`", documented.group(2))
        client = Client(served.url, verbose=False)
        params = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]["parameters"]
        client.close()
        names = [q["parameter_name"] for q in params]
        assert names == [first, *rest], f"/generate takes {names}; the README says {[first, *rest]}"
        assert all(q["parameter_has_default"] for q in params[1:]), params
        assert served.proc.poll() is None, served.output()


# ----------------------------------------------------------------------------------------------
# Files and front matter


def referenced_paths(doc: str = "readme") -> set[str]:
    """Repository paths a document names in links, code spans and (the README) its layout map."""
    text = readme() if doc == "readme" else benchmarks()
    paths = set(re.findall(r"\]\(((?!https?:)[^)\s]+)\)", text))  # markdown links and images
    for span in re.findall(r"`([^`\n]+)`", text):
        if span in OUTPUT_FILES or re.search(r"[\s:<$=]", span) or span.startswith(("~", "/", "-", ".safetensors")):
            continue
        if "/" in span or re.fullmatch(r"[\w.-]+\.(py|md|txt|sh|toml|json|css)|Spacefile|Makefile", span):
            paths.add(span)
    if doc != "readme":
        return paths
    tree = next(body for lang, body in fenced_blocks(text) if body.startswith("metasd/"))
    parents = ["metasd/"]  # the folder at each depth (two spaces a level)
    for line in tree.splitlines()[1:]:
        name = line.split()[0]
        if not re.fullmatch(r"[\w.-]+(\.\w+|/)", name):
            continue  # a description carried over from the line above
        depth = (len(line) - len(line.lstrip(" "))) // 2
        path = "".join(parents[:depth]) + name
        paths.add(path)
        if name.endswith("/"):
            del parents[depth:]
            parents.append(name)
    return paths


def test_readme_paths_exist():
    paths = referenced_paths()
    assert {"app.py", "metasd/decoding/engine.py", "Spacefile", "assets/drafters/"} <= paths, sorted(paths)
    missing = {p for p in paths if not list(ROOT.glob(p.rstrip("/")))}
    assert missing == KNOWN_MISSING, (f"files the README names that do not exist: {sorted(missing - KNOWN_MISSING)}; "
                                      f"now present, take off KNOWN_MISSING: {sorted(KNOWN_MISSING - missing)}")


def test_benchmarks_doc_paths_exist():
    paths = referenced_paths("benchmarks")
    assert {"assets/drafters/costs.json", "scripts/measure_verify.py"} <= paths, sorted(paths)
    missing = sorted(p for p in paths if not list(ROOT.glob(p.rstrip("/"))))
    assert not missing, f"files docs/BENCHMARKS.md names that do not exist: {missing}"


def test_readme_fits_and_stays_inside_the_repository():
    """The front door fits on a screen or two and speaks only of what a reader of the repository sees."""
    lines = readme().count("\n")
    assert lines <= 350, f"README.md has {lines} lines; the full tables belong in docs/BENCHMARKS.md"
    for doc, text in (("README.md", readme()), ("docs/BENCHMARKS.md", benchmarks())):
        for word in (r"\bissues?\b", r"\bbar\b", r"(?<!-)\bbudget\b(?!-)"):
            hit = re.search(rf"[^\n]*{word}[^\n]*", text, re.I)
            assert not hit, f"{doc} speaks of something outside the repository: {hit.group(0)!r}"


def test_front_matter_matches_requirements():
    import gradio
    import yaml

    front = yaml.safe_load(readme().split("---", 2)[1])
    assert (ROOT / front["app_file"]).is_file(), front["app_file"]
    pin = re.search(r"^gradio==([\w.]+)$", (ROOT / "requirements.txt").read_text(encoding="utf-8"), re.M)
    assert pin, "requirements.txt pins gradio"
    assert front["sdk"] == "gradio" and str(front["sdk_version"]) == pin.group(1) == gradio.__version__, (
        front["sdk_version"], pin.group(1), gradio.__version__)


def test_every_figure_the_readme_quotes_comes_from_benchmarks():
    """Speed-ups, shares and tokens/s the README quotes are docs/BENCHMARKS.md's, character for character: a figure
    measured anew goes into BENCHMARKS.md first. And that file keeps one section per topic, old runs in History."""
    figures = set(re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?:x|%)(?!\w)", readme()))
    figures |= set(re.findall(r"(?<![\w.])(\d+(?:\.\d+)?) tokens/s", readme()))
    assert len(figures) > 20, figures
    assert sorted(f for f in figures if f not in benchmarks()) == []
    sections = re.findall(r"(?m)^## (.+)$", benchmarks())
    assert sections[-1] == "History"
    topics = [re.sub(r"\s*\(.*\)$", "", t).split(":")[0].split(",")[0] for t in sections]
    assert len(topics) == len(set(topics)), f"a topic with two current sections: {topics}"
