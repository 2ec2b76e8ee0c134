"""Sampling is lossless: MetaSD's output distribution equals the target's (chi-square tests).

Tiny vocabularies make the exact joint distribution of the first tokens cheap to enumerate,
so every test compares counts against exact probabilities, not against another sampler.
"""

from __future__ import annotations

import itertools
import random
import time

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from metasd import run
from metasd.core.costs import fixed_prices
from metasd.core.sampling import Sampling, verify, warp
from metasd.drafting.drafters import fit_vocab
from tests.tiny import tiny_bundle

VOCAB, N_TOKENS, SAMPLES = 6, 3, 1200


def exact_joint(model, prompt: list[int], s: Sampling, n: int = N_TOKENS, vocab_out: int = VOCAB) -> dict:
    """P(first n generated tokens) under `model` with warping `s`, by enumeration."""
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    with torch.inference_mode():
        for _ in range(n):
            nxt = {}
            for prefix, pr in probs.items():
                logits = model(torch.tensor([prompt + list(prefix)])).logits[0, -1]
                p = warp(fit_vocab(logits, vocab_out, vocab_out), s)
                for t in range(vocab_out):
                    if p[t] > 0:
                        nxt[prefix + (t,)] = pr * float(p[t])
            probs = nxt
    return probs


def impossible(counts: dict, expected_probs: dict) -> list:
    """Sampled sequences to which `expected_probs` gives probability 0."""
    return [c for c in counts if expected_probs.get(c, 0.0) == 0.0]


def chi_square_p(counts: dict, expected_probs: dict, total: int) -> float:
    """p-value of observed counts against exact probabilities; cells expecting < 5 are merged."""
    zero = impossible(counts, expected_probs)
    assert not zero, f"sampled sequences the target gives probability 0: {zero[:5]}"
    cells = list(itertools.product(range(VOCAB), repeat=N_TOKENS))
    obs, exp, rest_o, rest_e = [], [], 0, 0.0
    for c in cells:
        e = expected_probs.get(c, 0.0) * total
        if e >= 5:
            obs.append(counts.get(c, 0))
            exp.append(e)
        else:
            rest_o += counts.get(c, 0)
            rest_e += e
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    exp_arr = np.array(exp) * (sum(obs) / sum(exp))  # guard float rounding in the totals
    return float(chisquare(obs, exp_arr).pvalue)


def sample_counts(bundle, prompt, policy: str, s: Sampling, gamma: int = 2) -> dict:
    counts: dict[tuple[int, ...], int] = {}
    drafted = accepted = 0
    for seed in range(SAMPLES):
        rounds, summary = run(bundle, prompt, policy=policy, gamma=gamma, max_new_tokens=N_TOKENS,
                              temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, seed=seed)
        counts[summary.token_ids] = counts.get(summary.token_ids, 0) + 1
        drafted += sum(len(r.draft) for r in rounds)
        accepted += sum(r.accepted for r in rounds)
    # The test means something only if drafts were both accepted and rejected many times.
    assert accepted > SAMPLES // 10 and drafted - accepted > SAMPLES // 10, (policy, drafted, accepted)
    return counts


CASES = [
    # A model drafter whose vocabulary is smaller: q = 0 on ids where p > 0.
    ("single:tiny-lm", Sampling(1.0), dict(noise=0.8, drafter_vocab=5)),
    # A distilled drafter whose head keeps ids 0, 1, 2, 4 only: q = 0 inside the vocabulary too.
    ("single:tiny-distilled", Sampling(1.0), dict(draft_vocab=(0, 1, 2, 4))),
    # A white-box head (q from the head, on the target's hidden states), its head restricted to 0, 1, 3, 4, 5.
    ("single:tiny-eagle", Sampling(1.0), dict(white_box=(0, 1, 3, 4, 5))),
    # Deterministic drafters (q = one-hot of the draft).
    ("single:token-recycling", Sampling(1.0), {}),
    ("single:prompt-lookup", Sampling(0.8, top_p=0.9), {}),
    # A bandit switching between all of them, with top-k warping on both p and q.
    ("uniform", Sampling(1.2, top_k=4), dict(noise=0.5)),
    # The cost-aware bandit with sleeping arms: its choices (and plain steps) depend on timings.
    ("metasd-ucb-cost", Sampling(1.0), dict(noise=0.5)),
]


