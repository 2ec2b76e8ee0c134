"""Verification at the cost of one step on a CPU: linear layers with weights pre-packed for oneDNN.

Speculative decoding pays because the target verifies gamma + 1 ids for about the price of one:
a decoding step is bound by reading the weights, not by arithmetic. On a GPU that holds; on this
CPU it did not, because of the GEMM kernel, not the hardware. With one thread, SmolLM2-135M in
float32 needed ~60 ms for one id and ~99 ms for five (docs/DESIGN.md §4): the default sgemm path for
a handful of rows re-streams the weights, and two or three rows were even slower than four.
oneDNN's inner-product primitive with a weight reordered once into its blocked layout reads each
weight once for all rows: five ids then cost ~50 ms, the same as one (measured in
`scripts/measure_verify.py`).

The packed op (`torch.ops.mkldnn._linear_pointwise`, the one PyTorch's own CPU compiler emits) is
not a public API, so packing is checked on the spot: the op must exist and agree with
`F.linear` on a probe, or the model is left as it was. `METASD_PACKED_LINEAR=0` turns it off.
Row results differ from `F.linear` by float32 rounding only (~1e-6 relative); the target's own
greedy reference runs through the same packed layers, so losslessness is measured against the
model as it actually computes.
"""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from metasd import settings

ENV = "METASD_PACKED_LINEAR"
# Row-count hint for oneDNN's reorder: verification feeds 1-9 rows; 8 measured best for 2-8 and
# no worse than 1 for a single row.
ROWS_HINT = 8
# oneDNN runs two rows through a slower path than three, and the third row's zeros change nothing in
# the two real rows' results (same kernel per row: bitwise equal logits on the offline target). A
# verification of one drafted token (two ids, most rounds on hard prompts) took 69 ms against 60 ms
# for three ids; padded it costs what three do.
PAD_ROWS = {2: 3}
# One row may take another kernel than several (a matrix-vector product): on an AVX-512 CPU (Xeon, AMX,
# 2026-12-04) the 1536 -> 576 projection gave a lone row other bits (1e-6 apart) than the same row among
# others, while every call of 2 to 192 rows agreed. A model whose row depends on its company is not batch-
# invariant: shared rounds would change a request's answer. So each layer shape is probed when packed for
# the fewest rows a call needs to give every row the bits it has in any larger call (`min_rows`), and
# smaller calls are padded with zero rows up to it. On that CPU only the down projection pads one row to
# two: a one-id pass 65.0 -> 66.3 ms there (median of 15, three interleaved pairs), three ids unchanged.
MIN_ROWS_TRIED = (1, 2, 3, 4, 8)


def _packed_op():
    ops = getattr(torch.ops, "mkldnn", None)
    reorder = getattr(ops, "_reorder_linear_weight", None) if ops is not None else None
    linear = getattr(ops, "_linear_pointwise", None) if ops is not None else None
    if reorder is None or linear is None or not torch.backends.mkldnn.is_available():
        return None
    return reorder, linear


