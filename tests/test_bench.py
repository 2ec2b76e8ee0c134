"""The benchmark itself, on tiny random models: its tables, its flags, its ratios and its CLI.

No assertion here depends on how fast anything ran: ratios are tested on tables built by hand.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from metasd.benchmark import bench
from metasd.benchmark.bench import (
    RESULT_COLUMNS,
    Method,
    Prompt,
    load_prompts,
    parse_methods,
    run_bench,
    run_method,
    write_outputs,
)
from metasd.benchmark.tables import BenchResult, over_default_kernels, speedup_table, summarize, summary_markdown
from metasd.core.validation import InvalidInput
from tests.tiny import tiny_bundle

CONTRACT_COLUMNS = ["method", "question_id", "category", "new_tokens", "wall_s", "target_calls", "mean_accepted",
                    "identical_to_baseline"]
TINY_DRAFTERS = ["prompt-lookup", "token-recycling", "layer-skip", "tiny-lm"]
QUESTIONS = [
    {"question_id": 1, "category": "summarization", "turns": ["Summarize: the cat sat on the mat. The cat sat.", "x"]},
    {"question_id": 2, "category": "summarization", "turns": ["Summarize: a dog ran in the park, a dog ran far."]},
    {"question_id": 3, "category": "translation", "turns": ["Translate to French: good morning, my friend."]},
    {"question_id": 4, "category": "translation", "turns": ["Translate to German: the house is red."]},
]


@pytest.fixture(scope="module")
def tokenizer():
    """The offline preset's real tokenizer where it is available (converted once), else none."""
    from transformers import AutoTokenizer

    from metasd.decoding.loading import offline_target_dir

    path = offline_target_dir(progress=lambda m: None)
    return AutoTokenizer.from_pretrained(str(path)) if path is not None else None


@pytest.fixture(scope="module")
def bundle(tokenizer):
    vocab = len(tokenizer) if tokenizer is not None else 64
    return tiny_bundle(vocab=vocab, tokenizer=tokenizer, scale=4.0)


@pytest.fixture()
def questions_file(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# Methods and prompts


def test_default_methods_and_syntax():
    ms = parse_methods(None, TINY_DRAFTERS, ["layer-skip", "tiny-lm"])
    singles = [f"single:{d}" for d in TINY_DRAFTERS]
    assert [m.name for m in ms] == ["baseline", "baseline:default-kernels", "hf-pld", *singles, "metasd-ucb",
                                    "metasd-ucb-cost", "metasd-tree", "oracle"]
    ms = parse_methods("hf-pld:3,hf-assisted:tiny-lm,metasd-ucb/throughput,hedge,single:layer-skip", TINY_DRAFTERS,
                       ["layer-skip", "tiny-lm"], reward="be")
    by = {m.name: m for m in ms}
    assert ms[0].kind == "baseline"  # added: every ratio needs it
    assert by["hf-pld:3"].lookup == 3
    assert by["hf-assisted:tiny-lm"].drafter == "tiny-lm"
    assert (by["metasd-ucb/throughput"].policy, by["metasd-ucb/throughput"].reward) == ("metasd-ucb", "throughput")
    assert by["hedge"].reward == "be"  # the --reward default
    assert by["single:layer-skip"].single and by["single:layer-skip"].drafter == "layer-skip"


def test_arms_added_and_left_out():
    """`+d` adds an arm to the preset's default ones, `~d` leaves a default arm out; the run plays exactly those."""
    defaults = ["prompt-lookup", "token-recycling"]
    by = {m.name: m for m in parse_methods("metasd-ucb+tiny-lm~token-recycling,hedge~prompt-lookup@cold",
                                           TINY_DRAFTERS, ["layer-skip", "tiny-lm"], default_arms=defaults)}
    m = by["metasd-ucb+tiny-lm~token-recycling"]
    assert (m.policy, m.extra, m.dropped) == ("metasd-ucb", ("tiny-lm",), ("token-recycling",))
    assert m.arms(defaults) == ["prompt-lookup", "tiny-lm"]
    assert by["hedge~prompt-lookup@cold"].cold and by["hedge~prompt-lookup@cold"].arms(defaults) == ["token-recycling"]
    assert by["baseline"].arms(defaults) is None  # no marks: the preset's own defaults


def test_arms_that_cannot_be_played_are_refused():
    defaults = ["prompt-lookup", "token-recycling"]
    for spec, message in [("metasd-ucb~prompt-lookup~token-recycling", "no arm"),
                          ("metasd-ucb~tiny-lm", "not a default arm"),
                          ("metasd-ucb+tiny-lm~tiny-lm", "both added"),
                          ("metasd-ucb~nope", "unknown drafter"),
                          ("single:tiny-lm~prompt-lookup", "plays alone")]:
        with pytest.raises(InvalidInput, match=message):
            parse_methods(spec, TINY_DRAFTERS, ["layer-skip", "tiny-lm"], default_arms=defaults)


def test_a_run_plays_only_its_arms(bundle):
    defaults = bundle.default_drafters
    assert "prompt-lookup" in defaults and len(defaults) > 1
    m, = [x for x in parse_methods(f"metasd-ucb~{defaults[0]}", bundle.drafter_names, list(bundle.models),
                                   default_arms=defaults) if x.kind == "engine"]
    ids = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]  # repeats: prompt lookup has something to draft
    o = run_method(bundle, m, ids, 12)
    assert o.pulls and defaults[0] not in o.pulls and set(o.pulls) <= set(defaults[1:])


