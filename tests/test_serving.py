"""Serving a class: the app's own line for the model (its place and an estimate while a run waits, "the class is
full" past capacity), Stop while waiting, one run per browser session, a stream nobody reads, page loads that
queue no model work. Drives the app's handlers in-process on the offline model; the line itself on its own."""

from __future__ import annotations

import copy
import logging
import threading
import time
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from transformers import DynamicCache

from metasd.core.passes import VerifyPart
from metasd.decoding.engine import collect, drive, generate, prepare, steps
from metasd.decoding.tree import Branch, build_tree, forward_tree, tree_mask, tree_positions
from metasd.drafting.whitebox import HeadConfig
from metasd.models import cpu_attention
from metasd.models.cpu_linear import pack_linears
from metasd.serving.batch import PassCost, Rounds, measure_pass_cost, row_invariant, verify_together
from metasd.serving.streaming import FairSlots
from metasd.ui import generate as ui_generate
from metasd.ui import playground as ui_playground
from metasd.ui import session as ui_session
from metasd.ui.config import EXAMPLES, PAGE_POLICY
from metasd.ui.frames import final_status
from metasd.ui.generate import generate_view, measure_baseline, stop_generation
from tests.app_server import page_server
from tests.tiny import tiny_bundle

SERVER = page_server()  # this test process's server, shared with the app served in-process

PROMPT = "Say hello to the class in one short sentence."


# ----------------------------------------------------------------------------------------------
# The line on its own


def test_line_reports_places_and_refuses_past_capacity():
    line = FairSlots(1, max_waiting=2, service_s=10.0)
    line.acquire()  # someone runs
    a, b = line.join("a"), line.join("b")
    assert a is not None and b is not None
    assert line.join("c") is None, "a full line must refuse at once"
    pa, pb = next(line.wait(a)), next(line.wait(b))
    assert (pa.place, pb.place) == (1, 2)
    assert pa.eta_s == pytest.approx(5.0) and pb.eta_s == pytest.approx(15.0)  # half a run, then one more each
    assert line.retry_after_s() >= 10.0
    line.release()
    assert list(line.wait(a)) == [] and a.admitted_at is not None  # first in line takes the free slot
    assert next(line.wait(b)).place == 1


def test_runs_that_join_together_take_the_free_slots_without_being_told_a_place():
    """Three slots, one taken: the first two of four joiners start at once, whoever of them asks first; the other
    two are told places 1 and 2 (a class pressing Run together sees no "in line" while slots are free)."""
    line = FairSlots(3)
    line.acquire()
    a, b, c, d = (line.join(k) for k in "abcd")
    assert list(line.wait(b)) == [] and b.admitted_at is not None  # b asked before a: there is a slot for both
    assert list(line.wait(a)) == [] and a.admitted_at is not None
    assert next(line.wait(d)).place == 2 and next(line.wait(c)).place == 1
    line.release(a)
    assert next(line.wait(d)).place == 2  # in order: the freed slot is c's
    assert list(line.wait(c)) == []


def test_stop_while_waiting_leaves_the_line_at_once():
    line = FairSlots(1)
    line.acquire()
    stop = threading.Event()
    t = line.join("a", stop)
    behind = line.join("b")
    waiter = line.wait(t, poll=0.05)
    next(waiter)
    stop.set()
    t0 = time.perf_counter()
    assert list(waiter) == []
    assert t.left == "stopped" and time.perf_counter() - t0 < 0.2
    assert next(line.wait(behind)).place == 1  # the one behind moved up
    line.release()
    assert list(line.wait(behind)) == [] and behind.admitted_at is not None


def test_a_reader_that_is_gone_loses_its_place():
    line = FairSlots(1)
    line.acquire()
    t = line.join("a")
    reading = iter([True, True, False])
    places = list(line.wait(t, poll=0.01, reading=lambda: next(reading)))
    assert len(places) == 2 and t.left == "abandoned" and line.waiting == 0
    line.release()


def test_session_reader_gives_up_after_unread_messages():
    unread = {"s": 0}
    with mock.patch.object(SERVER.streams, "unread", lambda key: unread.get(key)):
        r = ui_session.SessionReader("s", SERVER.streams, patience_s=0.2)
        assert r()
        unread["s"] = 3  # messages pile up unread
        assert r()  # not yet: a reader may be a moment behind
        time.sleep(0.25)
        assert not r()
        unread["s"] = 0
        assert r()  # it read them after all
        assert ui_session.SessionReader("nobody", SERVER.streams, patience_s=1.0)()  # nobody can tell: reading


def test_session_reader_keeps_a_reader_that_lags_behind_a_busy_server():
    """A loaded server sends a stream's messages late: a reader one message behind, or whose backlog goes up
    and down, still reads; only a backlog that never shrinks is a reader gone."""
    unread = {"s": 1}
    with mock.patch.object(SERVER.streams, "unread", lambda key: unread.get(key)):
        r = ui_session.SessionReader("s", SERVER.streams, patience_s=0.2)
        for n in (1, 1, 2, 1, 3, 2, 1, 1):  # one behind, or catching up: over four times the patience
            unread["s"] = n
            assert r()
            time.sleep(0.1)
        for n in (2, 3, 3, 4):  # a backlog that only grows
            unread["s"] = n
            r()
            time.sleep(0.1)
        assert not r()


# ----------------------------------------------------------------------------------------------
# The Generate handler in line


@pytest.fixture(scope="module")
def page_offline():
    """The page's offline preset, loaded once for the module (as the server loads it at start-up)."""
    return SERVER.presets.get("offline")


def req(session: str) -> SimpleNamespace:
    return SimpleNamespace(session_hash=session)


def status_of(frame: tuple) -> str:
    return f"{frame.tokens} {frame.stats}"


@pytest.fixture
def model_busy(page_offline):
    """The model held by someone else for the test's length: Generate runs wait in line."""
    SERVER.model.acquire()
    try:
        yield SERVER.model
    finally:
        SERVER.model.release()


def test_waiting_run_sees_its_place_and_stop_takes_it_out(page_offline, model_busy):
    g = generate_view(SERVER, PROMPT, "offline", max_new_tokens=8, request=req("queued"))
    t0 = time.perf_counter()
    first = next(g)
    assert time.perf_counter() - t0 < 2.0
    assert "1st in line, about" in status_of(first) and first.record is None
    assert model_busy.waiting == 1
    stop_generation(SERVER, req("queued"))
    t0 = time.perf_counter()
    rest = list(g)
    assert time.perf_counter() - t0 < 1.0, "Stop while waiting must end the run at once"
    assert "left the line before starting: you pressed Stop" in status_of(rest[-1])
    assert model_busy.waiting == 0 and not SERVER.stops.runs


def test_full_class_is_told_when_to_come_back(page_offline, model_busy):
    waiting = generate_view(SERVER, PROMPT, "offline", max_new_tokens=8, request=req("w1"))
    next(waiting)
    with mock.patch.object(model_busy, "max_waiting", 1):
        frames = list(generate_view(SERVER, PROMPT, "offline", max_new_tokens=8, request=req("w2")))
    assert len(frames) == 1
    text = status_of(frames[0])
    assert "the class is full" in text and "Please press Run again in about" in text
    assert "Queue is full" not in text
    waiting.close()  # the page went away: the ticket leaves the line
    assert model_busy.waiting == 0 and not SERVER.stops.runs