class PackedLinear(nn.Module):
    """`nn.Linear` whose forward uses a oneDNN-packed copy of the weight.

    `weight` and `bias` stay the original parameters, so code that reads them (the drafters'
    restricted heads, tied embeddings, head initialisation) sees what it saw before. When a gradient
    is needed the plain `F.linear` runs (the packed op has no backward).
    """

    def __init__(self, linear: nn.Linear, reorder: Callable, op: Callable) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self._reorder, self._op = reorder, op
        self.default_kernel = False  # set by `default_kernels`: compute as the layer did before packing
        self.register_buffer("packed", reorder(linear.weight.detach(), ROWS_HINT), persistent=False)
        # The forward runs ~200 times a verification: it reads plain attributes, not nn.Module's registered ones
        # (each a __getattr__ call), and one dict says which row counts are padded to how many.
        object.__setattr__(self, "_w", self.packed)  # plain attributes (nn.Module would register the bias again)
        object.__setattr__(self, "_b", self.bias)
        self.min_rows = 1  # calls of fewer rows are padded up to it (`min_rows_for`: row-invariant bits)
        self.bits_rows = 0  # set by `pad_lone_rows`: min_rows as the bits asked, before padding for speed

    @property
    def min_rows(self) -> int:
        return self._min_rows

    @min_rows.setter
    def min_rows(self, m: int) -> None:
        self._min_rows = m
        self._pads = {r: max(PAD_ROWS.get(r, r), m) for r in range(1, max(m, max(PAD_ROWS, default=0) + 1))
                      if max(PAD_ROWS.get(r, r), m) != r}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.default_kernel or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
            return F.linear(x, self.weight, self.bias)
        shape = x.shape
        rows = x.numel() // shape[-1] if shape[-1] else 0
        pad = self._pads.get(rows)
        w = self._w if self._w is not None else self._pack()
        if pad is None:
            return self._op(x, w, self._b, "none", [], "")
        flat = x.reshape(rows, shape[-1])
        # torch.cat, not F.pad: 10 against 16 us a call here (the pad's Python wrapper and determinism checks)
        y = self._op(torch.cat((flat, flat.new_zeros(pad - rows, shape[-1]))), w, self._b, "none", [], "")
        return y[:rows].reshape(*shape[:-1], y.shape[-1])

    def release(self) -> None:
        """Drop the packed copy: a fused product computes this layer's rows now (`fuse_layers`). Called anyway, the
        layer packs its weight again (the same bits: packing is deterministic)."""
        self._buffers["packed"] = None
        object.__setattr__(self, "_w", None)

    def _pack(self) -> torch.Tensor:
        self._buffers["packed"] = self._reorder(self.weight.detach(), ROWS_HINT)
        object.__setattr__(self, "_w", self._buffers["packed"])
        return self._w

    def plain(self) -> nn.Linear:
        """An `nn.Linear` on the same parameters."""
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                        device="meta", dtype=self.weight.dtype)
        lin.weight, lin.bias = self.weight, self.bias
        return lin

    def __deepcopy__(self, memo: dict) -> PackedLinear:
        # The packed buffer is an opaque oneDNN tensor that cannot be copied: copy the parameters
        # (through memo, so a tied head stays tied to its copied embedding) and pack again.
        lin = self.plain()
        lin.weight = copy.deepcopy(self.weight, memo)
        lin.bias = copy.deepcopy(self.bias, memo)
        new = PackedLinear(lin, self._reorder, self._op)
        new.min_rows, new.bits_rows = self.min_rows, self.bits_rows
        if self._w is None:
            new.release()
        memo[id(self)] = new
        return new

    def extra_repr(self) -> str:
        pad = f", min_rows={self.min_rows}" if self.min_rows > 1 else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN{pad}"


def rows_agree(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, windows: list[tuple[int, int]]) -> bool:
    """Whether `fn` (row-wise) gives the first row of each window x[:, j: j + n] the bits it gives row j of x when
    called on all of x's rows at once: a row's result does not depend on the rows beside it. The one probe behind
    `min_rows_for` and metasd.serving.batch.row_invariant."""
    together = fn(x)[0]
    return all(torch.equal(fn(x[:, j: j + n])[0, 0], together[j]) for j, n in windows)


@torch.no_grad()
def min_rows_for(layer: nn.Module, tried: tuple[int, ...] = MIN_ROWS_TRIED, rows: int = 24, seed: int = 0) -> int:
    """The fewest rows a call of `layer` (a PackedLinear) must have, zero rows padding smaller calls, for every row
    to get the bits it gets in a call of `rows` rows, wherever it sits in either; 0 if none of `tried` does
    (the model is then not batch-invariant: the shared rounds run their passes in blocks, metasd.serving.batch)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, rows, layer.in_features, generator=g).to(layer.weight.dtype)
    windows = [(j, n) for n in (1, 2, 3, 5, 9, 17) for j in (0, 1, rows // 2, rows - n) if 0 <= j and j + n <= rows]
    before = layer.min_rows
    try:
        for m in tried:
            layer.min_rows = m
            if rows_agree(layer, x, windows):
                return m
        return 0
    finally:
        layer.min_rows = before


def held_modules(model: nn.Module) -> list[nn.Module]:
    """Every module of `model` and of the modules it holds as plain attributes, each once.

    A module held that way is not registered (no parameters or state-dict keys of the holder) yet a pass calls
    it: the fused products (`_gate_up`, `_qkv` below) and a white-box head's draft-vocabulary LM head
    (metasd.drafting.whitebox). Packing and the class's row probe (metasd.serving.batch.row_invariant) must both
    reach them.
    """
    seen: dict[int, nn.Module] = {}
    todo = [model]
    while todo:
        for m in todo.pop().modules():
            if id(m) not in seen:
                seen[id(m)] = m
                todo.extend(v for v in vars(m).values() if isinstance(v, nn.Module) and id(v) not in seen)
    return list(seen.values())


def live_packed(model: nn.Module) -> list[PackedLinear]:
    """Every packed layer a pass of `model` calls with its own packed weight: the fused products included, the parts
    they replaced (released, `PackedLinear.release`) left out."""
    return [m for m in held_modules(model) if isinstance(m, PackedLinear) and m._w is not None]


def _children(model: nn.Module, plain: bool) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, layer) for every plain `nn.Linear` (plain=True) or every `PackedLinear` registered in
    a module of `held_modules(model)`; a layer held as a plain attribute itself (a target's head a drafter
    borrows) is the holder's to pack, never replaced from here."""
    def wanted(m: nn.Module) -> bool:
        return type(m) is nn.Linear if plain else isinstance(m, PackedLinear)
    return [(parent, name, child) for parent in held_modules(model) for name, child in parent.named_children()
            if wanted(child)]