@pytest.mark.parametrize("spec, message", [
    ("nope", "unknown method"),
    ("single:nope", "unknown drafter"),
    ("hf-assisted:prompt-lookup", "model drafter"),
    ("metasd-ucb/fast", "unknown reward"),
    ("hf-pld:0", "hf-pld:N"),
    ("baseline,metasd-ucb,oracle", "oracle"),
])
def test_bad_methods_are_refused(spec, message):
    with pytest.raises(InvalidInput, match=message):
        parse_methods(spec, TINY_DRAFTERS, ["layer-skip", "tiny-lm"])


def test_load_prompts_filters_and_keeps_order(questions_file):
    ps = load_prompts(questions_file)
    assert [p.question_id for p in ps] == [1, 2, 3, 4]
    assert ps[0].text.startswith("Summarize: the cat")  # the first turn only
    ps = load_prompts(questions_file, categories="translation,summarization", per_category=1)
    assert [(p.question_id, p.category) for p in ps] == [(1, "summarization"), (3, "translation")]
    with pytest.raises(InvalidInput, match="unknown category 'poetry'"):
        load_prompts(questions_file, categories="poetry")
    with pytest.raises(InvalidInput, match="no prompts file"):
        load_prompts(questions_file.parent / "missing.jsonl")


# --------------------------------------------------------------------------------------------
# Running on a tiny model

TINY_METHODS = ("baseline,baseline:default-kernels,hf-pld,hf-pld:3,hf-assisted:tiny-lm,hf-assisted:layer-skip,"
                "single:prompt-lookup,single:token-recycling,single:tiny-lm,metasd-ucb,metasd-ucb/throughput,hedge,exp3,oracle")


@pytest.fixture(scope="module")
def tiny_result(bundle):
    prompts = [Prompt(q["question_id"], q["category"], q["turns"][0]) for q in QUESTIONS[::2]]
    methods = parse_methods(TINY_METHODS, bundle.drafter_names, list(bundle.models))
    return run_bench(bundle, prompts, methods, max_new_tokens=12, warmup=False, progress=False, log=lambda m: None)


def test_results_have_the_contract_columns_and_one_row_per_method_and_prompt(tiny_result):
    res = tiny_result.results
    assert list(res.columns[: len(CONTRACT_COLUMNS)]) == CONTRACT_COLUMNS
    assert list(res.columns) == RESULT_COLUMNS
    n_methods = len(TINY_METHODS.split(","))
    assert len(res) == 2 * n_methods
    assert res.groupby("method").size().eq(2).all()
    assert set(res["category"]) == {"summarization", "translation"}


def test_greedy_outputs_are_identical_to_the_baseline(tiny_result):
    res = tiny_result.results
    assert res["identical_to_baseline"].all(), res[~res["identical_to_baseline"]][["method", "first_mismatch"]]
    assert (res["first_mismatch"] == -1).all()
    assert (res["new_tokens"] == 12).all()  # a random tiny model does not stop early