@pytest.mark.parametrize("policy,s,kw", CASES, ids=[c[0] for c in CASES])
def test_output_distribution_equals_target(policy, s, kw):
    bundle = tiny_bundle(vocab=VOCAB, seed=11, scale=3.0, **kw)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]  # repetitive, so prompt lookup drafts
    target_p = exact_joint(bundle.target, prompt, s)
    counts = sample_counts(bundle, prompt, policy, s)
    p = chi_square_p(counts, target_p, SAMPLES)
    assert p > 1e-3, f"{policy}: output distribution differs from the target's (chi-square p={p:.2e})"
    if policy in ("single:tiny-lm", "single:tiny-distilled", "single:tiny-eagle"):
        # The test has power: the same counts are clearly not the drafter's own distribution.
        # (The drafter cannot even produce id 5, which the output contains.)
        name = policy.removeprefix("single:")
        if name == "tiny-eagle":  # the head cannot propose id 2, which the output contains
            assert any(2 in c for c in counts)
        else:
            drafter_p = exact_joint(bundle.models[name], prompt, s)
            assert impossible(counts, drafter_p)


def test_verify_single_position_exact():
    """One drafted position: P(output = x) equals p(x) exactly, computed from verify's own rule."""
    torch.manual_seed(0)
    p_logits = torch.randn(2, 5)
    q = torch.softmax(torch.randn(1, 5), -1)
    q[0, 3] = 0.0  # q has a zero where p does not
    q = q / q.sum()
    s = Sampling(1.0)
    counts = np.zeros(5)
    g = torch.Generator().manual_seed(1)
    n = 20000
    for _ in range(n):
        x = torch.multinomial(q[0], 1, generator=g)
        v = verify(p_logits, x, q, s, g)
        counts[x.item() if v.accepted else v.token] += 1
    p = torch.softmax(p_logits[0].double(), -1).numpy()
    assert chisquare(counts, p / p.sum() * counts.sum()).pvalue > 1e-3


@pytest.mark.parametrize("full", [False, True], ids=["policy-sized", "every-arm-full-depth"])
def test_metasd_tree_output_distribution_equals_target_with_trees_three_deep(full, monkeypatch):
    """Sampled token trees of depth three (gamma 3, four new tokens, so that a first round can hold three drafted
    ids and the target's own): a model drafter's sampled chain (q with zeros: a smaller vocabulary), prompt
    lookup's and token recycling's deterministic chains and their extra candidates, merged into one tree per
    round. As the policy sizes them, and with every awake arm at its full depth."""
    import sys

    from metasd.decoding import tree_round
    from tests.test_tree import _full_trees

    if full:
        _full_trees(monkeypatch)
    deepest = []
    play = tree_round.verify_part

    def seen(req, t):
        deepest.append(max(t.tree.depths, default=0))
        return play(req, t)

    monkeypatch.setattr(tree_round, "verify_part", seen)
    monkeypatch.setattr(sys.modules[__name__], "N_TOKENS", 4)
    s = Sampling(1.0)
    # A peaked target (head scaled 14x): over four tokens half its mass lies in 58 sequences the test can count.
    bundle = tiny_bundle(vocab=VOCAB, seed=11, scale=14.0, noise=0.5, drafter_vocab=5)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    target_p = exact_joint(bundle.target, prompt, s, n=4)
    counts = sample_counts(bundle, prompt, "metasd-tree", s, gamma=3)
    assert max(deepest) == 3 and sum(d >= 2 for d in deepest) > SAMPLES // 10, "trees were not deeper than one"
    p = chi_square_p(counts, target_p, SAMPLES)
    assert p > 1e-3, f"metasd-tree: output distribution differs from the target's (chi-square p={p:.2e})"