def test_a_new_run_replaces_the_sessions_previous_one(page_offline, model_busy):
    old = generate_view(SERVER, PROMPT, "offline", max_new_tokens=8, request=req("same"))
    next(old)
    new = generate_view(SERVER, PROMPT, "offline", max_new_tokens=8, request=req("same"))
    assert "in line" in status_of(next(new))
    rest = list(old)  # the old run was stopped by the new Run
    assert "you pressed Stop" in status_of(rest[-1])
    assert model_busy.waiting == 1
    new.close()
    assert model_busy.waiting == 0 and not SERVER.stops.runs


def test_an_unread_stream_loses_its_place(page_offline, model_busy, caplog):
    with mock.patch.object(SERVER.streams, "unread", lambda key: 5 if key == "gone" else None), \
            mock.patch.object(ui_session, "READ_PATIENCE_S", 0.5), caplog.at_level(logging.WARNING, ui_generate.log.name):
        t0 = time.perf_counter()
        frames = list(generate_view(SERVER, PROMPT, "offline", max_new_tokens=8, request=req("gone")))
    assert time.perf_counter() - t0 < 3.0
    assert "its stream was not read" in status_of(frames[-1]) and model_busy.waiting == 0
    assert "a waiting run left the line: its stream was not read" in caplog.text  # the operator sees it too


LONG_PROMPT = "Write a long story about a dragon who learns to bake bread."


def test_a_running_stream_nobody_reads_is_stopped_and_told_why(page_offline, caplog):
    """A run whose unread backlog only grows stops within the patience, says why (not "you pressed Stop"),
    and the server's log says so."""
    backlog = iter(range(2, 10**6))
    with mock.patch.object(SERVER.streams, "unread", lambda key: next(backlog) if key == "slow" else None), \
            mock.patch.object(ui_session, "READ_PATIENCE_S", 0.3), caplog.at_level(logging.WARNING, ui_generate.log.name):
        # An answer far longer than the patience (a short one could end, by eos, before two frames had gone out).
        frames = list(generate_view(SERVER, LONG_PROMPT, "offline", max_new_tokens=512, request=req("slow")))
    last = status_of(frames[-1])
    assert "this page stopped reading its stream" in last and "you pressed Stop" not in last, last
    assert "done:" not in last and "a run was stopped after" in caplog.text
    summary = frames[-1].record.summary  # the downloaded run replays to the same line
    assert summary.config["stopped_by"] == "unread" and final_status(summary) in last


def test_runs_are_served_in_order_once_the_model_is_free(page_offline):
    """Two sessions: the second waits (its place shown) and is served after the first, both in full."""
    outs: dict[str, list] = {}

    def run(name: str) -> None:
        outs[name] = list(generate_view(SERVER, PROMPT, "offline", max_new_tokens=6, request=req(name)))

    a = threading.Thread(target=run, args=("first",))
    a.start()
    time.sleep(0.05)
    run("second")
    a.join(60)
    for name in ("first", "second"):
        assert outs[name][-1].record is not None and outs[name][-1].record.summary is not None
    assert SERVER.model.waiting == 0 and SERVER.model.running == 0


def test_baseline_waits_for_nobody_while_others_are_in_line(page_offline, model_busy):
    g = generate_view(SERVER, PROMPT, "offline", max_new_tokens=8, request=req("someone"))
    next(g)
    record = ui_session.RunRecord(preset="offline", prompt="A prompt never timed.", settings={"temperature": 0.0},
                                  all_drafters=["x"], drafters=["x"])
    record.rounds = [SimpleNamespace(new_tokens=4, emitted=[1], emitted_text=["a"])]
    with mock.patch.object(ui_generate, "measure_target", side_effect=AssertionError("timed while others wait")), \
            mock.patch.object(ui_generate, "_record_view", lambda r: ui_generate.viz.LiveView({}, [])):
        stats, baselines = measure_baseline(SERVER, record, {}, True, False)
    assert "not timed now" in stats and baselines == {}
    g.close()


# ----------------------------------------------------------------------------------------------
# Page loads


def test_page_load_queues_no_model_work(page_offline):
    import app

    demo = app.build_demo(SERVER)
    loads = [d for d in demo.config["dependencies"] if any(t[1] == "load" for t in d["targets"])]
    assert loads, "the page has load events"
    for d in loads:
        assert d["queue"] is False, f"a page load queues {demo.fns[d['id']].name}"
    names = {demo.fns[d["id"]].name for d in loads}
    assert "run_playground" not in names and "measure_baseline" not in names
    with mock.patch.object(SERVER.model, "acquire", side_effect=AssertionError("page load took the model")):
        first = ui_playground.playground_default(SERVER)
    assert ui_playground.playground_default(SERVER) is first  # computed once per server, not once per page


def test_bound_handlers_are_what_gradio_reads_and_servers_share_nothing():
    """Server.bind gives gradio a function with the handler's name, its signature less the server and its type
    hints (gradio injects gr.Request and gr.SelectData by them; a functools.partial hides them), a generator where
    the handler is one; two servers' stops, slots and caches are their own."""
    import inspect

    import gradio as gr
    from gradio import utils

    from metasd.ui.replay import open_grid_run
    from metasd.ui.server import Server

    a, b = Server(), Server()
    try:
        h = a.bind(generate_view)
        assert h.__name__ == "generate_view" and inspect.isgeneratorfunction(h)
        assert list(inspect.signature(h).parameters)[:2] == ["prompt", "preset"]
        assert utils.get_type_hints(h)["request"] is gr.Request
        assert utils.get_type_hints(a.bind(open_grid_run))["evt"] is gr.SelectData
        assert not inspect.isgeneratorfunction(a.bind(stop_generation))
        mine, theirs = threading.Event(), threading.Event()
        a.stops.start("s", mine)
        b.stops.start("s", theirs)
        a.bind(stop_generation)(req("s"))  # Stop pressed on a's page, in session "s"
        assert mine.is_set() and not theirs.is_set()
        a.model.acquire()
        assert a.model.running == 1 and b.model.running == 0
        a.model.release()
        a.timings.put("k", {"tokens_per_s": 1.0, "note": "n"})
        assert b.timings.get("k") is None and a.files.root != b.files.root
    finally:
        a.close()
        b.close()


# ----------------------------------------------------------------------------------------------
# Rounds of many requests in one pass: each request's output is its solo output


def _emitted(events) -> list[int]:
    rounds, _ = collect(events)
    return [t for ev in rounds for t in ev.emitted]