def test_calls_accepted_and_time_split_are_consistent(tiny_result):
    res = tiny_result.results.set_index(["method", "question_id"])
    base = res.loc["baseline"]
    assert (base["target_calls"] == base["new_tokens"]).all()  # one forward call per token
    assert (base["mean_accepted"] == 0).all()
    for name in ("hf-pld", "hf-assisted:tiny-lm", "single:tiny-lm", "metasd-ucb", "hedge"):
        r = res.loc[name]
        assert (r["target_calls"] >= 1).all() and (r["target_calls"] <= r["new_tokens"]).all()
        # Each call emits its accepted tokens plus one of the target's own.
        assert ((r["mean_accepted"] + 1) * r["target_calls"] >= r["new_tokens"] - 1e-9).all()
    ours = res[res["draft_s"].notna()]
    assert set(ours.index.get_level_values(0)) == {"single:prompt-lookup", "single:token-recycling", "single:tiny-lm",
                                                   "metasd-ucb", "metasd-ucb/throughput", "hedge", "exp3", "oracle"}
    parts = ours[["prefill_s", "draft_s", "verify_s", "overhead_s"]].sum(axis=1)
    assert (parts <= ours["wall_s"] + 1e-6).all()
    assert res.loc["single:tiny-lm", "drafter_pulls"].str.startswith("tiny-lm=").all()
    rounds = tiny_result.rounds
    assert set(rounds["method"]) == set(ours.index.get_level_values(0)) - {"oracle"}
    per = rounds.groupby(["method", "question_id"])["emitted"].sum()
    assert (per == 12).all()
    assert (rounds["ids_verified"] == rounds["drafted"] + 1).all()  # a chain reads the last id and its draft


def test_every_run_times_its_prompts_pass(tiny_result):
    """The target alone's prompt pass is its first forward call: timed, shorter than its run; so are ours."""
    res = tiny_result.results.set_index(["method", "question_id"])
    for name in ("baseline", "hf-pld", "hf-assisted:tiny-lm", "single:tiny-lm", "metasd-ucb"):
        r = res.loc[name]
        assert (r["prefill_s"] > 0).all() and (r["prefill_s"] < r["wall_s"]).all(), name
    s = summarize(tiny_result.results).set_index(["method", "category"])
    assert s.loc[("baseline", "overall"), "after_prompt_speedup"] == pytest.approx(1.0)
    assert s["after_prompt_speedup"].notna().all()


def test_oracle_is_the_fastest_single_drafter_of_each_prompt(tiny_result):
    res = tiny_result.results
    singles = res[res["method"].str.startswith("single:")]
    for qid, g in singles.groupby("question_id"):
        best = g.loc[g["wall_s"].idxmin()]
        o = res[(res["method"] == "oracle") & (res["question_id"] == qid)].iloc[0]
        assert o["oracle_choice"] == best["method"]
        assert o["wall_s"] == best["wall_s"] and o["target_calls"] == best["target_calls"]


# --------------------------------------------------------------------------------------------
# Summaries, on tables built by hand


def _table(walls: dict[str, list[float]], calls: dict[str, list[int]] | None = None) -> pd.DataFrame:
    cats = ["writing", "writing", "rag"]
    rows = []
    for m, ws in walls.items():
        for i, w in enumerate(ws):
            c = (calls or {}).get(m, [10] * len(ws))[i]
            rows.append({"method": m, "question_id": i + 1, "category": cats[i], "new_tokens": 10, "wall_s": w,
                         "target_calls": c, "mean_accepted": 10 / c - 1, "identical_to_baseline": not (m == "slow" and i == 0),
                         "draft_s": math.nan if m == "baseline" else 0.1, "verify_s": math.nan if m == "baseline" else 0.5,
                         "overhead_s": math.nan if m == "baseline" else 0.01, "prefill_s": math.nan if m == "baseline" else 0.05,
                         "oracle_choice": ""})
    return pd.DataFrame(rows)