def _agrees(linear: nn.Linear, reorder: Callable, op: Callable) -> bool:
    """Does the packed op compute this layer's product on a probe (1, 2 (padded) and 5 rows)?"""
    try:
        probe = PackedLinear(linear, reorder, op)
        with torch.no_grad():
            for rows in (1, 2, 5):
                x = torch.randn(1, rows, linear.in_features, dtype=linear.weight.dtype,
                                generator=torch.Generator().manual_seed(rows))
                want, got = F.linear(x, linear.weight, linear.bias), probe(x)
                scale = want.abs().max().item() + 1e-6
                if got.shape != want.shape or (got - want).abs().max().item() > 1e-4 * scale:
                    return False
        return True
    except (RuntimeError, TypeError):
        return False


def enabled() -> bool:
    return settings.value(ENV)


def pack_linears(model: nn.Module, progress: Callable[[str], None] | None = None) -> int:
    """Replace every float32 `nn.Linear` of a CPU model by a `PackedLinear`; return how many.

    Models on other devices or dtypes, a torch without the op, or a probe that disagrees leave the
    model unchanged (0). Packing costs one extra copy of the weights (the originals stay).
    """
    found = _children(model, plain=True)
    if not found or not enabled():
        return 0
    first = found[0][2]
    if first.weight.device.type != "cpu" or any(c.weight.dtype != torch.float32 for _, _, c in found):
        return 0
    ops = _packed_op()
    if ops is None or not _agrees(first, *ops):
        if progress:
            progress("[metasd] packed CPU linear layers are unavailable here; using torch's default kernels")
        return 0
    shapes: dict[tuple[int, int, bool], int] = {}  # the kernel is chosen per shape: one probe each
    for parent, name, child in found:
        packed = PackedLinear(child, *ops)
        key = (packed.in_features, packed.out_features, packed.bias is not None)
        if key not in shapes:
            shapes[key] = min_rows_for(packed)
        packed.min_rows = max(1, shapes[key])
        setattr(parent, name, packed)
    fuse_layers(model, *ops, shapes)
    pad_lone_rows(model)
    return len(found)


# A lone row (a one-id pass: every plain step, about half of a lone retrieval drafter's rounds) went through oneDNN's
# one-row path, which streamed the weights slower than three rows on an AMD EPYC (Zen 4, 2026-12-06): the offline
# target's one-id pass 55.6 -> 50.4 ms with every lone row padded to three (six interleaved medians), bitwise the
# same logits. On the AVX2 CPU of 2026-12-04 three rows cost 84 against 70 ms for one, and on the AVX-512/AMX Xeon
# the two were level: so the model's own layers are timed both ways once, where their weights outgrow the caches
# (the effect is the weights' streaming; alone and hot a one-row call is the cheaper), and padded where three rows
# are clearly the faster.
LONE_PAD = 3
LONE_PAD_MIN_BYTES = 64 * 2**20
LONE_PAD_GAIN = 0.95  # padded sweeps must take under 95% of the plain ones' time