@pytest.mark.parametrize("policy", ["metasd-ucb", "exp3", "round-robin", "single:tiny-lm", "single:prompt-lookup"])
def test_a_seeded_sampled_run_repeats_under_policies_that_read_no_clock(policy):
    """docs/DESIGN.md §3 (the web API's `seed`): where the choices read no clock, the seed fixes the text; another
    seed gives other text (the seed does reach the draws)."""
    bundle = tiny_bundle(vocab=32, seed=5, noise=0.5)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]

    def text(seed: int) -> list[int]:
        return list(run(bundle, prompt, policy=policy, temperature=1.0, max_new_tokens=24, seed=seed,
                        chat_template=False)[1].token_ids)

    first = text(7)
    assert text(7) == first and text(7) == first
    assert any(text(s) != first for s in (8, 9)), "the seed does not reach the draws"


@pytest.mark.parametrize("policy,reward", [("metasd-ucb-cost", "bd"), ("metasd-tree", "bd"), ("metasd-ucb", "throughput")])
def test_a_seeded_sampled_run_repeats_under_policies_that_price_their_plans(policy, reward, monkeypatch):
    """docs/DESIGN.md §3: a sampled run plans with fixed prices (costs.Prices), so its seed repeats it even where the
    policy weighs milliseconds; the clock here jumps by a random amount at every reading, and with the clock's prices
    (`prices="measured"`) the same seed then gives other text, which is what this test would see without them."""
    jitter = random.Random(0)
    now = [0.0]

    def clock() -> float:
        now[0] += jitter.choice((0.0005, 0.002, 0.01, 0.5))  # now and then a reading a long pause away
        return now[0]

    monkeypatch.setattr(time, "perf_counter", clock)
    bundle = tiny_bundle(vocab=32, seed=5, noise=0.5)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]

    def text(seed: int, prices: str = "auto") -> tuple[int, ...]:
        _, s = run(bundle, prompt, policy=policy, reward=reward, temperature=1.0, max_new_tokens=64, seed=seed,
                   chat_template=False, prices=prices)
        assert s.config["prices_from"] == ("measured" if prices == "measured" else "nominal")
        return s.token_ids

    first = text(7)
    assert text(7) == first and text(7) == first
    assert any(text(s) != first for s in (8, 9)), "the seed does not reach the draws"
    assert len({text(7, "measured") for _ in range(6)}) > 1, "the clock does not reach the plans: nothing to fix"


def test_greedy_runs_plan_with_the_clock_and_fixed_prices_come_from_costs_json(monkeypatch):
    """`auto` fixes the prices only when sampling (a greedy run's text is the target's whatever the plan); `fixed`
    reads the preset's stored record (verify_ms, drafter_ms) where `drafters --measure --save` wrote one."""
    from metasd.decoding import engine

    bundle = tiny_bundle(vocab=32, seed=5, noise=0.5)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    _, s = run(bundle, prompt, temperature=0.0, max_new_tokens=8, chat_template=False)
    assert s.config["prices"] == "auto" and s.config["prices_from"] == "measured"
    stored = {"verify_ms": [[1, 10.0], [4, 10.0], [8, 30.0]], "drafter_ms": {"tiny-lm": 2.5}}
    monkeypatch.setattr(engine, "cost_entry", lambda preset, threads=None: stored)
    req = engine.prepare(bundle, prompt, temperature=0.0, max_new_tokens=8, chat_template=False, prices="fixed")
    req.start()
    assert req.prices.source == "stored" and req.verify_cost(6) == pytest.approx(20.0)
    assert req.price(req.names.index("tiny-lm")) == 2.5
    i = next(i for i, d in enumerate(req.arms) if d.model_free)  # no stored figure: its family's share of a pass
    assert req.price(i) == pytest.approx(0.01 * 10.0)
    # Prices stored on another kind of device are not this one's: a nominal line instead.
    assert fixed_prices({**stored, "device": "cuda"}, 0.04, "cpu").source == "nominal"
    assert fixed_prices({**stored, "device": "cuda"}, 0.04, "cuda").source == "stored"
    # Nominal on a GPU: a flat line (a few more ids cost about nothing there); on a CPU each id adds its share.
    gpu, cpu = fixed_prices({}, 0.04, "cuda").verify, fixed_prices({}, 0.04, "cpu").verify
    assert len({ms for _, ms in gpu}) == 1 and cpu[-1][1] > cpu[0][1]