def _together(bundle, prompts, kw_of, max_batch: int, block: int = 0):
    rounds = Rounds(bundle.target, max_batch=max_batch, idle_s=1.0, block=block)
    streams = []
    for i, p in enumerate(prompts):
        req = prepare(bundle, p, **kw_of(i))
        streams.append(rounds.submit(req, steps(req, None)))
    return [_emitted(s) for s in streams], rounds


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_blocked_rounds_as_on_a_gpu_give_each_request_its_solo_output(temperature):
    """Batch-invariant blocking, as a GPU's shared rounds run: every pass's row-wise layers in calls of exactly 8
    rows, a request alone included (it never takes the engine's own pass, so its bits never depend on company).
    Each request's every round equals its solo run through the engine, where no blocking happens."""
    from metasd.decoding.engine import Request
    from metasd.serving.batch import rowwise

    bundle = tiny_bundle(vocab=64)
    assert pack_linears(bundle.target) > 0 and row_invariant(bundle.target, block=8)
    x = torch.randn(1, 21, bundle.target.config.hidden_size)
    head = bundle.target.lm_head
    assert torch.equal(rowwise(head, x, 8), head(x)) and rowwise(head, x, 8).shape == head(x).shape
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (7, 19, 4, 11, 25)]

    def kw(i: int) -> dict:
        return {"chat_template": False, "max_new_tokens": 10 + 5 * i, "temperature": temperature,
                "policy": "metasd-ucb", "seed": i}

    solo = [_emitted(generate(bundle, p, **kw(i))) for i, p in enumerate(prompts)]
    together, rounds = _together(bundle, prompts, kw, max_batch=3, block=8)  # the last one runs alone
    assert together == solo and rounds.most >= 2
    with mock.patch.object(Request, "pass_alone", side_effect=AssertionError("a lone request left the blocks")):
        alone, _ = _together(bundle, prompts[:1], kw, max_batch=3, block=8)
    assert alone == solo[:1]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_blocks_make_kernels_chosen_by_shape_row_invariant_as_on_a_gpu(temperature):
    """The GPU's case on this CPU: torch's default linear kernels (unpacked) give a row other bits beside other
    rows, so plain passes may not be shared; in blocks of a fixed number of rows they give it the same bits,
    and a request's every round in company (arm, draft, the target's p of each drafted id to the last bit,
    verdict, emitted ids) equals its run alone in the same blocked rounds (without blocks, the sampled run's p
    differ). (A GPU server's page runs all go through its blocked rounds, alone or not.)"""
    bundle = tiny_bundle(vocab=64)
    assert not row_invariant(bundle.target) and row_invariant(bundle.target, block=16)
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (6, 21, 13, 9)]

    def kw(i: int) -> dict:
        return {"chat_template": False, "max_new_tokens": 14 + 3 * i, "temperature": temperature,
                "policy": "metasd-ucb", "seed": i}

    def runs(prompts_now: list, max_batch: int) -> list:
        rounds = Rounds(bundle.target, max_batch=max_batch, idle_s=1.0, block=16, share=True)
        reqs = [prepare(bundle, p, **kw(prompts.index(p))) for p in prompts_now]
        streams = [rounds.submit(r, steps(r, None)) for r in reqs]
        # p(x) of each drafted id, to the last bit (a sampled run's verdicts read it)
        out = [[(ev.drafter, ev.draft, ev.accepted, ev.emitted, ev.p_draft) for ev in collect(st)[0]] for st in streams]
        return out, rounds.most

    alone = [runs([p], 1)[0][0] for p in prompts]
    together, most = runs(prompts, 4)
    assert together == alone and most >= 2


def test_row_invariance_is_probed_on_the_fused_products_a_pass_runs():
    """The fused q/k/v and gate/up products are plain attributes, not submodules: the probe must find them (a
    planted row-count dependence in one is caught), and it must not pack the released parts again."""
    bundle = tiny_bundle(vocab=64)
    assert pack_linears(bundle.target) > 0 and row_invariant(bundle.target)
    attn = next(m for m in bundle.target.modules() if "_qkv" in m.__dict__)
    assert attn.q_proj._w is None  # the probe left the released part alone
    for m in bundle.target.modules():  # other bits in a big call than in a small one, in the fused products only
        for fused in (m.__dict__.get("_qkv"), m.__dict__.get("_gate_up")):
            if fused is not None:
                fused._op = lambda x, *a, op=fused._op: op(x, *a) + 1e-3 * (x.numel() // x.shape[-1] > 4)
    assert not row_invariant(bundle.target)


@pytest.mark.parametrize("temperature, policy", [(0.0, "metasd-ucb"), (1.0, "round-robin")])
def test_batched_rounds_give_each_request_its_solo_output_tiny(temperature, policy):
    bundle = tiny_bundle(vocab=64)
    assert pack_linears(bundle.target) > 0 and row_invariant(bundle.target)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (5, 17, 9, 30, 12, 3)]

    def kw(i: int) -> dict:
        return {"chat_template": False, "max_new_tokens": 12 + 4 * i, "temperature": temperature, "policy": policy,
                "seed": i}

    solo = [_emitted(generate(bundle, p, **kw(i))) for i, p in enumerate(prompts)]
    together, rounds = _together(bundle, prompts, kw, max_batch=4)  # 6 requests: two join as others leave
    assert together == solo
    assert rounds.most >= 3 and rounds.share


def test_each_request_of_a_shared_pass_prices_its_next_plan_in_that_company(monkeypatch):
    """The driver tells every request of a shared pass how many shared it and how many ids the others fed
    (costs.VerifyCost.company), before the request reads the pass's time; a request verified alone is told nothing,
    and greedy answers stay the solo ones whatever the plans."""
    from metasd.core.costs import VerifyCost

    seen: list[tuple[tuple[int, int] | None, int]] = []
    real = VerifyCost.add
    monkeypatch.setattr(VerifyCost, "add", lambda self, fed, ms: (seen.append((self.company, fed)), real(self, fed, ms)))
    bundle = tiny_bundle(vocab=64)
    assert pack_linears(bundle.target) > 0 and row_invariant(bundle.target)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (6, 14, 9)]

    def kw(i: int) -> dict:
        return {"chat_template": False, "max_new_tokens": 10 + 12 * i, "temperature": 0.0,
                "policy": ["metasd-ucb-cost", "metasd-tree", "metasd-ucb-cost"][i], "gamma": 3}

    solo = [_emitted(generate(bundle, p, **kw(i))) for i, p in enumerate(prompts)]
    seen.clear()
    together, rounds = _together(bundle, prompts, kw, max_batch=3)
    assert together == solo and rounds.most == 3
    crowds = [(c, fed) for c, fed in seen if c is not None]
    assert any(c[0] == 3 for c, _ in crowds) and all(c[0] >= 2 and c[1] >= c[0] - 1 for c, _ in crowds)
    assert any(c is None for c, _ in seen), "the longest request's last rounds run alone"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_token_tree_rounds_share_the_class_pass_and_keep_their_solo_outputs(temperature, monkeypatch):
    """A token tree's verification is one more part of the class's pass (its nodes at their depths' positions,
    each seeing only its ancestors), and its model drafters' forwards join the others': requests playing
    metasd-tree beside chain policies get their solo outputs, and some passes verify several requests' trees.
    Sampled, a tree's shape (its budget, the extras' worth) reads fixed prices, never the clock or the company
    (docs/DESIGN.md §1), so a sampled request in a class draws what it draws alone, seed for seed."""
    from metasd.serving import batch

    bundle = tiny_bundle(vocab=64)
    assert pack_linears(bundle.target) > 0 and row_invariant(bundle.target)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (5, 17, 9, 30, 12)]
    policies = ["metasd-tree", "metasd-ucb", "metasd-tree", "metasd-tree", "round-robin"]

    def kw(i: int) -> dict:
        return {"chat_template": False, "max_new_tokens": 12 + 4 * i, "temperature": temperature,
                "policy": policies[i], "gamma": 3, "seed": i}

    solo = [_emitted(generate(bundle, p, **kw(i))) for i, p in enumerate(prompts)]
    trees_per_pass: list[int] = []
    real = batch.verify_together

    def counted(model, parts, block=0):  # the parts that are trees of more than one branch
        trees_per_pass.append(sum(p.positions is not None and p.positions != sorted(set(p.positions)) for p in parts))
        return real(model, parts, block)

    with mock.patch.object(batch, "verify_together", side_effect=counted):
        together, rounds = _together(bundle, prompts, kw, max_batch=4)
    assert together == solo
    assert max(trees_per_pass) >= 2, "no pass verified the branching trees of two requests"
    assert rounds.most >= 3