def pad_lone_rows(model: nn.Module, measure: Callable[[list[PackedLinear]], tuple[float, float]] | None = None,
                  min_bytes: int = LONE_PAD_MIN_BYTES) -> bool:
    """Pad every one-row call of the model's packed layers to LONE_PAD rows where a measured sweep through them
    (`measure`: ms plain, ms padded) says that is clearly faster and every layer shape gives a row padded so the
    bits it has in company (then the model computes bitwise as before, only sooner). Returns whether it did."""
    layers = live_packed(model)
    if not layers or sum(m.weight.numel() * m.weight.element_size() for m in layers) < min_bytes:
        return False
    ok: dict[tuple[int, int, bool], bool] = {}
    for m in layers:
        key = (m.in_features, m.out_features, m.bias is not None)
        if key not in ok:
            ok[key] = min_rows_for(m, tried=(max(LONE_PAD, m.min_rows),)) != 0
    if not all(ok.values()):
        return False
    plain, padded = (measure or lone_row_sweeps)(layers)
    if padded >= LONE_PAD_GAIN * plain:
        return False
    for m in layers:
        m.bits_rows = m.bits_rows or m.min_rows
        m.min_rows = max(m.min_rows, LONE_PAD)
    return True


@torch.no_grad()
def lone_row_sweeps(layers: list[PackedLinear], reps: int = 3) -> tuple[float, float]:
    """Median ms of one row through every layer in turn (a one-id pass's products, weights streamed as in a pass),
    plain and padded to LONE_PAD rows, interleaved `reps` times."""
    import statistics
    import time

    before = [m.min_rows for m in layers]
    xs = {m.in_features: torch.randn(1, 1, m.in_features, generator=torch.Generator().manual_seed(0)).to(m.weight.dtype)
          for m in layers}
    spent: dict[bool, list[float]] = {False: [], True: []}
    try:
        for _ in range(reps):
            for pad in (False, True):
                for m, b in zip(layers, before, strict=True):
                    m.min_rows = max(b, LONE_PAD) if pad else b
                t = time.perf_counter()
                for m in layers:
                    m(xs[m.in_features])
                spent[pad].append(1000 * (time.perf_counter() - t))
    finally:
        for m, b in zip(layers, before, strict=True):
            m.min_rows = b
    return statistics.median(spent[False]), statistics.median(spent[True])


# Fewer, larger calls (a one-id pass of the offline target is ~210 layer calls; each costs ~10 us around its
# product): the MLP's gate and up projections read the same input, so they are one packed product of the two
# weights stacked, and RMSNorm is torch's one fused op instead of six. Each is used only where a probe gives
# bitwise the results of the unfused layers, so the target computes exactly as before, only sooner: on the
# AVX-512 CPU of 2026-12-05 a one-id pass 70.3 -> 67.8 ms, four ids 76.9 -> 76.1 (the same model switched,
# median of 15, interleaved; scripts/measure_fusion.py), almost all of it the MLP's; every logit bitwise equal.
# The stacked product replaces the parts' own packed copies (`PackedLinear.release`: a part called directly anyway
# packs again), so fusing costs no memory; keeping both cost 291 MB of the offline preset's 2.4 GB resident.


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """An MLP's forward with its gate and up projections as one product (`self._gate_up`)."""
    gate_proj, up_proj = self.gate_proj, self.up_proj
    if gate_proj.default_kernel or (torch.is_grad_enabled() and (  # the default-kernel yardstick, or training
            x.requires_grad or gate_proj.weight.requires_grad or up_proj.weight.requires_grad)):
        return type(self).forward(self, x)
    gate, up = self._gate_up(x).chunk(2, -1)
    return self.down_proj(self.act_fn(gate) * up)


def _rms_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
        return type(self).forward(self, x)
    return F.rms_norm(x, self.weight.shape, self.weight, self.variance_epsilon)


def _same_bits(a: Callable[[torch.Tensor], torch.Tensor], b: Callable[[torch.Tensor], torch.Tensor], width: int) -> bool:
    with torch.no_grad():
        for rows in (1, 2, 3, 5, 9):
            x = torch.randn(1, rows, width, generator=torch.Generator().manual_seed(rows))
            if not torch.equal(a(x), b(x)):
                return False
    return True


