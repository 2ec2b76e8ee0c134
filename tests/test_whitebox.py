"""White-box heads (metasd/drafting/whitebox.py): training-time test, the drafter's incremental path against the
training path, the features the engine hands over, losslessness, files, and the shipped heads."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
import torch

from metasd import run, target_greedy
from metasd.core.sampling import Sampling
from metasd.decoding.loading import Bundle, DraftHead, distilled_path
from metasd.drafting.whitebox import HeadConfig, WhiteBoxDrafter, build_head, load_head, read_head_info, save_head
from metasd.models.presets import DrafterSpec, Preset, get_preset
from metasd.training.train import answer_examples, draft_vocabulary
from metasd.training.train_whitebox import (
    Sequence,
    batch_tensors,
    evaluate,
    train_head,
    ttt_mask,
    unrolled_states,
    with_features,
)
from tests.tiny import independent_greedy, tiny_bundle, tiny_llama

HEADS = [d for d in get_preset("offline").drafters if d.kind == "white-box"]
MAX_BYTES = 64 * 1024 * 1024  # every drafter's weights in the repository together


def test_training_time_test_mask():
    m = ttt_mask(6, 3).int()
    # Step 3 at position 5: step 1's keys up to 3, step 2's key at 4, its own at 5.
    assert m[5].tolist() == [1, 1, 1, 1, 0, 0] + [0, 0, 0, 0, 1, 0] + [0, 0, 0, 0, 0, 1]
    assert m[1].tolist() == [0] * 6 + [1, 0, 0, 0, 0, 0] + [0, 1, 0, 0, 0, 0]
    assert torch.equal(ttt_mask(4, 1), torch.ones(4, 4, dtype=torch.bool).tril())


def _trained_tiny(steps: int = 60, bf16: bool = False):
    """A tiny target, its answers with features, and a head trained on them for a few steps."""
    torch.manual_seed(0)
    target = tiny_llama(vocab=48, layers=3, hidden=32, seed=3, scale=4.0)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 48, (8,), generator=g).tolist() for _ in range(24)]
    ex = answer_examples(target, prompts, 24, set(), 0, 8, 8)
    c = HeadConfig.from_target(target.config)
    data = with_features(target, ex, c.feature_layers)
    head = build_head(target, c, draft_vocabulary(ex, 40, 48), init_layer=2)
    before = evaluate(head, data[:6], 3)
    stats = train_head(head, data[6:], steps, 3, 4, 3e-3, bf16=bf16)
    return target, prompts, data, head, before, stats


def test_training_learns_and_the_file_round_trips(tmp_path):
    target, _, data, head, before, stats = _trained_tiny()
    after = evaluate(head, data[:6], 3)
    assert stats["steps"] == 60 and stats["final_loss"] < stats["first_loss"]
    assert after["loss"] < before["loss"] and after["agreement"][0] > before["agreement"][0]
    path = tmp_path / "h.safetensors"
    save_head(head, path, {"domain": "test"})
    loaded = load_head(path, target, torch.device("cpu"), torch.float32)
    assert read_head_info(path)[1] == {"domain": "test"}
    assert loaded.embed is target.get_input_embeddings()  # the target's own table, never copied
    assert torch.equal(loaded.lm_head.ids, head.lm_head.ids)
    assert abs(evaluate(loaded, data[:6], 3)["loss"] - after["loss"]) < 0.05  # fp16 storage
    # A file for another target, or not a head at all, is refused with a clear message.
    other = tiny_llama(vocab=48, layers=3, hidden=16, seed=3)
    with pytest.raises(ValueError, match="another target"):
        load_head(path, other, torch.device("cpu"), torch.float32)
    from metasd.training.train import make_drafter, save_drafter

    save_drafter(make_drafter(target, 1, 0), tmp_path / "d.safetensors", {})
    with pytest.raises(ValueError, match="not a MetaSD white-box head"):
        load_head(tmp_path / "d.safetensors", target, torch.device("cpu"), torch.float32)


def test_one_target_pass_gives_a_heads_features_and_labels():
    """Corpus rows left unscored are labelled by the features pass itself: the same top-k labels, the same
    features, as scoring them first (a pass of its own) and then taking features."""
    from metasd.training.common import corpus_examples

    target = tiny_llama(vocab=48, layers=3, hidden=32, seed=3, scale=4.0)
    g = torch.Generator().manual_seed(1)
    rows = [(torch.randint(1, 48, (int(n),), generator=g).tolist(), torch.randint(1, 48, (int(m),), generator=g).tolist())
            for n, m in torch.randint(3, 30, (11, 2), generator=g)]
    layers = HeadConfig.from_target(target.config).feature_layers
    scored = corpus_examples(target, rows, topk=5)
    unscored = corpus_examples(target, rows, topk=5, score=False)
    assert all(e.top_ids is None for e in unscored)
    assert [e.labels for e in unscored] == [e.labels for e in scored]  # counted before scoring, too
    two = with_features(target, scored, layers)
    one = with_features(target, unscored, layers, topk=5)
    for a, b, ea, eb in zip(two, one, scored, unscored, strict=True):
        assert torch.equal(ea.top_ids, eb.top_ids) and torch.allclose(ea.top_logp, eb.top_logp, atol=1e-5)
        assert torch.equal(a.pos, b.pos) and torch.equal(a.top_ids, b.top_ids) and torch.equal(a.feats, b.feats)


def test_bf16_autocast_training_learns_as_float32_does(monkeypatch):
    """Under autocast the head's matrix products run in bfloat16 (seen inside the training pass), its weights
    stay float32, and it learns: held-out loss falls and agreement rises as in float32 training."""
    import metasd.training.train_whitebox as tw

    seen: list[torch.dtype] = []
    real = tw.unrolled_states

    def spy(head, ids, feats, unroll):
        out = real(head, ids, feats, unroll)
        if torch.is_grad_enabled():
            seen.append(out[0].dtype)
        return out

    monkeypatch.setattr(tw, "unrolled_states", spy)
    _, _, data, head, before, stats = _trained_tiny(bf16=True)
    assert stats["bf16_autocast"] is True and set(seen) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in head.parameters())
    after = evaluate(head, data[:6], 3)  # scored in float32, as the engine runs it
    assert after["loss"] < before["loss"] and after["agreement"][0] > before["agreement"][0]
    seen.clear()
    _, _, _, _, _, stats32 = _trained_tiny(steps=2)
    assert stats32["bf16_autocast"] is False and set(seen) == {torch.float32}


def test_bf16_is_chosen_where_the_cpu_multiplies_it_in_hardware():
    from metasd.training.common import cpu_has_fast_bf16, use_bf16

    amx = "processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n"
    assert cpu_has_fast_bf16(amx) and cpu_has_fast_bf16("flags : sse avx512_bf16")
    assert not cpu_has_fast_bf16("flags\t: fpu sse avx2 avx512f\n") and not cpu_has_fast_bf16("")
    assert use_bf16("on", torch.device("cpu")) and not use_bf16("off", torch.device("cuda"))
    assert use_bf16("auto", torch.device("cuda"))


def test_drafting_computes_what_training_trained():
    """The drafter's incremental path (its own KV cache, features handed over, its own output fed back)
    gives the logits that training-time test computed for the same positions, step 1 and step 2."""
    target, prompts, data, head, _, _ = _trained_tiny(steps=20)
    seq: Sequence = data[0]
    ids = seq.ids.tolist()
    T = len(ids)
    with torch.no_grad():
        hs = target(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        # Training stores features in fp16; here both paths read the same fp32 ones.
        exact = torch.cat([hs[i][0] for i in head.c.feature_layers], dim=-1)
        ids_b, _ = batch_tensors([seq], torch.device("cpu"))
        a1, a2 = unrolled_states(head, ids_b, exact[None], 2)
    d = WhiteBoxDrafter("h", head, 48, 48, min_confidence=0.0)
    d.reset(ids)
    n = T - 4  # the context is ids[:n]; the target has features for positions 0 .. n - 2
    d.take_features(0, hs, n - 1)
    ctx = ids[:n]
    # Step 1 at position n - 2 predicts token n; teacher-forced predictions cover earlier positions too.
    got = d.predict(ctx, 2, n - 2, Sampling(1.0))
    want = torch.softmax(head.logits(a1[0, : n - 2]), -1)
    assert torch.allclose(got, want, atol=1e-5)
    # Step 2 at position n - 1 reads step 1's output state and the drafted token (= ids[n] when right).
    draft = d.propose(ctx, 2, Sampling(0.0), None)
    assert draft.tokens[0] == int(head.logits(a1[0, n - 2]).argmax())
    if draft.tokens[0] == ids[n]:
        assert draft.tokens[1] == int(head.logits(a2[0, n - 1]).argmax())
    # Drafting leaves only true-feature positions in the head's cache.
    assert d.k.shape[2] == n - 1 and len(d.tokens) == n - 1


@pytest.mark.parametrize("window", [0, 8])
def test_features_held_are_the_positions_handed_over(window):
    """take_features writes in place into a buffer that grows: after rounds of different sizes, rollbacks (a round
    hands over again from a rejected position on), a jump (a long idle spell: the history restarts) and, with a
    window, trimming, the rows held are exactly those a plain list of every position's last handed-over row
    says, from f0 on."""
    target = tiny_llama(vocab=48, layers=3, seed=1)
    head = build_head(target, HeadConfig.from_target(target.config), None)
    d = WhiteBoxDrafter("h", head, 48, 48, window=window)
    d.reset([])
    layers, width = d.feature_layers, head.c.hidden_size
    g = torch.Generator().manual_seed(3)
    truth: dict[int, torch.Tensor] = {}
    start = 0
    for step, (back, rows) in enumerate([(0, 40), (0, 3), (1, 5), (0, 1), (2, 4)] + [(0, 7), (3, 9)] * 40
                                        + [(-500, 6), (0, 2)]):
        start = max(0, start - back) if back >= 0 else start - back  # back < 0: a jump forward past a gap
        if back < 0:
            truth.clear()
        hidden = tuple(torch.randn(1, rows + 2, width, generator=g) for _ in range(4))
        d.take_features(start, hidden, rows)
        for r in range(rows):
            truth[start + r] = torch.cat([hidden[i][0, r] for i in layers])
        for pos in [p for p in truth if p >= start + rows]:  # a rollback drops what followed
            del truth[pos]
        start += rows
        held = d.feats
        assert d.f0 + held.shape[0] == start, step
        assert torch.equal(held, torch.stack([truth[p] for p in range(d.f0, start)])), step
        if window:
            assert held.shape[0] <= 2 * (window + 64)
    assert d.feats.shape[0] == 8 and d.f0 == start - 8  # the jump restarted the history
    assert torch.equal(d._feature_rows(start - 3, start), d.feats[-3:]) and d._feature_rows(d.f0 - 1, start) is None


def _first_position_hits(target, head, ids: list[int], starts: list[int], shift: int = 0) -> list[bool]:
    """Offline, as training scores a head: one teacher-forced target pass over the whole text, step 1 of
    training-time test on its features; for each position n, whether the head's top-1 for token n is ids[n].
    `shift` feeds every feature that many positions off (what a bug in the hand-over would do)."""
    with torch.no_grad():
        hs = target(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i][0] for i in head.c.feature_layers], dim=-1)
        if shift:
            feats = torch.cat((feats[:1].repeat(shift, 1), feats[:-shift]))
        ids_b, _ = batch_tensors([Sequence(torch.tensor(ids), feats, torch.zeros(0), torch.zeros(0), torch.zeros(0))],
                                 torch.device("cpu"))
        (a1,) = unrolled_states(head, ids_b, feats[None], 1)
        # Row t of step 1 reads (feature t, token t + 1) and predicts token t + 2.
        return [int(head.logits(a1[0, n - 2]).argmax()) == ids[n] for n in starts]


def test_live_first_position_acceptance_is_the_teacher_forced_agreement():
    """A head's first drafted token is accepted in the engine exactly where its teacher-forced top-1 on the
    finished text agrees with the target, round by round; a feature fed one position off disagrees."""
    target, prompts, _, head, _, _ = _trained_tiny(steps=60)
    spec = DrafterSpec("h", "white-box", "a trained tiny head")
    bundle = Bundle(Preset("tiny", "t", "tiny", (spec,), gamma=4), target, None, {"h": spec}, {"h": head.eval()})
    live: list[bool] = []
    offline: list[bool] = []
    off_by_one: list[bool] = []
    for prompt in prompts[:8]:
        rounds, s = run(bundle, prompt, policy="single:h", max_new_tokens=24)
        ids = prompt + list(s.token_ids)
        assert ids[len(prompt):] == target_greedy(bundle, prompt, 24)
        drafted = [r for r in rounds if r.draft]
        starts = [len(prompt) + r.new_tokens - len(r.emitted) for r in drafted]
        live += [r.accepted >= 1 for r in drafted]
        offline += _first_position_hits(target, head, ids, starts)
        off_by_one += _first_position_hits(target, head, ids, starts, shift=1)
    assert len(live) >= 40 and 10 <= sum(live) < len(live), "a head that agrees sometimes, not always"
    assert live == offline
    assert off_by_one != live


def test_engine_hands_over_the_targets_hidden_states():
    """After every round the head holds exactly the target's hidden states of a fresh full pass."""
    bundle = tiny_bundle(vocab=32, seed=5, scale=3.0, white_box=True)
    heads: list[WhiteBoxDrafter] = []

    def inspect(cache, ids, drafters):
        d = next(x for x in drafters if isinstance(x, WhiteBoxDrafter))
        with torch.no_grad():
            hs = bundle.target(input_ids=torch.tensor([ids[:-1]]), output_hidden_states=True).hidden_states
        full = torch.cat([hs[i][0] for i in d.feature_layers], dim=-1)
        assert d.f0 + d.feats.shape[0] == len(ids) - 1, "features for exactly the positions the target's cache holds"
        assert torch.allclose(d.feats, full[d.f0 :], atol=1e-4)
        heads.append(d)

    run(bundle, [1, 2, 3, 4, 1, 2, 3], policy="metasd-ucb", drafters=["prompt-lookup", "tiny-eagle"],
        max_new_tokens=30, inspect=inspect)
    assert heads