def test_a_slower_method_shows_a_lower_speedup():
    df = _table({"baseline": [2.0, 2.0, 3.0], "fast": [1.0, 1.0, 1.0], "slow": [4.0, 4.0, 6.0]},
                calls={"fast": [5, 5, 2], "slow": [10, 10, 10]})
    s = summarize(df).set_index(["method", "category"])
    assert s.loc[("baseline", "overall"), "speedup"] == pytest.approx(1.0)
    assert s.loc[("fast", "writing"), "speedup"] == pytest.approx(4.0 / 2.0)
    assert s.loc[("fast", "rag"), "speedup"] == pytest.approx(3.0)
    assert s.loc[("fast", "overall"), "speedup"] == pytest.approx(7.0 / 3.0)  # sums, not a mean of ratios
    assert s.loc[("slow", "overall"), "speedup"] == pytest.approx(0.5)
    overall = s.xs("overall", level="category")["speedup"]
    assert overall["slow"] < overall["baseline"] < overall["fast"]
    # accepted per call is weighted by calls: (5 + 5 + 8) accepted over 12 calls
    assert s.loc[("fast", "overall"), "mean_accepted"] == pytest.approx(18 / 12)
    assert s.loc[("fast", "overall"), "calls_per_token"] == pytest.approx(12 / 30)
    assert s.loc[("slow", "writing"), "identical"] == pytest.approx(0.5)
    assert s.loc[("slow", "overall"), "identical"] == pytest.approx(2 / 3)
    t = speedup_table(summarize(df))
    assert list(t.index) == ["baseline", "fast", "slow"] and list(t.columns) == ["writing", "rag", "overall"]
    assert over_default_kernels(summarize(df)) is None
    # No prompt pass timed for the baseline: no speed-up after it, anywhere (never a sum over some prompts).
    assert s["after_prompt_speedup"].isna().all()


def test_the_speed_up_after_the_prompts_pass():
    """Each run's prompt pass out of its wall time, summed per group: what the rounds gain."""
    df = _table({"baseline": [2.0, 2.0, 3.0], "fast": [1.0, 1.0, 1.0]})
    df["prefill_s"] = [0.5, 0.5, 1.0, 0.4, 0.4, 0.5]  # baseline's three, then fast's
    s = summarize(df).set_index(["method", "category"])
    assert s.loc[("fast", "writing"), "after_prompt_speedup"] == pytest.approx((1.5 + 1.5) / (0.6 + 0.6))
    assert s.loc[("fast", "rag"), "after_prompt_speedup"] == pytest.approx(2.0 / 0.5)
    assert s.loc[("fast", "overall"), "after_prompt_speedup"] == pytest.approx(5.0 / 1.7)
    assert s.loc[("fast", "overall"), "speedup"] == pytest.approx(7.0 / 3.0)  # whole answers: lower
    df.loc[5, "prefill_s"] = math.nan  # one run without the figure: its groups have none
    s = summarize(df).set_index(["method", "category"])
    assert s.loc[("fast", "writing"), "after_prompt_speedup"] == pytest.approx(2.5)
    assert math.isnan(s.loc[("fast", "rag"), "after_prompt_speedup"])
    assert math.isnan(s.loc[("fast", "overall"), "after_prompt_speedup"])


def test_speedups_over_the_target_alone_with_default_kernels():
    """The stricter yardstick: each method's time against the default-kernel target's on the same prompts."""
    df = _table({"baseline": [2.0, 2.0, 3.0], "baseline:default-kernels": [1.5, 1.5, 3.0], "fast": [1.0, 1.0, 1.0]})
    t = over_default_kernels(summarize(df))
    assert t.loc["baseline:default-kernels"].tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert t.loc["fast", "writing"] == pytest.approx(3.0 / 2.0)
    assert t.loc["fast", "overall"] == pytest.approx(6.0 / 3.0)
    assert t.loc["baseline", "overall"] == pytest.approx(6.0 / 7.0)  # slower than the default kernels here


