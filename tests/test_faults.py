"""The shared rounds on every CPU and under faults (metasd/serving/batch.py, metasd/ui/generate.start_rounds):

- a CPU whose kernels give a row other bits beside other rows, at any row count: forced here with a stand-in for the
  packed op, so the fallback runs wherever CI lands. The server then runs every pass in blocks of rows, a lone
  request's included, and each request gets in company what it gets alone;
- the start-up check of the whole shared pass refuses a model whose layout the pass does not compute;
- a token tree (a round with a pass of its own) holds the others for one round at a time, not its whole run;
- a failed pass, or a failed round, ends only what it must; the others go on to their solo outputs.
"""

from __future__ import annotations

import threading
from unittest import mock

import pytest

from metasd.core.events import RoundEvent
from metasd.decoding.engine import collect, generate, prepare, steps
from metasd.models import cpu_linear
from metasd.models.cpu_linear import pack_linears
from metasd.serving import batch
from metasd.serving.batch import Rounds, check_shared_pass, pass_block, row_invariant
from tests.app_server import page_server
from tests.tiny import tiny_bundle

SERVER = page_server()  # this test process's server, shared with the app served in-process

pytestmark = pytest.mark.skipif(cpu_linear._packed_op() is None, reason="this torch has no oneDNN packed linear")


def _varies_unless_a_multiple_of_four(op):
    """A packed op whose bits depend on how many rows a call has unless that is a multiple of four: no padding
    of small calls (min_rows) makes it row-invariant, blocks of four rows do."""
    def by_count(inp, *a):
        out = op(inp, *a)
        n = inp.numel() // inp.shape[-1]
        return out if n % 4 == 0 else out * (1 + (n % 4) * 2**-21)
    return by_count


@pytest.fixture
def variant_bundle(monkeypatch):
    reorder, op = cpu_linear._packed_op()
    monkeypatch.setattr(cpu_linear, "_packed_op", lambda: (reorder, _varies_unless_a_multiple_of_four(op)))
    b = tiny_bundle(vocab=64)
    assert pack_linears(b.target) > 0
    for m in b.models.values():
        if hasattr(m, "model"):
            pack_linears(m)
    return b


def _emitted(events) -> list[int]:
    rounds, _ = collect(events)
    return [t for ev in rounds for t in ev.emitted]


def _kw(i: int, temperature: float = 0.0, policy: str = "metasd-ucb", n: int = 24) -> dict:
    return {"chat_template": False, "max_new_tokens": n, "temperature": temperature, "seed": i, "policy": policy}


PROMPTS = [[1, 2, 3, 4, 5, 6], [9, 8, 7, 6, 5, 4, 3, 2], [4, 4, 4], [7, 1, 7, 1, 7, 1, 7]]


def test_where_no_call_size_is_row_invariant_the_server_shares_passes_in_blocks(variant_bundle):
    """The fallback path, forced: the plain probe fails, blocks of four pass (the smallest tried), the start-up
    line says so with what blocks cost a lone pass, and four runs at once each get exactly what a run alone gets
    from the same server (both through blocked passes: arm, draft, accepted and emitted ids of every round)."""
    from metasd.ui import generate as ui_generate

    b = variant_bundle
    assert not row_invariant(b.target) and pass_block(b.target) == 4
    assert check_shared_pass(b.target, 0) is not None, "without blocks the stand-in must change a row in company"
    assert check_shared_pass(b.target, 4) is None
    slots = SERVER.model.slots
    line = ui_generate.start_rounds(SERVER, b, process=0)
    try:
        assert "in this process (row-wise layers in blocks of 4 rows: " in line, line
        assert "without them this CPU's kernels give a row other bits" in line and "ms without" in line, line
        rounds = SERVER.shared.now
        assert isinstance(rounds, Rounds) and rounds.block == 4 and rounds.share

        def run(p: list[int], i: int) -> list:
            req = prepare(b, p, **_kw(i))
            return [(ev.drafter, ev.draft, ev.accepted, ev.emitted) for ev in collect(rounds.submit(req, steps(req, None)))[0]]

        alone = [run(p, i) for i, p in enumerate(PROMPTS)]
        outs: dict[int, list] = {}
        threads = [threading.Thread(target=lambda i=i: outs.__setitem__(i, run(PROMPTS[i], i)))
                   for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [outs.get(i) for i in range(len(PROMPTS))] == alone
        assert rounds.most >= 2, "the runs never shared a pass"
    finally:
        SERVER.shared.stop()
        SERVER.model.resize(slots)


def test_a_layout_the_shared_pass_does_not_compute_is_refused_at_start_up():
    """A target with a scaled embedding (as Gemma's): supports() and row_invariant() pass, the whole-pass check
    does not, and the server serves it one run at a time with the reason in its log line."""
    from metasd.ui import generate as ui_generate

    b = tiny_bundle(vocab=64)
    pack_linears(b.target)
    lm = b.target.model
    plain = type(lm).forward

    def scaled(self, input_ids=None, inputs_embeds=None, **kw):
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids) * 3.0
        return plain(self, inputs_embeds=inputs_embeds, **kw)

    lm.forward = scaled.__get__(lm)
    assert batch.supports(b.target) and row_invariant(b.target)
    assert "in company than alone" in (check_shared_pass(b.target) or "")
    line = ui_generate.start_rounds(SERVER, b, process=0)
    assert line.startswith("shared rounds: off (the shared pass was checked against the model's own"), line
    assert SERVER.shared.now is None