@pytest.mark.parametrize("policy,kw", [
    ("single:tiny-eagle", {}),
    ("metasd-ucb", dict(drafters=["prompt-lookup", "token-recycling", "tiny-eagle"], full_info=True)),
    ("metasd-ucb-cost", dict(drafters=["prompt-lookup", "tiny-eagle", "tiny-lm"])),
])
@pytest.mark.parametrize("window", [0, 6])
def test_greedy_identity_with_a_white_box_head(policy, kw, window):
    bundle = tiny_bundle(vocab=40, seed=7, scale=4.0, white_box=True, head_window=window)
    for prompt in ([1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 9, 30, 2, 11, 5, 8, 1, 1, 4, 6, 2, 9]):
        ref = target_greedy(bundle, prompt, 40)
        rounds, s = run(bundle, prompt, policy=policy, max_new_tokens=40, **kw)
        assert list(s.token_ids) == ref, policy
        if policy == "single:tiny-eagle":
            assert any(r.draft for r in rounds), "the head drafted"


def test_predict_on_a_one_token_context_predicts_nothing():
    bundle = tiny_bundle(vocab=32, seed=5, white_box=(0, 1, 2, 3))
    rounds, s = run(bundle, [5], policy="single:tiny-eagle", max_new_tokens=8, full_info=True)
    assert list(s.token_ids) == target_greedy(bundle, [5], 8)