def test_a_costs_file_that_does_not_parse_leaves_nominal_prices(tmp_path, monkeypatch):
    """A half-written or hand-broken assets/drafters/costs.json costs a sampled run its stored prices, not its answer."""
    from metasd.core import costs

    broken = tmp_path / "costs.json"
    for text in ('{"offline": {"verify_ms": [[1, 5', "[1, 2]", '{"offline": 3}'):
        broken.write_text(text, encoding="utf-8")
        monkeypatch.setattr(costs, "COSTS_FILE", broken)
        assert costs.cost_entry("offline") == {}
    assert fixed_prices(costs.cost_entry("offline"), 0.04).source == "nominal"


def test_prices_are_kept_per_thread_count_and_a_run_reads_its_own(tmp_path, monkeypatch):
    """`drafters --measure --save` at 1 and then 2 threads keeps both; a sampled run reads the figures of the thread
    count it runs with (one thread's pass has another shape by ids fed than two threads'), else the record's own."""
    from metasd.core import costs
    from metasd.decoding import catalog
    from metasd.decoding.engine import prepare

    file = tmp_path / "costs.json"
    monkeypatch.setattr(costs, "COSTS_FILE", file)
    monkeypatch.setattr(catalog, "COSTS_FILE", file)
    one = {"target_step_ms": 50.0, "drafter_ms": {"tiny-lm": 4.0}, "verify_ms": [[1, 50.0], [8, 100.0]],
           "device": "cpu", "threads": 1, "method": "test"}
    two = {**one, "target_step_ms": 30.0, "drafter_ms": {"tiny-lm": 3.0}, "verify_ms": [[1, 30.0], [8, 36.0]],
           "threads": 2}
    catalog.save_costs("tiny", {"tiny-lm": 0.08}, one)
    catalog.save_costs("tiny", {"tiny-lm": 0.1}, two)
    assert costs.cost_entry("tiny", 1)["verify_ms"] == [[1, 50.0], [8, 100.0]]
    assert costs.cost_entry("tiny", 1)["drafter_ms"] == {"tiny-lm": 4.0}
    assert costs.cost_entry("tiny", 2)["verify_ms"] == [[1, 30.0], [8, 36.0]]
    assert costs.cost_entry("tiny", 4)["verify_ms"] == [[1, 30.0], [8, 36.0]]  # no record of 4: the last measured
    assert costs.cost_entry("tiny")["threads"] == 2
    # The run reads its own thread count's record.
    bundle = tiny_bundle(vocab=32, seed=5, noise=0.5)  # its preset is "tiny"
    before = torch.get_num_threads()
    try:
        for n, at8 in ((1, 100.0), (2, 36.0)):
            torch.set_num_threads(n)
            req = prepare(bundle, [1, 2, 3, 1, 2], temperature=0.7, seed=1, max_new_tokens=4, chat_template=False)
            req.start()
            assert req.prices.source == "stored" and req.verify_cost(8) == pytest.approx(at8)
        # The page's engine worker runs the prompt's pass with more threads than its rounds, and a class's crowd may
        # run with fewer: the driver names the rounds' count, and that is the one read.
        torch.set_num_threads(2)
        req = prepare(bundle, [1, 2, 3, 1, 2], temperature=0.7, seed=1, max_new_tokens=4, chat_template=False)
        req.threads = 1
        req.start()
        assert req.verify_cost(8) == pytest.approx(100.0)
    finally:
        torch.set_num_threads(before)
    # A measurement on another kind of device starts the record afresh.
    catalog.save_costs("tiny", {"tiny-lm": 0.01}, {**one, "device": "cuda"})
    assert list(costs.cost_entry("tiny")["by_threads"]) == ["1"]