def test_a_shared_pass_hands_each_part_its_hidden_states_bitwise():
    """A part that names `features` gets the hidden states its own pass with output_hidden_states gives (the
    embeddings, a middle layer's output, the final normed state), to the bit and for every row whatever its
    `keep`; a part beside it that names none gets none, and every part's logits stay its own pass's."""
    bundle = tiny_bundle(vocab=64, layers=3)
    target = bundle.target
    assert pack_linears(target) > 0 and row_invariant(target)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (6, 13, 2)]
    drafts = [torch.randint(0, 64, (k,), generator=g).tolist() for k in (3, 0, 5)]
    wants = [(0, 1, 3), (), (3, 2)]
    keeps = [0, 1, 2]
    caches, solo = [], []
    with torch.no_grad():
        for p, d, k in zip(prompts, drafts, keeps, strict=True):
            c = DynamicCache(config=target.config)
            target(input_ids=torch.tensor([p[:-1]]), past_key_values=c, use_cache=True)
            caches.append(c)
            pos = torch.arange(len(p) - 1, len(p) + len(d)).view(1, -1)
            solo.append(target(input_ids=torch.tensor([[p[-1], *d]]), position_ids=pos, logits_to_keep=k,
                               past_key_values=copy.deepcopy(c), use_cache=True, output_hidden_states=True))
    parts = [VerifyPart([p[-1], *d], len(p) - 1, c, keep=k, features=f)
             for p, d, c, k, f in zip(prompts, drafts, caches, keeps, wants, strict=True)]
    together = verify_together(target, parts)
    for part, own, logits, f in zip(parts, solo, together, wants, strict=True):
        assert torch.equal(logits, own.logits[0])
        if not f:
            assert part.states is None
            continue
        assert sorted(part.states) == sorted(f)
        for i in f:
            assert part.states[i].shape == own.hidden_states[i].shape
            assert torch.equal(part.states[i], own.hidden_states[i]), f"hidden state {i}"


def _packed_head(bundle):
    """The bundle's tiny-eagle rebuilt on the packed target (its LM head is the target's, as a preset loads
    them) and packed itself: row-invariant as the shipped heads are."""
    from metasd.drafting.whitebox import HeadConfig, build_head

    assert pack_linears(bundle.target) > 0 and row_invariant(bundle.target)
    t = bundle.target
    head = bundle.models["tiny-eagle"] = build_head(t, HeadConfig.from_target(t.config), None,
                                                    init_layer=t.config.num_hidden_layers - 1).eval()
    assert pack_linears(head) > 0 and row_invariant(head)
    return head


def test_a_heads_layer_for_several_requests_gives_each_its_own_bits():
    """WhiteBoxHead.run_together: parts of different lengths, after caches of different lengths (one with none),
    each get the output states, keys, values and last-row logits their own call gives them, to the bit (packed
    layers)."""
    from metasd.core.passes import HeadPart, head_alone

    head = _packed_head(tiny_bundle(vocab=48, seed=2, white_box=True, layers=3))
    g = torch.Generator().manual_seed(1)
    d, kv, hd = head.c.hidden_size, head.c.num_kv_heads, head.c.head_dim
    parts = []
    for t, n_past in ((1, 9), (5, 0), (3, 17), (1, 2)):
        past = None if not n_past else (torch.randn(1, kv, n_past, hd, generator=g),
                                        torch.randn(1, kv, n_past, hd, generator=g))
        parts.append(HeadPart(head, torch.randn(t, d, generator=g), torch.randint(0, 48, (t,), generator=g),
                              torch.arange(n_past, n_past + t)[None], past))
    together = head.run_together(parts)
    for p, got in zip(parts, together, strict=True):
        for a, b in zip(head_alone(p), got, strict=True):
            assert a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("temperature, mixed", [(0.0, False), (1.0, False), (0.0, True)])
def test_white_box_requests_share_the_passes_and_their_heads_read_their_own_features(temperature, mixed, caplog):
    """A white-box head's request verifies in the shared pass like any other (it never runs a pass of its own
    after its prompt's), and its head holds, after every round, bit for bit the features it holds in its solo run
    (and within float noise those of a fresh full pass); every request's output is its solo output. (Before,
    a white-box request verified alone: three of these four would never have shared a pass.) The heads' own
    layer calls of several requests run together too, as the distilled drafters' forwards do."""
    from metasd.drafting.whitebox import WhiteBoxDrafter

    bundle = tiny_bundle(vocab=48, seed=5, scale=3.0, white_box=True, layers=3)
    _packed_head(bundle)
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 48, (n,), generator=g).tolist() for n in (7, 15, 4, 10)]

    def kw(i: int) -> dict:
        arms = ["prompt-lookup", "tiny-eagle"] if i % 3 == 0 else ["tiny-eagle", "tiny-lm"] if i % 3 == 1 else None
        return {"chat_template": False, "max_new_tokens": 18 + 3 * i, "temperature": temperature,
                "policy": "metasd-ucb", "seed": i, **({"drafters": arms} if arms else {})}

    def recorder(seen: list, fresh: bool):
        def inspect(cache, ids, drafters):
            d = next(x for x in drafters if isinstance(x, WhiteBoxDrafter))
            seen.append((d.f0, d.feats.clone()))
            if fresh:
                with torch.no_grad():
                    hs = bundle.target(input_ids=torch.tensor([ids[:-1]]), output_hidden_states=True).hidden_states
                full = torch.cat([hs[i][0] for i in d.feature_layers], dim=-1)
                assert d.f0 + d.feats.shape[0] == len(ids) - 1
                assert torch.allclose(d.feats, full[d.f0:], atol=1e-4)
        return inspect

    heads = [i for i in range(len(prompts)) if kw(i).get("drafters") and "tiny-eagle" in kw(i)["drafters"]]
    pinned = cpu_attention.pinned()
    if mixed:
        cpu_attention.pin(True)
        threads = torch.get_num_threads()
        torch.set_num_threads(2)
    try:
        _white_box_class(bundle, prompts, kw, heads, recorder, mixed, caplog)
    finally:
        if mixed:
            cpu_attention.pin(pinned)
            torch.set_num_threads(threads)