def test_measured_costs_cover_every_drafter_that_drafts():
    from metasd.decoding.catalog import measure_costs

    bundle = tiny_bundle(vocab=40, seed=7, scale=4.0, white_box=True)
    names = ["prompt-lookup", "tiny-lm", "tiny-eagle"]
    c, detail = measure_costs(bundle, names, max_new_tokens=16, progress=lambda m: None,
                              prompts=([1, 2, 3, 4, 1, 2, 3],))
    assert set(c) == set(names) and all(v > 0 for v in c.values())
    assert c["prompt-lookup"] < c["tiny-lm"], "copying costs less than running a model"
    assert detail["target_step_ms"] > 0


# ---------------------------------------------------------------------------------------------
# The shipped heads (the offline target)


@pytest.mark.offline_model
def test_shipped_heads_load_share_the_target_and_match_their_cards(offline):
    assert len(HEADS) >= 3
    total = sum(p.stat().st_size for p in distilled_path(HEADS[0]).parent.glob("*.safetensors"))
    assert total <= MAX_BYTES, f"drafter weights in the repository: {total:,} bytes"
    for spec in HEADS:
        path = distilled_path(spec)
        assert path.exists(), f"{path} is missing"
        head = offline.models[spec.name]
        assert head.embed is offline.target.get_input_embeddings()
        assert isinstance(head.lm_head, DraftHead)
        assert torch.equal(head.lm_head.weight, offline.target.lm_head.weight[head.lm_head.ids])
        config, info = read_head_info(path)
        card = path.with_suffix(".md").read_text(encoding="utf-8")
        assert hashlib.sha256(path.read_bytes()).hexdigest() in card, f"{spec.name}: card sha256 is stale"
        assert f"{path.stat().st_size:,} bytes" in card
        assert json.loads(re.search(r"```json\n(.*?)\n```", card, re.S).group(1)) == config
        assert info["kind"] == "white-box" and info["eval"]["agreement"][0] > info["eval_before"]["agreement"][0]