def test_summary_markdown_and_files(tiny_result, tmp_path):
    md = summary_markdown(tiny_result)
    for needle in ("## Speed-up over the baseline", "## Speed-up after the prompt's pass", "## Per method and category",
                   "overall", "speed-up",
                   "accepted/call", "calls/token", "identical", "hf-assisted:tiny-lm", "Where our engine's time goes",
                   "Every output is identical"):
        assert needle in md
    # The second yardstick's section only where the target's layers were packed (the tiny model's are not).
    assert tiny_result.meta["packed_layers"] == 0 and "torch's default kernels" not in md
    # The pass's probed price that the run's plans read is kept and said (a busy moment at the probe shows there).
    prof = tiny_result.meta["verify_profile"]
    assert prof[0][0] == 1 and all(a[1] <= b[1] for a, b in zip(prof, prof[1:], strict=False)), prof
    assert f"one id {prof[0][1]:.1f} ms; 2 ids {prof[1][1] / prof[0][1]:.2f}" in md
    untimed = tiny_result.results.assign(prefill_s=tiny_result.results["prefill_s"].where(
        tiny_result.results["method"] != "baseline"))  # results of a build that did not time the baseline's
    assert "after the prompt's pass" not in summary_markdown(BenchResult(untimed, tiny_result.rounds, tiny_result.meta))
    packed = BenchResult(tiny_result.results, tiny_result.rounds, {**tiny_result.meta, "packed_layers": 22})
    assert "## Speed-up over the target alone with torch's default kernels" in summary_markdown(packed)
    paths = write_outputs(tiny_result, tmp_path / "out")
    res = pd.read_csv(paths["results.csv"])
    assert list(res.columns) == RESULT_COLUMNS
    assert res["identical_to_baseline"].all()
    html = paths["report.html"].read_text(encoding="utf-8")
    assert "plotly" in html.lower() and "Speed-up over the baseline" in html and "(what the rounds gain)" in html
    assert paths["summary.md"].read_text(encoding="utf-8") == md


# --------------------------------------------------------------------------------------------
# The command line, end to end, with the tiny bundle injected


def test_cli_bench_end_to_end(bundle, questions_file, tmp_path, monkeypatch, capsys):
    import metasd.decoding.loading
    from metasd.cli import main

    monkeypatch.setattr(metasd.decoding.loading, "load_bundle", lambda *a, **k: bundle)
    out = tmp_path / "bench-out"
    rc = main(["bench", "--prompts", str(questions_file), "--categories", "summarization,translation",
               "--per-category", "1", "--max-new-tokens", "6", "--methods",
               "baseline,hf-pld,single:prompt-lookup,single:layer-skip,metasd-ucb,oracle", "--out", str(out), "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "## Speed-up over the baseline" in printed and "overall" in printed
    res = pd.read_csv(out / "results.csv")
    assert list(res.columns[: len(CONTRACT_COLUMNS)]) == CONTRACT_COLUMNS
    assert len(res) == 2 * 6 and set(res["question_id"]) == {1, 3}
    assert res["identical_to_baseline"].all()
    assert (out / "summary.md").read_text(encoding="utf-8") in printed
    assert (out / "report.html").exists()


def test_cli_bench_reports_bad_input(questions_file, tmp_path, capsys):
    from metasd.cli import main

    rc = main(["bench", "--prompts", str(questions_file), "--categories", "poetry", "--out", str(tmp_path / "o")])
    assert rc == 2
    assert "unknown category 'poetry'" in capsys.readouterr().err
    rc = main(["bench", "--prompts", str(questions_file), "--methods", "baseline,warp-drive", "--out", str(tmp_path / "o")])
    assert rc == 2


def test_repeats_keep_each_methods_fastest_run(bundle, monkeypatch):
    import dataclasses

    import metasd.benchmark.bench as bench

    real = bench.run_method
    calls: list[tuple[str, float]] = []
    walls = iter([3.0, 1.0, 2.0, 5.0, 4.0, 6.0, 0.5, 7.0, 8.0] * 10)

    def scripted(b, method, ids, max_new_tokens, **kw):
        o = dataclasses.replace(real(b, method, ids, max_new_tokens, **kw), wall_s=next(walls))
        calls.append((method.name, o.wall_s))
        return o

    monkeypatch.setattr(bench, "run_method", scripted)
    methods = parse_methods("baseline,single:prompt-lookup,metasd-ucb", bundle.drafter_names, list(bundle.models))
    res = run_bench(bundle, [Prompt(1, "summarization", QUESTIONS[0]["turns"][0])], methods, max_new_tokens=6,
                    warmup=False, progress=False, repeats=3)
    assert len(calls) == 9 and res.meta["repeats"] == 3
    for name in ("baseline", "single:prompt-lookup", "metasd-ucb"):
        mine = [w for n, w in calls if n == name]
        assert len(mine) == 3
        assert res.results.set_index("method").loc[name, "wall_s"] == min(mine)
    assert "fastest of 3 interleaved runs" in summary_markdown(res)
    with pytest.raises(InvalidInput, match="repeats"):
        run_bench(bundle, [Prompt(1, "x", "hello")], methods, max_new_tokens=4, progress=False, repeats=0)


def test_run_bench_needs_a_baseline(bundle):
    with pytest.raises(InvalidInput, match="baseline"):
        run_bench(bundle, [Prompt(1, "x", "hello")], [Method("metasd-ucb", "engine", policy="metasd-ucb", reward="bd")],
                  max_new_tokens=4, progress=False)


def test_prompts_come_only_from_the_file_named(tmp_path):
    """The benchmark carries no prompts of its own: it runs exactly what the named file holds, refuses a
    missing file instead of falling back to anything, and `examples` is the page's own examples file."""
    from metasd import paths
    from metasd.benchmark.bench import load_prompts

    mine = [{"question_id": 7, "category": "zz-own", "turns": ["a prompt no one else has: 4f1c9"]},
            {"question_id": 9, "category": "zz-own", "turns": ["and its sibling: 0b7e2", "a second turn"]}]
    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in mine), encoding="utf-8")
    got = load_prompts(f)
    assert [(p.question_id, p.category, p.text) for p in got] == [(7, "zz-own", mine[0]["turns"][0]),
                                                                 (9, "zz-own", mine[1]["turns"][0])]
    with pytest.raises(InvalidInput, match="no prompts file"):
        load_prompts(tmp_path / "missing.jsonl")
    shipped = json.loads(paths.EXAMPLES_FILE.read_text(encoding="utf-8"))
    assert [p.text for p in load_prompts("examples")] == [e["turns"][0] for e in shipped]