def _events_in_order(bundle, kws: list[dict], prompts: list[list[int]]) -> tuple[list[tuple[int, object]], Rounds]:
    """Every request joined to one driver at once; the order in which their items reached their outboxes."""
    order: list[tuple[int, object]] = []
    done = threading.Semaphore(0)

    class Box:
        def __init__(self, i: int):
            self.i = i

        def put(self, item: object) -> None:
            order.append((self.i, item))
            if item is batch.END:
                done.release()

    rounds = Rounds(bundle.target, max_batch=len(prompts), idle_s=1.0, share=True)
    reqs = [prepare(bundle, p, **kw) for p, kw in zip(prompts, kws, strict=True)]
    for i, r in enumerate(reqs):
        rounds.join(r, steps(r, None), Box(i))
    for _ in reqs:
        assert done.acquire(timeout=120)
    return order, rounds


def test_a_token_tree_run_holds_the_others_one_round_at_a_time_and_all_get_their_solo_outputs():
    """Three chain runs and one metasd-tree run (its rounds verify on a pass of their own): the tree's rounds and
    the chains' interleave (before, the tree's whole run went by in one call of the driver and the others
    waited for all of it), and every run's output is its solo output."""
    b = tiny_bundle(vocab=64)
    pack_linears(b.target)
    kws = [_kw(0, n=30, policy="metasd-tree"), _kw(1), _kw(2), _kw(3)]
    order, rounds = _events_in_order(b, kws, PROMPTS)
    tree_rounds = [k for k, (i, item) in enumerate(order) if i == 0 and isinstance(item, RoundEvent)]
    assert len(tree_rounds) >= 3
    between = {i for i, item in order[tree_rounds[0]: tree_rounds[-1]] if isinstance(item, RoundEvent)}
    assert between >= {1, 2, 3}, "the chain runs made no round while the tree run played its rounds"
    for i, (p, kw) in enumerate(zip(PROMPTS, kws, strict=True)):
        got = [t for j, item in order if j == i and isinstance(item, RoundEvent) for t in item.emitted]
        assert got == _emitted(generate(b, p, **kw)), f"run {i}"
    assert rounds.most >= 2


def test_a_tree_run_in_company_stops_within_a_round():
    b = tiny_bundle(vocab=64)
    pack_linears(b.target)
    rounds = Rounds(b.target, max_batch=2, idle_s=1.0, share=True)
    stop = threading.Event()
    tree = prepare(b, PROMPTS[0], **_kw(0, n=400, policy="metasd-tree"))
    chain = prepare(b, PROMPTS[1], **_kw(1, n=400))
    tree_events = rounds.submit(tree, steps(tree, stop))
    chain_events = rounds.submit(chain, steps(chain, None))
    assert isinstance(next(tree_events), RoundEvent) and isinstance(next(chain_events), RoundEvent)
    stop.set()
    rest = list(tree_events)
    assert rest[-1].stop_reason == "stopped" and rest[-1].new_tokens < 400
    chain_rounds, summary = collect(chain_events)
    assert summary.new_tokens == 400


