"""oneDNN-packed linear layers (metasd/models/cpu_linear.py): same products, same greedy outputs, safe fallbacks."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import DynamicCache

from metasd import run, target_greedy
from metasd.core.kvcache import new_cache
from metasd.models import cpu_linear
from metasd.models.cpu_linear import PackedLinear, live_packed, pack_linears, unpack_linears
from tests.tiny import tiny_bundle, tiny_llama

pytestmark = pytest.mark.skipif(cpu_linear._packed_op() is None, reason="this torch has no oneDNN packed linear")


def _count(model: nn.Module) -> int:
    return sum(isinstance(m, PackedLinear) for m in model.modules())


def test_packing_replaces_every_linear_and_keeps_the_products():
    plain = tiny_llama(vocab=64, layers=3, hidden=64, seed=3)
    packed = copy.deepcopy(plain)
    n_linear = sum(type(m) is nn.Linear for m in plain.modules())
    assert pack_linears(packed) == n_linear == 3 * 7 + 1
    assert _count(packed) == n_linear and not any(type(m) is nn.Linear for m in packed.modules())
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = plain(ids).logits, packed(ids).logits
    assert torch.allclose(want, got, rtol=1e-4, atol=1e-5), (want - got).abs().max()
    # Nothing to pack twice; the original parameters are still the ones the model reports.
    assert pack_linears(packed) == 0
    assert packed.lm_head.weight.data_ptr() == packed.lm_head.weight.data_ptr()
    assert sum(p.numel() for p in packed.parameters()) == sum(p.numel() for p in plain.parameters())


def test_default_kernels_compute_as_the_unpacked_layers_and_only_within():
    """The benchmark's second yardstick: within `default_kernels` the packed op is not called and the logits
    are bitwise those of the unpacked model; after it (an error inside included) the packed op is back."""
    plain = tiny_llama(vocab=64, layers=2, hidden=64, seed=5)
    packed = copy.deepcopy(plain)
    n = pack_linears(packed)
    assert n > 0, "nothing packed (METASD_PACKED_LINEAR=0?): this test would check nothing"
    calls = []
    mlps = [m._gate_up for m in packed.modules() if "_gate_up" in m.__dict__]
    attns = [m._qkv for m in packed.modules() if "_qkv" in m.__dict__]
    for m in [*(m for m in packed.modules() if isinstance(m, PackedLinear)), *mlps, *attns]:
        op = m._op
        m._op = lambda *a, _op=op: calls.append(1) or _op(*a)
    # A fused MLP makes one product of its gate and up projections' two, a fused attention one of three.
    per_pass = n - len(mlps) - 2 * len(attns)
    assert mlps and attns
    ids = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        with cpu_linear.default_kernels(packed) as switched:
            inside = packed(ids).logits
        assert switched == n and not calls
        assert torch.equal(inside, plain(ids).logits)
        packed(ids)
        assert len(calls) == per_pass
        with pytest.raises(RuntimeError), cpu_linear.default_kernels(packed):
            with cpu_linear.default_kernels(packed):
                pass
            packed(ids)  # the inner one ended: the outer one still holds
            assert len(calls) == per_pass
            raise RuntimeError("a run that fails inside")
        packed(ids)
        assert len(calls) == 2 * per_pass
    with cpu_linear.default_kernels(plain) as switched:
        assert switched == 0  # nothing packed: nothing to switch


def _fused(model: nn.Module) -> tuple[int, int, int]:
    """(MLPs whose gate and up projections are one product, attentions whose query, key and value projections
    are one, RMSNorms computed by torch's fused op)."""
    f = [m.__dict__["forward"].__func__ for m in model.modules() if "forward" in m.__dict__]
    return f.count(cpu_linear._mlp_forward), f.count(cpu_linear._attention_forward), f.count(cpu_linear._rms_forward)


def test_fused_layers_give_the_unfused_bits_and_fewer_calls():
    """Packing also fuses each MLP's gate and up projections into one product, each attention's query, key and
    value projections into one, and each RMSNorm into one op, where a probe gives the same bits: the logits are
    bitwise those of the packed, unfused model for 1 to 9 ids on a cache, a deep copy stays fused, and unpacking
    undoes it."""
    model = tiny_llama(vocab=64, layers=3, hidden=64, seed=4)
    pack_linears(model)
    assert _fused(model) == (3, 3, 2 * 3 + 1), "every MLP, attention and norm (two a layer, one final)"
    unfused = copy.deepcopy(model)
    assert _fused(unfused) == (3, 3, 7) and cpu_linear.unfuse_layers(unfused) == 13 and _fused(unfused) == (0, 0, 0)
    ids = torch.randint(0, 64, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for k in (1, 2, 3, 5, 9):
            a, b = DynamicCache(), DynamicCache()
            model(ids[:, :12], past_key_values=a)
            unfused(ids[:, :12], past_key_values=b)
            assert torch.equal(model(ids[:, 12:12 + k], past_key_values=a).logits,
                               unfused(ids[:, 12:12 + k], past_key_values=b).logits), k
    assert unpack_linears(model) > 0 and _fused(model) == (0, 0, 0)


def test_fusion_is_refused_where_the_bits_would_change(monkeypatch):
    monkeypatch.setattr(cpu_linear, "_same_bits", lambda *a: False)
    monkeypatch.setattr(cpu_linear, "_same_attention", lambda *a: False)
    model = tiny_llama(vocab=64, layers=2, hidden=64, seed=4)
    assert pack_linears(model) > 0 and _fused(model) == (0, 0, 0)


def test_an_attention_that_computes_otherwise_is_not_fused(monkeypatch):
    """The attention probe runs the module's own forward against the fused one: an attention class with a step of
    its own (here a last-bit change of its output, as a norm on the keys would make) keeps its own forward."""
    model = tiny_llama(vocab=64, layers=2, hidden=64, seed=4)
    attn_cls = type(model.model.layers[0].self_attn)
    own = attn_cls.forward

    def otherwise(self, *a, **k):
        out, w = own(self, *a, **k)
        return out * (1 + 2 ** -20), w

    monkeypatch.setattr(attn_cls, "forward", otherwise)
    assert pack_linears(model) > 0 and _fused(model) == (2, 0, 5)


def test_training_through_a_fused_attention_reaches_its_own_weights():
    model = tiny_llama(vocab=64, layers=1, hidden=64, seed=6)
    pack_linears(model)
    attn = next(m for m in model.modules() if "_qkv" in m.__dict__)
    for p in (attn.q_proj, attn.k_proj, attn.v_proj):
        p.weight.requires_grad_(True)
    model(torch.randint(0, 64, (1, 8))).logits.sum().backward()
    assert all(p.weight.grad is not None and p.weight.grad.abs().sum() > 0 for p in (attn.q_proj, attn.k_proj, attn.v_proj))


def test_training_through_a_fused_mlp_reaches_its_own_weights():
    """With gradients the fused layers compute as the plain ones do (the packed product has no backward): the
    loss reaches the gate and up projections' weights."""
    model = tiny_llama(vocab=64, layers=1, hidden=64, seed=6)
    pack_linears(model)
    mlp = next(m for m in model.modules() if "_gate_up" in m.__dict__)
    mlp.gate_proj.weight.requires_grad_(True)
    mlp.up_proj.weight.requires_grad_(True)
    model(torch.randint(0, 64, (1, 8))).logits.sum().backward()
    assert mlp.gate_proj.weight.grad is not None and mlp.up_proj.weight.grad.abs().sum() > 0


def test_two_rows_are_padded_to_three_and_come_back_as_two(monkeypatch):
    """A verification of one drafted token feeds two ids: computed as three rows (the third zeros, dropped),
    each real row exactly what the unpadded op gives, for any leading shape."""
    layer = PackedLinear(nn.Linear(64, 48, bias=True), *cpu_linear._packed_op())
    x = torch.randn(1, 2, 64, generator=torch.Generator().manual_seed(5))
    seen: list[int] = []
    op = layer._op
    monkeypatch.setattr(layer, "_op", lambda inp, *a: (seen.append(inp.numel() // inp.shape[-1]), op(inp, *a))[1])
    with torch.no_grad():
        padded = layer(x)
        monkeypatch.setattr(cpu_linear, "PAD_ROWS", {})
        layer.min_rows = layer.min_rows  # the layer's padding table, made again without the rule
        plain = layer(x)
        flat = layer(x[0])
    assert seen == [3, 2, 2]  # padded once, then (padding off) as given
    assert padded.shape == plain.shape == (1, 2, 48) and flat.shape == (2, 48)
    assert torch.allclose(padded, plain, rtol=1e-5, atol=1e-6)
    assert torch.allclose(padded, nn.functional.linear(x, layer.weight, layer.bias), rtol=1e-4, atol=1e-5)


def _lone_row_differs(op):
    """A stand-in for the packed op as an AVX-512 CPU computes it: a call of one row takes another kernel, whose
    bits differ from the same row's among others (here by one ulp-scale nudge); calls of two or more agree."""
    def differs(inp, *a):
        out = op(inp, *a)
        return out * (1 + 2**-20) if inp.numel() // inp.shape[-1] == 1 else out
    return differs


def test_a_lone_row_that_takes_another_kernel_is_padded_so_every_row_is_batch_invariant(monkeypatch):
    """Whatever CPU this runs on: packing probes each layer shape for the fewest rows a call needs to give a row
    the bits it has in company (min_rows) and pads smaller calls up to it, so the model is row-invariant and the
    shared rounds need no blocks. Without the padding the same model is not row-invariant (the probe can fail)."""
    from metasd.serving.batch import row_invariant

    reorder, op = cpu_linear._packed_op()
    monkeypatch.setattr(cpu_linear, "_packed_op", lambda: (reorder, _lone_row_differs(op)))
    model = tiny_llama(vocab=64, layers=2, hidden=64, seed=7)
    assert pack_linears(model) > 0
    layers = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert {m.min_rows for m in layers} == {2}
    assert "64->64 to 2 rows" in cpu_linear.padding(model)
    assert row_invariant(model)
    x = torch.randn(1, 1, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        alone = layers[0](x)[0, 0]
        among = layers[0](torch.cat((x, torch.randn(1, 4, 64)), dim=1))[0, 0]
    assert torch.equal(alone, among)
    copied = copy.deepcopy(model)  # a copy (a drafter's view of the target) keeps the padding
    assert {m.min_rows for m in copied.modules() if isinstance(m, PackedLinear)} == {2}
    for m in layers:
        m.min_rows = 1
    assert not row_invariant(model), "the stand-in did not make a lone row differ: this test would check nothing"


def test_a_layer_no_padding_makes_invariant_is_left_unpadded_and_the_model_reported_variant(monkeypatch):
    """A kernel whose bits depend on the number of rows at every size (as sgemm's): no min_rows helps, the layer
    is left as it was (min_rows 1) and the model reports itself not row-invariant (the shared rounds then run in
    blocks of rows, tests/test_serving.py)."""
    from metasd.serving.batch import row_invariant

    reorder, op = cpu_linear._packed_op()

    def by_count(inp, *a):
        n = inp.numel() // inp.shape[-1]
        return op(inp, *a) * (1 + n * 2**-22)

    monkeypatch.setattr(cpu_linear, "_packed_op", lambda: (reorder, by_count))
    model = tiny_llama(vocab=64, layers=1, hidden=64, seed=8)
    assert pack_linears(model) > 0
    assert {m.min_rows for m in model.modules() if isinstance(m, PackedLinear)} == {1}
    assert cpu_linear.padding(model) == "" and not row_invariant(model)


def test_tied_head_stays_tied_and_gradients_use_the_plain_product():
    model = tiny_llama(vocab=64, hidden=32, seed=1)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as SmolLM2's
    pack_linears(model)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    # With a gradient wanted, the forward falls back to F.linear (the packed op has no backward).
    lin = nn.Linear(8, 4)
    p = PackedLinear(lin, *cpu_linear._packed_op())
    x = torch.randn(3, 8, requires_grad=True)
    p(x).sum().backward()
    assert x.grad is not None and torch.allclose(x.grad, lin.weight.sum(0).expand(3, 8))


def test_greedy_identical_after_packing_under_every_kind_of_drafter():
    for seed in range(4):
        bundle = tiny_bundle(vocab=48, seed=seed, layers=2, hidden=32, draft_vocab=tuple(range(0, 48, 2)),
                             white_box=True)
        prompt = [(7 * seed + i) % 48 for i in range(9)]
        before = target_greedy(bundle, prompt, 30)
        assert pack_linears(bundle.target) > 0
        assert target_greedy(bundle, prompt, 30) == before, "packing changed the target's own greedy output"
        for policy in ("metasd-ucb", "metasd-ucb-cost", "single:layer-skip", "single:tiny-eagle", "single:tiny-distilled"):
            _, s = run(bundle, prompt, policy=policy, max_new_tokens=30, chat_template=False)
            assert list(s.token_ids) == before, (seed, policy)


def test_the_benchmarks_default_kernel_yardstick_runs_the_target_unpacked():
    """`baseline:default-kernels` times the packed target with its default kernels (no packed op called
    in its run) and gives the baseline's tokens."""
    from metasd.benchmark.bench import parse_methods, run_method

    bundle = tiny_bundle(vocab=48, seed=1, layers=2, hidden=32)
    n = pack_linears(bundle.target)
    assert n > 0
    calls = []
    mlps = [m._gate_up for m in bundle.target.modules() if "_gate_up" in m.__dict__]
    attns = [m._qkv for m in bundle.target.modules() if "_qkv" in m.__dict__]
    for m in [*(m for m in bundle.target.modules() if isinstance(m, PackedLinear)), *mlps, *attns]:
        op = m._op
        m._op = lambda *a, _op=op: calls.append(1) or _op(*a)
    base, default = parse_methods("baseline,baseline:default-kernels", bundle.drafter_names, list(bundle.models))
    prompt = list(range(3, 12))
    want = run_method(bundle, base, prompt, 10)
    assert len(calls) >= (n - len(mlps) - 2 * len(attns)) * 10  # fused: one product for two or three layers
    del calls[:]
    got = run_method(bundle, default, prompt, 10)
    assert not calls and got.token_ids == want.token_ids and got.target_calls == 0  # no counter given
    assert default.kind == "default-kernels" and not default.ours


def test_fallbacks_leave_the_model_unchanged(monkeypatch):
    model = tiny_llama(seed=2)
    monkeypatch.setenv(cpu_linear.ENV, "0")
    assert pack_linears(model) == 0 and _count(model) == 0
    monkeypatch.delenv(cpu_linear.ENV)
    assert pack_linears(copy.deepcopy(model).to(torch.bfloat16)) == 0
    # An op that computes something else is caught by the probe, with a message.
    reorder, _ = cpu_linear._packed_op()
    monkeypatch.setattr(cpu_linear, "_packed_op", lambda: (reorder, lambda x, w, b, *a: torch.zeros(*x.shape[:-1], 1)))
    said = []
    assert pack_linears(model, said.append) == 0 and _count(model) == 0
    assert said and "unavailable" in said[0]


@pytest.mark.offline_model
def test_offline_target_is_packed_and_lossless_against_the_default_kernels(offline, reference_model):
    target = offline.target
    assert _count(target) == 30 * 7 + 1
    assert target.lm_head.weight is target.model.embed_tokens.weight
    # The reference copy is packed too (it is loaded the same way); an unpacked copy of the target
    # must give the same greedy answers as the packed one.
    plain = copy.deepcopy(reference_model)
    assert _count(plain) == 30 * 7 + 1 and plain.lm_head.weight is plain.model.embed_tokens.weight
    assert unpack_linears(plain) == 30 * 7 + 1 and _count(plain) == 0
    from metasd.decoding.engine import encode_prompt

    for prompt in ("Summarize: the council approved the park plan after residents asked for trees.",
                   "Write a Python function that reverses a string.", "What is 12 * 13? Show your steps."):
        ids = encode_prompt(offline, prompt, True)
        inp = torch.tensor([ids])
        eos = sorted(offline.eos_ids)
        out = plain.generate(inp, attention_mask=torch.ones_like(inp), do_sample=False, max_new_tokens=40,
                             eos_token_id=eos, pad_token_id=eos[0])[0, len(ids):].tolist()
        _, s = run(offline, prompt, policy="metasd-ucb-cost", max_new_tokens=40)
        assert list(s.token_ids) == out, prompt


def test_fused_parts_drop_their_packed_copy_and_pack_again_if_called():
    """Once a fused product computes them, the gate, up, query, key and value projections keep no packed copy of
    their own (memory: 278 MB on the offline target); called directly anyway, a part packs again and computes
    what a freshly packed layer does."""
    model = tiny_llama(vocab=64, layers=2, hidden=64, seed=7)
    pack_linears(model)
    layer = model.model.layers[0]
    parts = [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.mlp.gate_proj,
             layer.mlp.up_proj]
    assert all(p._w is None and p.packed is None for p in parts)
    assert layer.mlp.down_proj._w is not None and layer.self_attn.o_proj._w is not None
    x = torch.randn(1, 3, 64, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        for p in parts:
            fresh = PackedLinear(p.plain(), *cpu_linear._packed_op())
            fresh.min_rows = p.min_rows
            assert torch.equal(p(x), fresh(x)) and p._w is not None
    assert _fused(copy.deepcopy(model)) == (2, 2, 5)  # a copy stays fused (its parts packed again: used above)


def test_a_fused_attention_trains_any_one_of_its_projections():
    """Only the key projection trainable: the fused forward takes the plain path and the gradient reaches it."""
    model = tiny_llama(vocab=64, layers=1, hidden=64, seed=9)
    pack_linears(model)
    attn = next(m for m in model.modules() if "_qkv" in m.__dict__)
    attn.k_proj.weight.requires_grad_(True)
    model(torch.randint(0, 64, (1, 8))).logits.sum().backward()
    assert attn.k_proj.weight.grad is not None and attn.k_proj.weight.grad.abs().sum() > 0


def test_lone_rows_pad_to_three_only_where_the_sweep_says_so_and_compute_the_same_bits():
    """pad_lone_rows: a model below the size bound is never timed; above it (the bound lowered here), padding follows
    the measured sweeps (a stand-in measure: clearly faster, then not), and the padded model's one-id passes give
    bitwise the logits they gave unpadded. The real sweep runs and restores every layer's padding."""
    from metasd.models.cpu_linear import LONE_PAD, lone_row_sweeps, pad_lone_rows

    model = tiny_llama(vocab=64, layers=2, hidden=64)
    assert pack_linears(model) > 0
    layers = live_packed(model)
    before = [m.min_rows for m in layers]
    assert not pad_lone_rows(model, measure=lambda ls: (10.0, 1.0))  # small: never timed, never padded
    assert not pad_lone_rows(model, measure=lambda ls: (10.0, 9.9), min_bytes=0)
    assert [m.min_rows for m in layers] == before
    plain, padded = lone_row_sweeps(layers, reps=1)
    assert plain > 0 and padded > 0 and [m.min_rows for m in layers] == before
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        want = [model(input_ids=ids[:, : n + 1]).logits[0, -1] for n in range(8)]
        assert cpu_linear.lone_padding(model) == 0
        bits = cpu_linear.padding(model)
        assert pad_lone_rows(model, measure=lambda ls: (10.0, 5.0), min_bytes=0)
        assert all(m.min_rows >= LONE_PAD for m in layers)
        # the load log keeps the two reasons apart: the probed bits' padding unchanged, the timed one beside it
        assert cpu_linear.lone_padding(model) == LONE_PAD and cpu_linear.padding(model) == bits
        assert pad_lone_rows(model, measure=lambda ls: (10.0, 5.0), min_bytes=0) and cpu_linear.padding(model) == bits
        assert cpu_linear.lone_padding(copy.deepcopy(model)) == LONE_PAD
        got = []
        cache = new_cache(model.config)
        for n in range(8):  # one id a pass, as a plain step feeds it
            got.append(model(input_ids=ids[:, n: n + 1], position_ids=torch.tensor([[n]]), past_key_values=cache,
                             use_cache=True).logits[0, -1])
    cache_ref = new_cache(model.config)
    with torch.no_grad():
        for m, b in zip(layers, before, strict=True):
            m.min_rows = b
        ref = [model(input_ids=ids[:, n: n + 1], position_ids=torch.tensor([[n]]), past_key_values=cache_ref,
                     use_cache=True).logits[0, -1] for n in range(8)]
    assert all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want, strict=True))
