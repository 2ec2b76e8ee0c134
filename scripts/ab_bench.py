"""The same benchmark on two revisions of the project, interleaved on one machine: is B faster than A?

    .venv/bin/python scripts/ab_bench.py 9b78178 HEAD --prompts ../shared/specbench/question.jsonl \\
        --per-category 3 --methods baseline,single:retrieval,metasd-ucb-cost --threads 1

Each revision is exported (`git archive`) into a folder of its own and run with this interpreter as
`python -m metasd bench` (the command line every revision has), one chunk of prompts at a time (a category by
default, `--chunk prompt` for one prompt): for every chunk both revisions run, A then B or B then A by turns, so
that a slow spell of a shared machine falls on both alike; `--pairs N` repeats the whole alternation N times.
Options this script does not know are passed to `bench` unchanged (--methods, --max-new-tokens, --threads, ...).

Prints, and writes to WORK/ab.md and WORK/ab.csv, per method: tokens/s of each revision (all tokens over all
wall time), B over A, rounds, and the mean time a round spent drafting, verifying and on everything else
(bookkeeping: picking, scoring, learning, emitting); and whether the two revisions played the same rounds
(drafter, drafted, accepted and emitted per round, from each run's rounds.csv), so that a speed difference
is not a difference of work; and, where `baseline` is among the methods, each revision's speed-up over its own
target alone. `--b-only METHODS` runs methods that A's build lacks (metasd-tree before 5eaf07d) on B alone, in
B's same bench process. The CPU's model and whether it has AVX-512 and AMX head the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def export(rev: str, into: Path) -> str:
    """The revision's tracked files in `into` (once); its full commit id."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    if not (into / "metasd").is_dir():
        into.mkdir(parents=True, exist_ok=True)
        data = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, check=True,
                              capture_output=True).stdout
        with tarfile.open(fileobj=BytesIO(data)) as tar:
            tar.extractall(into, filter="data")
    return commit


# MT-Bench's sub-categories, as metasd.benchmark.bench.MT_BENCH names them (this script imports no torch)
MT_BENCH_NAMES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


EXAMPLES = ROOT / "assets" / "examples.json"  # `--prompts examples`: the page's own, as `bench` reads them