def _white_box_class(bundle, prompts, kw, heads, recorder, mixed, caplog):
    from metasd.decoding.engine import Request
    from metasd.drafting.whitebox import WhiteBoxHead

    solo_out, solo_feats = [], {}
    for i, p in enumerate(prompts):
        req = prepare(bundle, p, **kw(i))
        solo_feats[i] = []
        solo_out.append(_emitted(drive(req, None, recorder(solo_feats[i], False) if i in heads else None)))
    # `mixed`: a crowd on one thread, a run alone and the prompts on two, as the rounds' processes run them; their
    # attention then runs on one thread (pinned above for the solo runs too: a run alone in such a process).
    rounds = (Rounds(bundle.target, max_batch=4, idle_s=1.0, threads=2, crowd_threads=1) if mixed
              else Rounds(bundle.target, max_batch=4, idle_s=1.0))
    assert rounds.mixes_thread_counts() == mixed
    shared_feats: dict[int, list] = {i: [] for i in heads}
    alone = Request.pass_alone

    def only_when_alone(req, r):  # the engine's own pass is a lone request's, never one with company
        assert rounds.together == 1, "a request left the shared pass"
        return alone(req, r)

    calls: list[int] = []
    own = WhiteBoxHead.run_together

    def counted(head, parts, *a):  # how many requests' rows each call of the head's layer took
        calls.append(len(parts))
        return own(head, parts, *a)

    with mock.patch.object(Request, "pass_alone", autospec=True, side_effect=only_when_alone), \
            mock.patch.object(WhiteBoxHead, "run_together", autospec=True, side_effect=counted):
        streams = []
        for i, p in enumerate(prompts):
            req = prepare(bundle, p, **kw(i))
            streams.append(rounds.submit(req, steps(req, None, recorder(shared_feats[i], True) if i in heads else None)))
        together = [_emitted(s) for s in streams]
    assert together == solo_out and rounds.most >= 3
    assert max(calls) >= 2, "the heads' layer calls of several requests never ran together"
    assert "failed" not in caplog.text, "a shared pass failed and its requests ran alone"
    assert len(heads) == 3 and all(shared_feats[i] for i in heads)
    for i in heads:
        assert len(shared_feats[i]) == len(solo_feats[i])
        for (f0, a), (g0, b) in zip(shared_feats[i], solo_feats[i], strict=True):
            assert f0 == g0 and torch.equal(a, b)


@pytest.mark.parametrize("temperature, head", [(0.0, False), (1.0, False), (0.0, True), (1.0, True)])
def test_a_class_on_the_same_prompts_reads_each_prompt_once_and_gets_its_solo_outputs(temperature, head):
    """Requests that join others with a prompt already read take its kept pass (metasd.decoding.prefix) instead of
    their own: outputs, greedy and sampled, are each request's solo output; a request alone reads its prompt.
    With a white-box head among the arms, the kept pass holds the hidden states the head reads, to the bit."""
    from metasd.decoding.prefix import PrefixStore

    bundle = tiny_bundle(vocab=64, white_box=head)
    pack_linears(bundle.target)
    g = torch.Generator().manual_seed(5)
    distinct = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (9, 23, 14)]
    prompts = [distinct[i % 3] for i in range(8)]

    def kw(i: int) -> dict:
        arms = {"drafters": ["prompt-lookup", "tiny-eagle", "tiny-lm"]} if head else {}
        return {"chat_template": False, "max_new_tokens": 16, "temperature": temperature, "seed": i,
                "policy": "metasd-ucb", **arms}

    solo = [_emitted(generate(bundle, p, **kw(i))) for i, p in enumerate(prompts)]
    store = PrefixStore(64 * 2**20)
    rounds = Rounds(bundle.target, max_batch=8, idle_s=1.0, prefixes=store)
    reqs = [prepare(bundle, p, **kw(i)) for i, p in enumerate(prompts)]
    streams = [rounds.submit(r, steps(r, None)) for r in reqs]
    assert [_emitted(s) for s in streams] == solo
    # Each distinct prompt read once: 3 passes kept, the 5 repeats took them. (The first request may start before
    # the others join; alone, it reads its prompt without asking the store, so 2 or 3 asked in vain.)
    assert store.hits == 5 and len(store) == 3 and store.misses in (2, 3)
    assert sum(r.prefill_reused for r in reqs) == 5

    # The kept pass is the bits of a fresh one.
    fresh = prepare(bundle, distinct[1], **kw(0))
    fresh.start()
    kept = DynamicCache(config=bundle.target.config)
    got = store.take(fresh.ids[:-1], _keep(fresh), kept, fresh.features)
    assert got is not None and (not head or fresh.features)
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
               for a, b in zip(kept.layers, fresh.cache.layers, strict=True))
    for d in fresh.readers:  # the features a reused prompt hands the head are those its own pass gives
        assert torch.equal(torch.cat([got[1][i][0] for i in d.feature_layers], dim=-1), d.feats)
    if head:  # asked without the head's layers, the same prompt's pass is another entry
        assert store.take(fresh.ids[:-1], _keep(fresh), DynamicCache(config=bundle.target.config)) is None

    # Alone: its own pass (timed as it runs), kept for later company.
    alone = Rounds(bundle.target, max_batch=8, idle_s=1.0, prefixes=PrefixStore(64 * 2**20))
    req = prepare(bundle, distinct[0], **kw(0))
    assert _emitted(alone.submit(req, steps(req, None))) == solo[0]
    assert not req.prefill_reused and alone.prefixes.hits == 0 and len(alone.prefixes) == 1

    # A run timed against the target alone (Compare's) reads its own prompt even in company: a kept pass would
    # leave the prefill out of its time. Beside it, an untimed run with the same prompt takes the kept one.
    long = prepare(bundle, distinct[2], **{**kw(2), "max_new_tokens": 200})  # the company, running first
    timed, untimed = prepare(bundle, distinct[0], **kw(0)), prepare(bundle, distinct[0], **kw(1))
    timed.timed = True
    first = alone.submit(long, steps(long, None))
    both = [alone.submit(r, steps(r, None)) for r in (timed, untimed)]
    assert [_emitted(st) for st in both] == [solo[0], _emitted(generate(bundle, distinct[0], **kw(1)))]
    assert _emitted(first)
    assert not timed.prefill_reused and untimed.prefill_reused


def _trace(events) -> list[tuple]:
    """Every round as the page shows it: the arm, its draft, what passed, what was added."""
    rounds, _ = collect(events)
    return [(ev.drafter, ev.draft, ev.accepted, ev.emitted) for ev in rounds]