def test_prompts_run_round_robin_over_categories():
    ps = [Prompt(i, c, "x") for i, c in enumerate(["a", "a", "b", "b", "c"])]
    order = [p.question_id for p, _ in bench._round_robin([(p, [1]) for p in ps])]
    assert order == [0, 2, 4, 1, 3]  # a run cut short has already seen every category


def test_spec_bench_tasks_group_mt_bench(tmp_path):
    from metasd.benchmark.bench import load_prompts

    lines = [{"question_id": i, "category": c, "turns": [f"q{i}"]}
             for i, c in enumerate(["writing", "writing", "coding", "coding", "rag", "rag"])]
    f = tmp_path / "q.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")
    grouped = load_prompts(f, per_category=2, spec_bench_tasks=True)
    # One from each MT-Bench sub-category in turn, then the other tasks unchanged.
    assert [(p.question_id, p.category) for p in grouped] == [(0, "mt_bench"), (2, "mt_bench"), (4, "rag"), (5, "rag")]
    plain = load_prompts(f, per_category=1)
    assert [p.category for p in plain] == ["writing", "coding", "rag"]


def test_ab_bench_selects_chunks_and_tabulates_two_revisions(tmp_path):
    """scripts/ab_bench.py: prompts chosen as `bench` chooses them, chunked by category, and the table's
    tokens/s, B over A, per-round time split and same-rounds count from two revisions' results."""
    import pandas as pd

    from scripts.ab_bench import chunks, markdown, select_prompts, table

    lines = [{"question_id": str(i), "category": c, "turns": [f"q{i}"]}
             for i, c in enumerate(["a", "a", "b", "a", "b", "c"])]
    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    picked = select_prompts(f, "a,b", 2)
    assert [q["question_id"] for q in picked] == ["0", "1", "2", "4"]
    assert [[q["question_id"] for q in c] for c in chunks(picked, "category")] == [["0", "1"], ["2", "4"]]
    assert len(chunks(picked, "prompt")) == 4 and len(chunks(picked, "all")) == 1
    # `examples`, as bench reads it: the page's own examples, the same ones in the same order
    from metasd.benchmark.bench import load_prompts
    mine = select_prompts("examples", "qa,chat", 1)
    assert [q["question_id"] for q in mine] == [p.question_id for p in load_prompts("examples", "qa,chat", 1)]
    assert [q["category"] for q in mine] == ["qa", "chat"]

    def rows(rev: str, wall: float, verify: float) -> list[dict]:
        return [{"method": "single:x", "question_id": q, "new_tokens": 64, "wall_s": wall, "target_calls": calls,
                 "mean_accepted": acc, "draft_s": 0.032, "verify_s": verify, "overhead_s": 0.064, "rev": rev}
                for q, calls, acc in (("1", 32, 1.0), ("2", 32, 0.5))]

    results = pd.DataFrame(rows("A", 4.0, 2.4) + rows("B", 3.2, 1.6))
    t = table(results, {"single:x": (2, 2)}, ("A", "B"))
    row = t.iloc[0]
    assert row["A tok/s"] == 16.0 and row["B tok/s"] == 20.0 and row["B/A"] == 1.25
    assert row["A verify ms/round"] == 75.0 and row["B verify ms/round"] == 50.0 and row["A draft ms/round"] == 1.0
    assert row["same rounds"] == "2 of 2" and row["A accepted/call"] == 0.75
    assert "| single:x | 16.00 | 64 | 0.75 | 1.00 | 75.00 | 2.00 | 20.00 |" in markdown(t)
    # After the prompt's pass: only for a revision whose target alone has its prompt pass timed.
    base = pd.DataFrame([{"method": "baseline", "question_id": q, "new_tokens": 64, "wall_s": 6.0, "target_calls": 64,
                          "mean_accepted": 0.0, "rev": rev, "prefill_s": p}
                         for q in ("1", "2") for rev, p in (("A", float("nan")), ("B", 1.0))])
    timed = pd.concat([base, results.assign(prefill_s=[float("nan")] * 2 + [0.2, 1.0])])
    t = table(timed, {}, ("A", "B"))
    assert "A after the prompt" not in t.columns
    got = dict(zip(t.method, t["B after the prompt"], strict=True))
    assert got["baseline"] == 1.0 and got["single:x"] == pytest.approx((5.0 + 5.0) / (3.0 + 2.2))