def select_prompts(path: str | Path, categories: str | None, per_category: int, tasks: bool = False) -> list[dict]:
    """Spec-Bench lines as `bench` selects them: the named categories, the first N of each in file order. With
    `tasks` (bench's --spec-bench-tasks), MT-Bench's eight sub-categories are one task, mt_bench, whose first N
    are taken one from each sub-category in turn (bench.load_prompts' rule); each keeps its category in the chunk's
    file, and bench regroups them itself. `examples` reads the page's examples of this checkout (a JSON list)."""
    if str(path) == "examples":
        lines = json.loads(EXAMPLES.read_text(encoding="utf-8"))
    else:
        lines = [json.loads(ln) for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
    if tasks:
        by_sub = {c: [q for q in lines if q.get("category") == c] for c in MT_BENCH_NAMES}
        mixed = [by_sub[c][i] for i in range(max(map(len, by_sub.values()), default=0)) for c in MT_BENCH_NAMES
                 if i < len(by_sub[c])]
        lines = mixed + [q for q in lines if q.get("category") not in MT_BENCH_NAMES]
    wanted = set(categories.split(",")) if categories else None
    taken: dict[str, int] = {}
    out = []
    for q in lines:
        cat = "mt_bench" if tasks and q.get("category") in MT_BENCH_NAMES else q.get("category", "")
        if (wanted is None or cat in wanted) and (per_category <= 0 or taken.get(cat, 0) < per_category):
            taken[cat] = taken.get(cat, 0) + 1
            out.append(q)
    return out


def chunks(prompts: list[dict], by: str, tasks: bool = False) -> list[list[dict]]:
    if by == "prompt":
        return [[q] for q in prompts]
    if by == "all":
        return [prompts]
    groups: dict[str, list[dict]] = {}
    for q in prompts:
        cat = q.get("category", "")
        groups.setdefault("mt_bench" if tasks and cat in MT_BENCH_NAMES else cat, []).append(q)
    return list(groups.values())


def cpu_line() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"CPU: unknown ({os.cpu_count()} cores)"
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    isa = "AVX-512 with AMX" if "amx_tile" in flags else "AVX-512" if "avx512f" in flags else (
        "AVX2" if "avx2" in flags else "no AVX2")
    return f"CPU: {model}, {isa}, {os.cpu_count()} cores"


def run_chunk(tree: Path, chunk: list[dict], out: Path, bench_args: list[str]) -> float:
    out.mkdir(parents=True, exist_ok=True)
    prompts = out / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(q) + "\n" for q in chunk), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tree), "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "metasd", "bench", "--prompts", str(prompts), "--per-category", "0",
           "--out", str(out), "--quiet", *bench_args]
    t = time.perf_counter()
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench failed in {tree.name} (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - t


def rounds_of(run_dir: Path) -> dict[tuple[str, str], list[tuple]]:
    """(method, question_id) -> the rounds it played, as comparable tuples."""
    f = run_dir / "rounds.csv"
    if not f.exists():
        return {}
    r = pd.read_csv(f, dtype={"question_id": str})
    cols = [c for c in ("drafter", "drafted", "accepted", "emitted") if c in r.columns]
    return {(m, q): [tuple(x) for x in g[cols].itertuples(index=False)]
            for (m, q), g in r.groupby(["method", "question_id"], sort=False)}


def table(results: pd.DataFrame, same: dict[str, tuple[int, int]], labels: tuple[str, str]) -> pd.DataFrame:
    a, b = labels
    rows = []
    for method, g in results.groupby("method", sort=False):
        row: dict[str, object] = {"method": method}
        for label in labels:
            r = g[g.rev == label]
            rounds = r.target_calls.sum()
            row[f"{label} tok/s"] = r.new_tokens.sum() / r.wall_s.sum() if len(r) else float("nan")
            row[f"{label} rounds"] = int(rounds)
            # Accepted draft ids per target call over the whole run (each prompt weighted by its calls).
            row[f"{label} accepted/call"] = ((r.mean_accepted * r.target_calls).sum() / rounds
                                             if "mean_accepted" in r and rounds else float("nan"))
            for part in ("draft", "verify", "overhead"):
                col = f"{part}_s"
                row[f"{label} {part} ms/round"] = (1000 * r[col].sum() / rounds if col in r and rounds else float("nan"))
        row["B/A"] = row[f"{b} tok/s"] / row[f"{a} tok/s"]
        n_same, n = same.get(method, (0, 0))
        row["same rounds"] = f"{n_same} of {n}" if n else "n/a"
        rows.append(row)
    out = pd.DataFrame(rows)
    base = out[out.method == "baseline"]
    if len(base):  # each revision's methods over its own target alone, as bench's summary gives them
        for label in labels:
            out[f"{label} over baseline"] = out[f"{label} tok/s"] / float(base[f"{label} tok/s"].iloc[0])
        for label in labels:  # and after the prompt's pass, where the build times the target alone's
            after = after_prompt(results[results.rev == label])
            if after:
                out[f"{label} after the prompt"] = out.method.map(after)
    return out


def after_prompt(r: pd.DataFrame) -> dict[str, float]:
    """Each method's speed-up over the target alone with every run's prompt pass (`prefill_s`) taken out of its
    wall time, on the same prompts; none where a run lacks the figure (builds before the baseline's was timed).
    The sum `metasd.benchmark.tables.summarize` makes, but over every pair's run of a prompt (`--pairs N` gives
    a method N rows a prompt, where summarize expects one)."""
    if "prefill_s" not in r:
        return {}
    rest = (r.wall_s - r.prefill_s).groupby([r.method, r.question_id]).sum(min_count=1)
    if "baseline" not in rest.index.get_level_values(0) or rest["baseline"].isna().any():
        return {}
    base = rest["baseline"]
    out = {}
    for method in dict.fromkeys(r.method):
        mine = rest[method]
        if not mine.isna().any() and set(mine.index) <= set(base.index):
            out[method] = float(base[mine.index].sum() / mine.sum())
    return out


def with_methods(bench_args: list[str], extra: str) -> list[str]:
    """`bench_args` with the comma-separated `extra` methods added to its --methods (or as its --methods)."""
    if not extra:
        return bench_args
    out = list(bench_args)
    for i, arg in enumerate(out):
        if arg == "--methods" and i + 1 < len(out):
            out[i + 1] = f"{out[i + 1]},{extra}"
            return out
        if arg.startswith("--methods="):
            out[i] = f"{arg},{extra}"
            return out
    return [*out, "--methods", extra]


def markdown(t: pd.DataFrame) -> str:
    """A Markdown table (pandas' own needs tabulate, which the project does not install)."""
    def cell(x: object) -> str:
        return f"{x:.2f}" if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(t.columns) + " |", "|" + "---|" * len(t.columns)]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in t.itertuples(index=False)]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="other options go to `bench` unchanged")
    ap.add_argument("rev_a")
    ap.add_argument("rev_b")
    ap.add_argument("--prompts", default=str(ROOT.parent / "shared" / "specbench" / "question.jsonl"),
                    help="a Spec-Bench JSONL file, or `examples` (the page's own)")
    ap.add_argument("--categories", default=None)
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=1, help="how many times both revisions run every chunk")
    ap.add_argument("--chunk", choices=("category", "prompt", "all"), default="category",
                    help="prompts per bench process (each process loads the model and warms up once)")
    ap.add_argument("--spec-bench-tasks", action="store_true",
                    help="MT-Bench's sub-categories as one task (also passed to bench)")
    ap.add_argument("--work", default=None, help="folder for the exported revisions and the runs (default: a temp one)")
    ap.add_argument("--b-only", default="", metavar="METHODS",
                    help="methods B alone runs, beside --methods in the same bench process (ones A's build lacks)")
    a, bench_args = ap.parse_known_args()

    work = Path(a.work or tempfile.mkdtemp(prefix="metasd-ab-"))
    labels = ("A", "B")
    trees = {label: work / f"rev-{label}" for label in labels}
    commits = {label: export(rev, trees[label]) for label, rev in zip(labels, (a.rev_a, a.rev_b), strict=True)}
    todo = chunks(select_prompts(a.prompts, a.categories, a.per_category, a.spec_bench_tasks), a.chunk,
                  a.spec_bench_tasks)
    if a.spec_bench_tasks:
        bench_args = ["--spec-bench-tasks", *bench_args]
    args_of = {"A": bench_args, "B": with_methods(bench_args, a.b_only)}
    if not todo or not todo[0]:
        sys.exit("no prompts selected")
    print(cpu_line(), flush=True)
    print(f"A = {a.rev_a} ({commits['A'][:10]}), B = {a.rev_b} ({commits['B'][:10]}); {sum(map(len, todo))} prompts "
          f"in {len(todo)} chunks, {a.pairs} pair(s); bench {' '.join(bench_args)}; work: {work}", flush=True)
    frames, same_count = [], {}
    total, done_runs, t0 = 2 * len(todo) * a.pairs, 0, time.perf_counter()
    for pair in range(a.pairs):
        for k, chunk in enumerate(todo):
            order = labels if (k + pair) % 2 == 0 else labels[::-1]
            dirs = {}
            for label in order:
                dirs[label] = work / "runs" / f"pair{pair + 1}" / f"chunk{k + 1:02d}-{label}"
                spent = run_chunk(trees[label], chunk, dirs[label], args_of[label])
                done_runs += 1
                eta = (time.perf_counter() - t0) / done_runs * (total - done_runs)
                print(f"[{done_runs}/{total}] {label} chunk {k + 1} ({chunk[0].get('category', '')}, {len(chunk)} "
                      f"prompt(s)) {spent:.0f} s; about {eta / 60:.0f} min left", flush=True)
                r = pd.read_csv(dirs[label] / "results.csv", dtype={"question_id": str})
                frames.append(r.assign(rev=label, pair=pair + 1))
            ra, rb = rounds_of(dirs["A"]), rounds_of(dirs["B"])
            for (method, qid), played in ra.items():
                n_same, n = same_count.get(method, (0, 0))
                same_count[method] = (n_same + (rb.get((method, qid)) == played), n + 1)
    results = pd.concat(frames, ignore_index=True)
    t = table(results, same_count, labels)
    results.to_csv(work / "ab-results.csv", index=False)
    t.to_csv(work / "ab.csv", index=False)
    md = (f"{cpu_line()}\n\nA = `{a.rev_a}` ({commits['A'][:10]}), B = `{a.rev_b}` ({commits['B'][:10]}), "
          f"`bench {' '.join(bench_args)}`, {sum(map(len, todo))} prompts, {a.pairs} pair(s), interleaved by "
          f"{a.chunk}\n\n" + markdown(t) + "\n")
    (work / "ab.md").write_text(md, encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