@pytest.mark.parametrize("temperature, policy, window", [(0.0, "single:tiny-distilled", 0), (1.0, "round-robin", 0),
                                                         (0.0, "single:tiny-lm", 6)])
def test_model_drafters_of_many_requests_run_in_one_pass_and_draft_as_alone(temperature, policy, window):
    """Shared rounds run every request's forward on the same drafter model in one pass (DraftPart): each
    request's every draft, not only its output, is the one it drafts alone; a windowed drafter too."""
    bundle = tiny_bundle(vocab=64, draft_vocab=tuple(range(0, 64, 3)), window=window)
    for m in (bundle.target, *bundle.models.values()):
        pack_linears(m)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (5, 17, 9, 30, 12)]

    def kw(i: int) -> dict:
        return {"chat_template": False, "max_new_tokens": 14 + 3 * i, "temperature": temperature, "policy": policy,
                "seed": i, "gamma": 4}

    solo = [_trace(generate(bundle, p, **kw(i))) for i, p in enumerate(prompts)]
    rounds = Rounds(bundle.target, max_batch=5, idle_s=1.0)
    reqs = [prepare(bundle, p, **kw(i)) for i, p in enumerate(prompts)]
    streams = [rounds.submit(r, steps(r, None)) for r in reqs]
    assert [_trace(s) for s in streams] == solo
    assert rounds.draft_passes > 0 and rounds.most_drafts >= 3
    assert any(d for d in solo[0] if d[1])  # the drafters did draft


def test_drafter_forwards_are_not_shared_where_rows_are_not_invariant():
    """A drafter model on torch's default kernels: its forwards run one by one, and drafts stay as alone."""
    bundle = tiny_bundle(vocab=64)
    pack_linears(bundle.target)  # the target shares; the drafter (unpacked) must not
    prompts = [[1, 2, 3, 4, 5, 6], [9, 8, 7, 6, 5, 4, 3, 2], [4, 4, 4]]

    def kw(i: int) -> dict:
        return {"chat_template": False, "max_new_tokens": 16, "temperature": 0.0, "seed": i, "policy": "single:tiny-lm"}

    solo = [_trace(generate(bundle, p, **kw(i))) for i, p in enumerate(prompts)]
    rounds = Rounds(bundle.target, max_batch=3, idle_s=1.0)
    reqs = [prepare(bundle, p, **kw(i)) for i, p in enumerate(prompts)]
    streams = [rounds.submit(r, steps(r, None)) for r in reqs]
    assert [_trace(s) for s in streams] == solo
    assert rounds.most >= 2 and rounds.draft_passes == 0 and not any(rounds._draft_shared.values())


def test_a_distilled_drafters_shared_forward_is_bitwise_its_own_on_the_offline_model(page_offline):
    """The offline preset's distilled drafters (one layer, the target's head restricted to a draft vocabulary,
    packed): forwards of three requests in one pass, a catch-up of several ids with one kept row among them,
    give each the bits of its own forward, at windowed positions too."""
    from metasd.core.passes import DraftPart, forward_alone
    from metasd.serving.batch import supports

    model = SERVER.presets.get("offline").models["code-drafter"]
    assert supports(model) and row_invariant(model)
    g = torch.Generator().manual_seed(1)
    vocab = SERVER.presets.get("offline").target.config.vocab_size
    contexts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (12, 64, 5)]
    feeds = [torch.randint(0, vocab, (k,), generator=g).tolist() for k in (1, 9, 1)]
    offsets = (0, 300, 17)  # a windowed drafter's cache starts at its window's true position
    caches = []
    with torch.no_grad():
        for ctx, off in zip(contexts, offsets, strict=True):
            c = DynamicCache(config=model.config)
            forward_alone(DraftPart(model, VerifyPart(ctx, off, c)))
            caches.append(c)
    parts = [VerifyPart(f, off + len(ctx), copy.deepcopy(c), keep=1)
             for f, ctx, off, c in zip(feeds, contexts, offsets, caches, strict=True)]
    solo = [forward_alone(DraftPart(model, VerifyPart(p.ids, p.start, copy.deepcopy(c), keep=1)))
            for p, c in zip(parts, caches, strict=True)]
    together = verify_together(model, parts)
    for a, b in zip(solo, together, strict=True):
        assert a.shape == b.shape == (1, vocab) and torch.equal(a, b)


def _keep(req) -> int:
    want = max((d.seed_rows for d in req.arms), default=0)
    return min(len(req.ids) - 1, want) if want else 1


def test_kept_prompt_passes_are_bounded_in_bytes_oldest_first():
    from metasd.decoding.prefix import PrefixStore

    bundle = tiny_bundle(vocab=64)
    one = prepare(bundle, list(range(1, 40)), chat_template=False, max_new_tokens=4)
    one.start()
    size = sum(lay.keys.nbytes + lay.values.nbytes for lay in one.cache.layers)
    store = PrefixStore(int(2.5 * size) + 64 * 4 * 8)
    for first in range(4):
        store.keep([first, *range(1, 39)], 1, one.cache, torch.zeros(1, 64))
    assert len(store) == 2 and store.nbytes <= store.max_bytes
    assert store.take([0, *range(1, 39)], 1, DynamicCache(config=bundle.target.config)) is None  # the oldest went
    assert store.take([3, *range(1, 39)], 1, DynamicCache(config=bundle.target.config)) is not None
    store.keep(list(range(500)), 1, one.cache, torch.zeros(10**7))  # larger than the whole store: not kept
    assert len(store) == 2


def test_the_load_generators_light_client_applies_gradios_stream_edits():
    """scripts/load_users.py edits each output in place instead of gradio_client's copy-then-edit: the same
    outputs as gradio_client's own edit of the server's stream diffs."""
    import random

    from gradio.utils import diff
    from gradio_client.utils import apply_diff

    from scripts.load_users import _patch_in_place

    rng = random.Random(0)

    def value(depth: int = 0):
        kind = rng.choice(["str", "list", "dict", "num"] if depth < 3 else ["str", "num"])
        if kind == "str":
            return "".join(rng.choice("ab<>") for _ in range(rng.randint(0, 6)))
        if kind == "num":
            return rng.randint(0, 9)
        if kind == "list":
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        return {rng.choice("xyzw"): value(depth + 1) for _ in range(rng.randint(0, 4))}

    for _ in range(300):
        old, new = value(), value()
        if rng.random() < 0.3 and isinstance(old, str):
            new = old + "more"  # an appended token view
        edits = diff(old, new)
        assert _patch_in_place(copy.deepcopy(old), edits) == apply_diff(old, edits), (old, new)