def test_a_failed_shared_pass_ends_only_the_run_whose_own_pass_fails():
    """One run's verification fails (injected: any pass holding its cache raises, its own included): the shared
    pass is run again for each run alone, caches rolled back; that run ends with its error, the others get their
    solo outputs."""
    b = tiny_bundle(vocab=64)
    pack_linears(b.target)
    rounds = Rounds(b.target, max_batch=3, idle_s=1.0, share=True)
    reqs = [prepare(b, p, **_kw(i)) for i, p in enumerate(PROMPTS[:3])]
    poisoned = reqs[1]
    real = batch.verify_together

    def failing(model, parts, block=0):
        if any(p.cache is poisoned.cache for p in parts) and poisoned.ledger.rounds >= 3:
            raise RuntimeError("injected: this run's pass fails")
        return real(model, parts, block)

    def alone(r):
        if poisoned.ledger.rounds >= 3:
            raise RuntimeError("injected: this run's pass fails")
        return type(poisoned).pass_alone(poisoned, r)

    poisoned.pass_alone = alone
    with mock.patch.object(batch, "verify_together", side_effect=failing):
        streams = [rounds.submit(r, steps(r, None)) for r in reqs]
        outs = {}
        for i in (0, 2):
            outs[i] = _emitted(streams[i])
        with pytest.raises(RuntimeError, match="injected"):
            list(streams[1])
    for i in (0, 2):
        assert outs[i] == _emitted(generate(b, PROMPTS[i], **_kw(i))), f"run {i}"


def test_a_round_that_fails_outside_any_run_ends_that_rounds_runs_and_the_driver_serves_on():
    b = tiny_bundle(vocab=64)
    pack_linears(b.target)
    rounds = Rounds(b.target, max_batch=2, idle_s=2.0, share=True)
    real = Rounds._drafts
    calls = []

    def once(self):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected: the driver's own bookkeeping")
        return real(self)

    reqs = [prepare(b, p, **_kw(i)) for i, p in enumerate(PROMPTS[:2])]
    with mock.patch.object(Rounds, "_drafts", once):
        streams = [rounds.submit(r, steps(r, None)) for r in reqs]
        for s in streams:
            with pytest.raises(RuntimeError, match="failed a round"):
                list(s)
        later = prepare(b, PROMPTS[2], **_kw(2))
        assert _emitted(rounds.submit(later, steps(later, None))) == _emitted(generate(b, PROMPTS[2], **_kw(2)))


def _window(seconds: float) -> tuple[int, float, float]:
    """A stand-in simulation: where it ran and when (module level, so a spawned process can import it)."""
    import os
    import time

    t0 = time.time()
    time.sleep(seconds)
    return os.getpid(), t0, time.time()


def test_playground_simulations_run_one_at_a_time():
    """Four visitors' simulations at once run one after another, all in one process beside the server's (four
    together in the server's process starved a generation beside them); every visitor still gets an answer."""
    import os

    from metasd.ui import playground as ui_playground

    spans: list = []
    threads = [threading.Thread(target=lambda: spans.append(SERVER.simulator.run(_window, 0.2))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(spans) == 4 and len({pid for pid, _, _ in spans}) == 1 and spans[0][0] != os.getpid()
    spans.sort(key=lambda s: s[1])
    assert all(later[1] >= earlier[2] - 0.01 for earlier, later in zip(spans, spans[1:], strict=False)), spans
    policies, gamma, _, reward, full_info, spread, seed = ui_playground.PLAYGROUND_DEFAULTS
    answers: list = []
    threads = [threading.Thread(target=lambda: answers.append(ui_playground.run_playground(
        SERVER, ui_playground.PLAYGROUND_DRAFTERS, list(policies), gamma, 200, reward, full_info, spread, seed)))
        for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(answers) == 4 and all(len(a) == 4 for a in answers)