def test_costs_records_from_before_and_half_records_read_safely(tmp_path, monkeypatch):
    """A record written before `by_threads` keeps its figures as its own count's when another count is saved; a
    count's record without a curve is not mixed with the record's own; a curve that does not parse reads as none."""
    import json

    from metasd.core import costs
    from metasd.decoding import catalog

    file = tmp_path / "costs.json"
    monkeypatch.setattr(costs, "COSTS_FILE", file)
    monkeypatch.setattr(catalog, "COSTS_FILE", file)
    own = {"c": {"a": 0.1}, "target_step_ms": 30.0, "drafter_ms": {"a": 3.0}, "verify_ms": [[1, 30.0], [8, 36.0]],
           "device": "cpu", "threads": 2}
    file.write_text(json.dumps({"tiny": own}), encoding="utf-8")
    catalog.save_costs("tiny", {"a": 0.08}, {**own, "verify_ms": [[1, 50.0], [8, 100.0]], "threads": 1})
    assert costs.cost_entry("tiny", 2)["verify_ms"] == [[1, 30.0], [8, 36.0]]
    assert costs.cost_entry("tiny", 1)["verify_ms"] == [[1, 50.0], [8, 100.0]]
    file.write_text(json.dumps({"tiny": {**own, "by_threads": {"1": {"drafter_ms": {"a": 9.0}}}}}), encoding="utf-8")
    assert costs.cost_entry("tiny", 1)["drafter_ms"] == {"a": 3.0}
    file.write_text(json.dumps({"tiny": {**own, "by_threads": [1, 2]}}), encoding="utf-8")
    assert costs.cost_entry("tiny", 1)["verify_ms"] == own["verify_ms"]
    catalog.save_costs("tiny", {"a": 0.08}, {**own, "threads": 1})  # a by_threads that is not a map: replaced
    assert sorted(costs.cost_entry("tiny")["by_threads"]) == ["1", "2"]
    for bad in ([[1, "fast"]], [1, 2], {"1": 3}):
        assert fixed_prices({**own, "verify_ms": bad}, 0.04).source == "nominal"
    assert fixed_prices({**own, "drafter_ms": {"a": None}}, 0.04).source == "nominal"


def test_shared_rounds_give_a_request_the_thread_count_of_a_run_alone():
    """In a class the rounds run with fewer threads while several requests run: a request's prices are read for
    the count of a run alone there, whatever its company; a driver's own count is kept."""
    from metasd.serving.batch import Rounds

    bundle = tiny_bundle(vocab=32, seed=5, noise=0.5)
    rounds = Rounds(bundle.target, 2, threads=3, crowd_threads=1)

    class Req:
        threads = None

    def nothing():
        return
        yield

    req, own = Req(), Req()
    own.threads = 2
    for r in (req, own):
        list(rounds.submit(r, nothing()))
    assert req.threads == 3 and own.threads == 2


@pytest.mark.parametrize("args", [["--measure", "--threads", "0"], ["--measure", "--threads", "x"],
                                  ["--measure", "--threads", "1,-2"], ["--threads", "1"]])
def test_drafters_measure_refuses_bad_thread_counts_before_loading(args):
    from metasd.cli import main

    with pytest.raises(SystemExit, match="--threads"):
        main(["drafters", *args])


def test_drafters_measure_prints_a_table_for_every_thread_count(monkeypatch, capsys):
    """`drafters --measure --threads 1,2` without --save shows each count's figures (it showed the last one's only);
    --json gives every row of every count, each with its count."""
    import json
    from types import SimpleNamespace

    import metasd.decoding.catalog as catalog
    import metasd.decoding.loading as loading
    from metasd.cli import main
    from metasd.models.presets import PRESETS

    names = [d.name for d in PRESETS["offline"].drafters]
    monkeypatch.setattr(loading, "load_bundle", lambda preset: SimpleNamespace(specs={n: None for n in names}))
    monkeypatch.setattr(catalog, "measure_costs",
                        lambda bundle, ns, progress=None: ({n: 0.01 * torch.get_num_threads() for n in ns}, {}))
    monkeypatch.setattr(catalog, "save_costs", lambda *a: pytest.fail("saved without --save"))
    threads = torch.get_num_threads()
    try:
        assert main(["drafters", "--measure", "--threads", "1,2"]) == 0
        out = capsys.readouterr().out
        one, two = out.split("at 1 torch thread(s):")[1].split("at 2 torch thread(s):")
        assert "0.010" in one and "0.020" not in one and "0.020" in two, out
        assert main(["drafters", "--measure", "--threads", "1,2", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        assert [(r["threads"], r["cost"]) for r in rows if r["name"] == "retrieval"] == [(1, 0.01), (2, 0.02)]
    finally:
        torch.set_num_threads(threads)