def _fuse_mlp(mlp: nn.Module, reorder: Callable, op: Callable, shapes: dict) -> bool:
    gate, up = getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)
    if not (isinstance(gate, PackedLinear) and isinstance(up, PackedLinear) and hasattr(mlp, "act_fn")
            and gate.bias is None and up.bias is None and gate.in_features == up.in_features
            and gate.out_features == up.out_features):
        return False
    stacked = nn.Linear(gate.in_features, gate.out_features + up.out_features, bias=False, device="meta")
    stacked.weight = nn.Parameter(torch.cat((gate.weight, up.weight)).detach(), requires_grad=False)
    fused = PackedLinear(stacked, reorder, op)
    key = (fused.in_features, fused.out_features, False)
    if key not in shapes:
        shapes[key] = min_rows_for(fused)
    fused.min_rows = max(1, shapes[key])
    both = lambda x: torch.cat((gate(x), up(x)), -1)  # noqa: E731
    if not _same_bits(fused, both, gate.in_features):
        return False
    object.__setattr__(mlp, "_gate_up", fused)  # not a submodule: no new parameters or state-dict keys
    mlp.forward = _mlp_forward.__get__(mlp)
    gate.release()
    up.release()
    return True


def _fuse_norm(norm: nn.Module) -> bool:
    w = getattr(norm, "weight", None)
    if not (type(norm).__name__.endswith("RMSNorm") and isinstance(w, torch.Tensor) and w.dim() == 1
            and hasattr(norm, "variance_epsilon")):
        return False
    fused = _rms_forward.__get__(norm)
    if not _same_bits(fused, norm, w.shape[0]):
        return False
    norm.forward = fused
    return True


def _attention_forward(self: nn.Module, hidden_states: torch.Tensor, position_embeddings: Any = None,
                       attention_mask: torch.Tensor | None = None, past_key_values: Any = None, **kwargs: Any) -> Any:
    """Llama's attention forward (transformers' LlamaAttention.forward, step for step) with the query, key and
    value projections as one product (`self._qkv`)."""
    projs = (self.q_proj, self.k_proj, self.v_proj)
    if any(p.default_kernel for p in projs) or (torch.is_grad_enabled() and (
            hidden_states.requires_grad or any(p.weight.requires_grad for p in projs))):
        return type(self).forward(self, hidden_states, position_embeddings, attention_mask, past_key_values, **kwargs)
    mod = sys.modules[type(self).__module__]
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    q, k, v = self._qkv(hidden_states).split(self._qkv_sizes, -1)
    query_states, key_states = q.view(hidden_shape).transpose(1, 2), k.view(hidden_shape).transpose(1, 2)
    value_states = v.view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    query_states, key_states = mod.apply_rotary_pos_emb(query_states, key_states, cos, sin)
    if past_key_values is not None:
        key_states, value_states = past_key_values.update(key_states, value_states, self.layer_idx)
    interface = _attention_functions().get_interface(self.config._attn_implementation, mod.eager_attention_forward)
    out, weights = interface(self, query_states, key_states, value_states, attention_mask,
                             dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling, **kwargs)
    return self.o_proj(out.reshape(*input_shape, -1).contiguous()), weights


@functools.cache  # the registry, found once (an import statement every call cost ~6 us, 30 a pass)
def _attention_functions() -> Any:
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError:  # older layout
        from transformers.integrations import ALL_ATTENTION_FUNCTIONS  # type: ignore[no-redef]
    return ALL_ATTENTION_FUNCTIONS


# Only attention classes whose forward is Llama's, step for step (others add norms or windows in between).
_LLAMA_ATTENTION = ("LlamaAttention",)


def _fuse_attention(attn: nn.Module, reorder: Callable, op: Callable, shapes: dict) -> bool:
    projs = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")]
    mod = sys.modules.get(type(attn).__module__)
    if not (type(attn).__name__ in _LLAMA_ATTENTION and all(isinstance(p, PackedLinear) for p in projs)
            and all(p.bias is None for p in projs) and len({p.in_features for p in projs}) == 1
            and hasattr(mod, "apply_rotary_pos_emb") and hasattr(mod, "eager_attention_forward")):
        return False
    stacked = nn.Linear(projs[0].in_features, sum(p.out_features for p in projs), bias=False, device="meta")
    stacked.weight = nn.Parameter(torch.cat([p.weight for p in projs]).detach(), requires_grad=False)
    fused = PackedLinear(stacked, reorder, op)
    key = (fused.in_features, fused.out_features, False)
    if key not in shapes:
        shapes[key] = min_rows_for(fused)
    fused.min_rows = max(1, shapes[key])
    object.__setattr__(attn, "_qkv", fused)
    object.__setattr__(attn, "_qkv_sizes", [p.out_features for p in projs])
    try:
        same = _same_attention(attn)
    except (RuntimeError, TypeError, ValueError, AttributeError):  # a forward of another signature: leave it be
        same = False
    if not same:
        for name in ("_qkv", "_qkv_sizes"):
            attn.__dict__.pop(name)
        return False
    attn.forward = _attention_forward.__get__(attn)
    for p in projs:
        p.release()
    return True