@pytest.mark.offline_model
def test_shipped_heads_draft_for_a_class_what_they_draft_alone(offline):
    """A shipped head's draft-vocabulary LM head is its own copy, held beside its registered layers: it is packed
    like them and the shared rounds' probe reads it, so several requests' head steps in one call (drafting
    together) give each request its solo bits, last-row logits included. (Once, it was neither: its rows
    depended on their company, and the probe, blind to it, still let a class draft together.)"""
    from unittest import mock

    from metasd.core.passes import HeadPart, head_alone
    from metasd.models import cpu_linear
    from metasd.serving import batch

    for spec in HEADS:
        head = offline.models[spec.name]
        if cpu_linear.enabled() and offline.target.device.type == "cpu":
            assert isinstance(head.lm_head.proj, cpu_linear.PackedLinear), spec.name
        probed: set[tuple[int, int]] = set()

        def shapes(fn, x, windows, probed=probed):  # (in, out) of each product the probe reads
            probed.add((x.shape[-1], fn(x[:, :1]).shape[-1]))
            return True

        with mock.patch.object(batch, "rows_agree", side_effect=shapes):
            batch.row_invariant(head)
        assert (head.c.hidden_size, head.lm_head.ids.numel()) in probed, probed
        if not batch.row_invariant(head):  # a CPU whose packed kernels vary with the row count: drafts go alone
            continue
        g = torch.Generator().manual_seed(1)
        d, kv, hd = head.c.hidden_size, head.c.num_kv_heads, head.c.head_dim
        parts = [HeadPart(head, torch.randn(t, d, generator=g), torch.randint(0, 4000, (t,), generator=g),
                          torch.arange(n, n + t)[None],
                          None if not n else (torch.randn(1, kv, n, hd, generator=g), torch.randn(1, kv, n, hd, generator=g)))
                 for t, n in ((1, 9), (1, 0), (3, 17), (1, 2), (1, 5))]
        for p, got in zip(parts, head.run_together(parts), strict=True):
            assert all(torch.equal(a, b) for a, b in zip(head_alone(p), got, strict=True)), spec.name


PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
           "Tom has 12 apples and gives away 5. How many apples does he have left?"]


@pytest.mark.offline_model
@pytest.mark.parametrize("name", [d.name for d in HEADS])
def test_shipped_head_is_lossless(offline, reference_model, name):
    accepted = 0
    for prompt in PROMPTS:
        _, ref = independent_greedy(reference_model, offline, prompt, 32)
        rounds, s = run(offline, prompt, policy=f"single:{name}", max_new_tokens=32)
        assert list(s.token_ids) == ref, f"{name} differs from the target on {prompt[:40]!r}"
        accepted += s.mean_accepted * s.target_calls
    assert accepted > 0, f"{name} never had a draft accepted"