def test_ab_bench_b_only_methods_and_speed_up_over_each_baseline():
    """`--b-only`: methods joined to B's --methods alone (A's build may lack them); each revision's speed-up
    over its own baseline; a method only B ran has no A figures and no B/A."""
    import pandas as pd

    from scripts.ab_bench import table, with_methods

    args = ["--threads", "1", "--methods", "baseline,single:x"]
    assert with_methods(args, "metasd-tree") == ["--threads", "1", "--methods", "baseline,single:x,metasd-tree"]
    assert with_methods(["--methods=baseline"], "t") == ["--methods=baseline,t"]
    assert with_methods(["--threads", "1"], "t") == ["--threads", "1", "--methods", "t"]
    assert with_methods(args, "") == args

    def row(method: str, rev: str, wall: float) -> dict:
        return {"method": method, "question_id": "1", "new_tokens": 64, "wall_s": wall, "target_calls": 32,
                "mean_accepted": 1.0, "draft_s": 0.0, "verify_s": 1.0, "overhead_s": 0.0, "rev": rev}

    results = pd.DataFrame([row("baseline", "A", 8.0), row("baseline", "B", 4.0), row("single:x", "A", 4.0),
                            row("single:x", "B", 2.0), row("metasd-tree", "B", 1.0)])
    t = table(results, {}, ("A", "B")).set_index("method")
    assert t.loc["single:x", "A over baseline"] == 2.0 and t.loc["single:x", "B over baseline"] == 2.0
    assert t.loc["metasd-tree", "B over baseline"] == 4.0
    assert pd.isna(t.loc["metasd-tree", "A tok/s"]) and pd.isna(t.loc["metasd-tree", "B/A"])