def _same_attention(attn: nn.Module) -> bool:
    """The fused forward against the module's own on 1, 2, 3, 5 and 9 rows after 7 cached positions: bitwise."""
    from transformers import DynamicCache

    width, d = attn.q_proj.in_features, attn.head_dim
    with torch.no_grad():
        for rows in (1, 2, 3, 5, 9):
            g = torch.Generator().manual_seed(rows)
            past, x = torch.randn(1, 7, width, generator=g), torch.randn(1, rows, width, generator=g)
            rot = [(torch.randn(1, n, d, generator=g), torch.randn(1, n, d, generator=g)) for n in (7, rows)]
            outs = []
            for fn in (lambda *a, **k: type(attn).forward(attn, *a, **k), lambda *a, **k: _attention_forward(attn, *a, **k)):
                cache = DynamicCache()
                fn(past, rot[0], None, cache)
                outs.append(fn(x, rot[1], None, cache)[0])
            if not torch.equal(*outs):
                return False
    return True


def fuse_layers(model: nn.Module, reorder: Callable, op: Callable, shapes: dict) -> int:
    """Gate and up projections as one packed product, so too query, key and value, and RMSNorm as one op,
    wherever a probe gives the same bits; returns how many modules now compute fused. `unfuse_layers` undoes it."""
    return sum(_fuse_mlp(m, reorder, op, shapes) or _fuse_attention(m, reorder, op, shapes) or _fuse_norm(m)
               for m in model.modules())


def unfuse_layers(model: nn.Module) -> int:
    n = 0
    for m in model.modules():
        if "forward" in m.__dict__ and getattr(m.__dict__["forward"], "__func__", None) in (
                _mlp_forward, _rms_forward, _attention_forward):
            del m.__dict__["forward"]
            for name in ("_gate_up", "_qkv", "_qkv_sizes"):
                m.__dict__.pop(name, None)
            n += 1
    return n


def padding(model: nn.Module) -> str:
    """Which packed layer shapes pad small calls so a row's bits never depend on its company (the probed min_rows),
    for the load log: '' where none does. Padding for speed alone (`pad_lone_rows`) is `lone_padding`'s."""
    shapes = {(m.in_features, m.out_features): m.bits_rows or m.min_rows for m in live_packed(model)}
    return ", ".join(f"{i}->{o} to {n} rows" for (i, o), n in shapes.items() if n > 1)


def lone_padding(model: nn.Module) -> int:
    """The rows every one-row call is padded to because a timed sweep found that faster here (`pad_lone_rows`), or
    0. A timing, so two processes on one CPU may differ (one under load); their bits do not (the pad is probed)."""
    return max((m.min_rows for m in live_packed(model) if m.bits_rows), default=0)


def unpack_linears(model: nn.Module) -> int:
    """Undo `pack_linears` in place (same parameters, torch's default kernels); return how many."""
    unfuse_layers(model)
    found = _children(model, plain=False)
    for parent, name, child in found:
        setattr(parent, name, child.plain())
    return len(found)


@contextmanager
def default_kernels(model: nn.Module) -> Iterator[int]:
    """Within it, the model's packed layers compute with torch's default kernel on their own weights, as before
    packing: the target alone at its fastest for one id per pass, where packing only pays for several (the
    benchmark's second yardstick, `baseline:default-kernels`). Yields how many layers switched (0: nothing packed).
    Only for a model no other thread computes with meanwhile (the benchmark's): the switch is the layers' own, and
    rows computed with the default kernel are not bitwise those of the packed one, which shared rounds rely on."""
    layers = [m for m in model.modules() if isinstance(m, PackedLinear)]
    before = [m.default_kernel for m in layers]
    for m in layers:
        m.default_kernel = True
    try:
        yield len(layers)
    finally:
        for m, was in zip(layers, before, strict=True):
            m.default_kernel = was


def packed_count(model: nn.Module) -> int:
    """How many of this model's linear layers are packed."""
    return sum(isinstance(m, PackedLinear) for m in model.modules())


def is_packed(model: nn.Module) -> bool:
    """Were this model's linear layers packed (so verifying several ids costs about one step)?"""
    return any(isinstance(m, PackedLinear) for m in model.modules())