def test_the_batch_bound_reads_the_measured_pass_costs():
    cost = PassCost(requests=(1, 4, 8, 16, 32), ms=(100.0, 145.0, 205.0, 325.0, 565.0), rows=5)
    fixed, per = cost.fit()
    assert abs(fixed - 85.0) < 1e-6 and abs(per - 15.0) < 1e-6  # the points lie on 85 + 15 n
    assert [cost.best_batch(s) for s in (0.5, 1.0, 2.0, 3.0, 6.0)] == [1, 1, 7, 14, 34]
    assert "fitted 85 ms + 15.0 ms per request" in cost.describe()
    # A start-up on a busy spell (2026-12-04): the largest pass slow, the line's value at one request 20 ms
    # against the 61 ms measured. The bound reads the measured solo pass: 12 x 61 ms on the line, not 12 x 20.
    tilted = PassCost(requests=(1, 8, 16, 32), ms=(61.0, 169.0, 306.0, 661.0), rows=5)
    fixed, per = tilted.fit()
    assert fixed + per < 45 and tilted.best_batch(12) == int((12 * 61.0 - fixed) // per) == 36
    assert PassCost(requests=(2, 8), ms=(120.0, 300.0), rows=5).best_batch(3) == 7  # no solo pass measured: the line
    bundle = tiny_bundle(vocab=64)
    pack_linears(bundle.target)
    measured = measure_pass_cost(bundle.target, 3, requests=(1, 2, 6), context=8, repeats=1)
    assert measured.requests == (1, 2, 6) and measured.rows == 3 and all(ms > 0 for ms in measured.ms)
    bounds = [measured.best_batch(s) for s in (1.0, 2.0, 4.0, 8.0)]
    assert bounds == sorted(bounds) and bounds[0] >= 1 and measured.fit()[1] > 0  # more slowdown, more requests


def test_unpacked_rows_are_not_invariant_so_passes_are_not_shared():
    """Plain F.linear (MKL sgemm) gives a row other bits beside other rows: measured, and then not shared."""
    bundle = tiny_bundle(vocab=64)
    assert not row_invariant(bundle.target)
    prompts = [[1, 2, 3, 4, 5, 6], [9, 8, 7, 6, 5, 4, 3, 2]]

    def kw(i: int) -> dict:
        return {"chat_template": False, "max_new_tokens": 20, "temperature": 0.0, "seed": i}

    solo = [_emitted(generate(bundle, p, **kw(i))) for i, p in enumerate(prompts)]
    together, rounds = _together(bundle, prompts, kw, max_batch=4)
    assert together == solo and not rounds.share and rounds.most == 1


def test_verify_together_is_bitwise_the_solo_pass_on_the_offline_model(page_offline):
    target = SERVER.presets.get("offline").target
    assert row_invariant(target)
    g = torch.Generator().manual_seed(0)
    vocab = target.config.vocab_size
    # Parts of one row (no mask), of several rows after short and long caches (the attention's own blocks
    # over the keys: more than one past 512 of them), each against the solo pass that transformers' sdpa runs.
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (7, 40, 3, 700, 90)]
    drafts = [torch.randint(0, vocab, (k,), generator=g).tolist() for k in (4, 0, 6, 2, 1)]
    caches, solo = [], []
    with torch.no_grad():
        for p, d in zip(prompts, drafts, strict=True):
            c = DynamicCache(config=target.config)
            target(input_ids=torch.tensor([p[:-1]]), past_key_values=c, use_cache=True)
            caches.append(c)
            mine = copy.deepcopy(c)
            pos = torch.arange(len(p) - 1, len(p) + len(d)).view(1, -1)
            solo.append(target(input_ids=torch.tensor([[p[-1], *d]]), position_ids=pos, past_key_values=mine,
                               use_cache=True, output_hidden_states=True))
    # Two parts ask for a white-box head's features (the shipped heads' layers), as a head's request does.
    layers = HeadConfig.from_target(target.config).feature_layers
    wants = [layers, (), (), layers, ()]
    parts = [VerifyPart([p[-1], *d], len(p) - 1, c, features=f)
             for p, d, c, f in zip(prompts, drafts, caches, wants, strict=True)]
    # A token tree's part (a root and two branches, 1 -> (2, 3) and 4): against tree.forward_tree's own pass.
    tree = build_tree([Branch(0, [11, 12, 13]), Branch(1, [11, 14]), Branch(2, [15])])
    assert len(tree) == 5
    p = prompts[1]
    c = DynamicCache(config=target.config)
    with torch.no_grad():
        target(input_ids=torch.tensor([p[:-1]]), past_key_values=c, use_cache=True)
        mine = copy.deepcopy(c)
        logits, hidden = forward_tree(target, mine, p[-1], tree, len(p), hidden=True)
        solo.append(SimpleNamespace(logits=logits[None], hidden_states=hidden))
    parts.append(VerifyPart([p[-1], *tree.tokens], len(p) - 1, c, features=layers,
                            positions=tree_positions(tree, len(p))[0].tolist(), mask=tree_mask(tree, len(p) - 1)))
    together = verify_together(target, parts)
    for own, logits, part in zip(solo, together, parts, strict=True):
        assert torch.equal(own.logits[0], logits)
        for i in part.features:
            assert torch.equal(own.hidden_states[i], part.states[i]), f"hidden state {i}"


def test_batched_rounds_give_each_request_its_solo_output_offline(page_offline):
    bundle = SERVER.presets.get("offline")
    prompts = [e["turns"][0] for e in EXAMPLES[:3]]

    def kw(i: int) -> dict:
        return {"max_new_tokens": 16, "temperature": 0.0, "policy": PAGE_POLICY}

    solo = [_emitted(generate(bundle, p, **kw(i))) for i, p in enumerate(prompts)]
    together, rounds = _together(bundle, prompts, kw, max_batch=3)
    assert together == solo and rounds.most >= 2


def test_while_others_share_the_model_a_run_skips_its_extras(page_offline):
    """Shared rounds, another run on the model: the finished run's lanes (a third of a run's work) and the
    target-alone timing wait for a quiet moment, and the page says so."""
    slots = SERVER.model.slots
    ui_generate.start_rounds(SERVER, page_offline)
    SERVER.model.resize(max(2, SERVER.model.slots))
    SERVER.model.acquire()  # another student's run
    try:
        frames = list(generate_view(SERVER, PROMPT, "offline", max_new_tokens=8, request=req("student-2")))
        last = frames[-1]
        assert last.record.summary is not None and not last.record.lanes
        assert "No drafter lanes now: 1 other run share" in last.lanes and "Full-information" in last.lanes
        with mock.patch.object(ui_generate, "measure_target", side_effect=AssertionError("timed beside others")):
            stats, baselines = measure_baseline(SERVER, last.record, {}, True, False)
        assert "not timed now: 1 runs share the model" in stats and baselines == {}
        full = list(generate_view(SERVER, PROMPT, "offline", max_new_tokens=8, full_info=True, request=req("student-3")))[-1]
        assert full.record.lanes and all(len(v) == 8 for v in full.record.lanes.values())  # the live cells
    finally:
        SERVER.model.release()
        SERVER.shared.stop()
        SERVER.model.resize(slots)
    assert SERVER.model.running == 0 and not SERVER.stops.runs


def _page_runs_at_once(prompts: list[str], n: int, who: str) -> list[list[int]]:
    """Each prompt run through the page's handler in a session of its own, all at once: each run's emitted ids."""
    outs: dict[int, list] = {}

    def run(i: int) -> None:
        outs[i] = list(generate_view(SERVER, prompts[i], "offline", max_new_tokens=n, request=req(f"{who}-{i}")))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return [[t for ev in outs[i][-1].record.rounds for t in ev.emitted] for i in range(len(prompts))]


def test_page_runs_share_rounds_and_get_their_solo_answers(page_offline):
    """The serving path with shared rounds on (one process per core): four sessions' runs at once, each its solo
    answer, and runs sharing passes in a process."""
    bundle = SERVER.presets.get("offline")
    prompts = [e["turns"][0] for e in EXAMPLES[4:8]]
    solo = [_emitted(generate(bundle, p, max_new_tokens=12, policy=PAGE_POLICY)) for p in prompts]
    slots = SERVER.model.slots
    line = ui_generate.start_rounds(SERVER, bundle)
    try:
        assert "shared rounds in process" in line and "up to" in line and SERVER.shared.now is not None
        # The preset's drafter models were probed at start-up, so the class's first rounds never wait for it.
        assert "drafting together: layer-skip, code-drafter, math-drafter, chat-drafter" in line, line
        with mock.patch("metasd.serving.batch.row_invariant", side_effect=AssertionError("probed on a class's path")):
            assert _page_runs_at_once(prompts, 12, "class") == solo
        if SERVER.model.slots >= len(prompts):
            assert SERVER.shared.now.most >= 2, "the runs never shared a pass"
    finally:
        SERVER.shared.stop()
        SERVER.model.resize(slots)
    assert SERVER.model.running == 0 and SERVER.model.waiting == 0 and not SERVER.stops.runs


def test_absent_optional_modules_are_marked_absent_once_and_present_ones_left_alone(monkeypatch):
    """gradio tries `import matplotlib` around every event; the server marks it absent once (a search of
    sys.path per try, on the event loop, slowed every stream of a class)."""
    import importlib
    import json
    import sys

    import app

    name = "metasd_surely_not_installed_module"
    monkeypatch.delitem(sys.modules, name, raising=False)
    searched = []
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: searched.append(n) or real(n, *a))
    app.no_missing_imports(name, "json")
    assert sys.modules[name] is None and sys.modules["json"] is json
    monkeypatch.setattr(importlib.util, "find_spec", lambda *a: pytest.fail("searched again"))
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(name)
    app.no_missing_imports(name)  # already marked: no second search
    assert searched == [name]


def test_a_gpu_servers_rounds_in_its_own_process_in_blocks_give_page_runs_their_solo_answers(page_offline,
                                                                                              monkeypatch):
    """The serving path a GPU server takes (docs/DESIGN.md §7), on this CPU: shared rounds in the server's own
    process, every pass's row-wise layers in blocks of rows; three sessions' runs at once, each its solo answer."""
    bundle = SERVER.presets.get("offline")
    prompts = [e["turns"][0] for e in EXAMPLES[8:11]]
    solo = [_emitted(generate(bundle, p, max_new_tokens=10, policy=PAGE_POLICY)) for p in prompts]
    monkeypatch.setattr(ui_generate, "PASS_BLOCK", 16)
    slots = SERVER.model.slots
    line = ui_generate.start_rounds(SERVER, bundle, process=0)
    try:
        assert "in this process (row-wise layers in blocks of 16 rows)" in line, line
        assert isinstance(SERVER.shared.now, Rounds) and SERVER.shared.now.block == 16
        assert _page_runs_at_once(prompts, 10, "gpu") == solo
        if SERVER.model.slots >= len(prompts):
            assert SERVER.shared.now.most >= 2, "the runs never shared a pass"
    finally:
        SERVER.shared.stop()
        SERVER.model.resize(slots)
    assert SERVER.model.running == 0 and not SERVER.stops.runs


def test_compare_runs_join_the_shared_rounds(page_offline):
    """Compare on a server that shares rounds (a class on a Space): each method's run joins them like a student's
    run, none runs the engine in the server's own process, and every output is still the target's own."""
    from metasd.ui.compare import compare_prompt

    bundle = SERVER.presets.get("offline")
    slots = SERVER.model.slots
    ui_generate.start_rounds(SERVER, bundle)
    try:
        with mock.patch.object(ui_generate, "drive", side_effect=AssertionError("ran in the server's process")):
            table, _, _ = list(compare_prompt(SERVER, PROMPT, "offline", PAGE_POLICY, 8, progress=lambda *a, **k: None))[-1]
        assert len(table) == len(bundle.drafter_names) + 2  # the target alone, each drafter alone, the bandit
        assert table["identical_to_target"].all() and (table["new_tokens"] == 8).all()
    finally:
        SERVER.shared.stop()
        SERVER.model.resize(slots)
    assert SERVER.model.running == 0 and not SERVER.stops.runs



def test_a_page_run_cleans_and_encodes_its_prompt_once(page_offline):
    """One path for a prompt: the page's run checks it once (engine.check: cleaned, encoded, settings filled in)
    and starts the engine on that, where the page used to clean it and the engine to clean it again."""
    from metasd.decoding import engine

    counts = {"clean": 0, "encode": 0}
    clean, encode = engine.clean_prompt, engine.encode_prompt

    def counted(name, fn):
        def wrapper(*a, **k):
            counts[name] += 1
            return fn(*a, **k)
        return wrapper

    with mock.patch.object(engine, "clean_prompt", counted("clean", clean)), \
            mock.patch.object(ui_generate, "clean_prompt", counted("clean", clean), create=True), \
            mock.patch.object(engine, "encode_prompt", counted("encode", encode)):  # the page's own name, if any
        frames = list(generate_view(SERVER, "  Say hello\u0007 to the class.  ", "offline", max_new_tokens=4,
                                    request=req("one-path")))
    assert counts == {"clean": 1, "encode": 1}, counts
    last = frames[-1].record
    assert last.summary is not None and last.prompt == "  Say hello to the class.  " and last.settings["gamma"]


def test_compare_shows_the_bandit_first_then_each_drafter_as_it_finishes(page_offline):
    """Compare's one prompt answers in class time: its first frame holds the target alone and the bandit, then
    each frame adds one method (the default arms alone before the other drafters), the last all of them."""
    from metasd.ui.compare import compare_prompt

    bundle = SERVER.presets.get("offline")
    frames = list(compare_prompt(SERVER, PROMPT, "offline", PAGE_POLICY, 4, progress=lambda *a, **k: None))
    methods = list(frames[-1][0]["method"])
    assert [len(f[0]) for f in frames] == list(range(2, len(bundle.drafter_names) + 3))
    assert methods[:2] == ["target alone", PAGE_POLICY]
    arms = [f"single:{d}" for d in bundle.default_drafters]
    assert methods[2 : 2 + len(arms)] == arms and len(methods) == len(bundle.drafter_names) + 2
    assert frames[-1][0]["identical_to_target"].all()
    assert frames[0][1].count("<h4>") == 1 and frames[-1][1].count("<h4>") == len(methods) - 1  # grid grows too
