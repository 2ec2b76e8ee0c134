"""Rounds of many requests in one pass (iteration-level scheduling with selective batching, as Orca,
OSDI 2022, and vLLM's continuous batching).

Every running request drafts on its own; then ONE target pass verifies all their drafted ids together:
the row-wise parts of a decoder layer (norms, the q/k/v and output projections, the MLP) and the LM head
run once over every row of every request, so the weights are read once for all of them; attention runs
per request, against that request's own KV cache, with its own positions and causal mask.

Lossless per request: a request's logits are bit-identical to its solo pass, provided the linear layers
are batch-invariant (a row's result does not depend on the rows beside it). `row_invariant` measures that
for a model's linear layers; `verify_together` is only used where it holds (tests check it on tiny models
and on the offline model, logits bitwise and greedy outputs).

Llama-family targets only (q/k/v/o projections, rotary embeddings, RMSNorm, gated MLP): `supports` says.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterator
from copy import deepcopy
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers.masking_utils import create_causal_mask
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from metasd.core.events import RoundEvent
from metasd.core.kvcache import new_cache
from metasd.core.passes import DraftPart, HeadPart, VerifyPart, crop_to, forward_alone, head_alone
from metasd.decoding.prefix import PrefixStore
from metasd.models import cpu_attention
from metasd.models.cpu_linear import held_modules, rows_agree

try:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
except ImportError:  # pragma: no cover  (older layouts)
    from transformers.integrations import ALL_ATTENTION_FUNCTIONS  # type: ignore[no-redef]


def supports(model: torch.nn.Module) -> bool:
    """Whether `model` has the Llama layout this module computes layer by layer."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if inner is None or layers is None or not hasattr(inner, "rotary_emb") or not hasattr(model, "lm_head"):
        return False
    a = getattr(layers[0], "self_attn", None)
    return all(hasattr(a, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim")) and hasattr(layers[0], "mlp")


def rowwise(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, block: int = 0) -> torch.Tensor:
    """`fn` (row-wise: norms, projections, the MLP, the head) over the rows of x ([1, rows, width]). With `block`,
    in calls of exactly `block` rows each, the last one padded with zero rows: every call then has one shape
    whatever company a request keeps, so a device whose kernels are chosen by shape (cuBLAS) gives a row the
    same bits alone and beside others (batch-invariant blocking; `row_invariant(model, block=...)` checks it)."""
    if not block:
        return fn(x)
    rows = x.shape[1]
    pad = -rows % block
    if pad:
        x = torch.cat((x, x.new_zeros(x.shape[0], pad, x.shape[2])), dim=1)
    return torch.cat([fn(x[:, i: i + block]) for i in range(0, x.shape[1], block)], dim=1)[:, :rows]


@torch.no_grad()
def verify_together(model: torch.nn.Module, parts: list[VerifyPart], block: int = 0) -> list[torch.Tensor]:
    """One pass over every part's ids: each part's logits ([len(ids), vocab], or its last `keep` rows), as its
    own pass gives. The target's verification, and a drafter model's forward for several requests at once.
    A part that names `features` gets those hidden states in its `states`, as its own pass with
    output_hidden_states gives them (a white-box head's features). `block`: the row-wise layers in calls of
    that many rows (`rowwise`), for devices where a kernel's bits depend on how many rows it is given."""
    lm = model.model
    spans, a = [], 0
    for p in parts:
        spans.append((a, a + len(p.ids)))
        a += len(p.ids)
    dev = next(model.parameters()).device
    h = lm.embed_tokens(torch.cat([torch.as_tensor(p.ids, device=dev).view(-1) for p in parts]).view(1, -1))
    # Every row at its own request's position: the rotary angles are elementwise in the position, so one call
    # over all rows gives each row the bits its own pass gives it.
    # (a token tree's nodes at their own depths: VerifyPart.positions).
    pos = torch.cat([p.position_ids() for p in parts], dim=1).to(dev)
    rotary = lm.rotary_emb(h, position_ids=pos)
    direct = _direct_sdpa(lm.config, h)
    # Each part's own mask, as its own forward builds it: causal, or a token tree's (passed through as given).
    masks = [p.mask.to(dev) if p.mask is not None else
             _pass_mask(create_causal_mask(config=lm.config, inputs_embeds=h[:, a:b], attention_mask=None,
                                           past_key_values=p.cache, position_ids=pos[:, a:b]), b - a, direct)
             for p, (a, b) in zip(parts, spans, strict=True)]
    top = lm.config.num_hidden_layers
    wanted = {i for p in parts for i in p.features}
    states = {0: h} if 0 in wanted else {}  # whole-pass tensors; each part gets its rows at the end
    for n, layer in enumerate(lm.layers[:top], 1):
        residual = h
        h = residual + _attention(layer.self_attn, rowwise(layer.input_layernorm, h, block), parts, spans, masks,
                                  rotary, block)
        residual = h
        h = residual + rowwise(lambda x, layer=layer: layer.mlp(layer.post_attention_layernorm(x)), h, block)
        if n in wanted and n < top:
            states[n] = h
    # The final norm is row-wise: over every row where a part wants the top state (as its own pass's
    # hidden_states[L]), else over the kept rows only, just before the head.
    if top in wanted:
        h = states[top] = rowwise(lm.norm, h, block)
    for p, (a, b) in zip(parts, spans, strict=True):
        if p.features:
            p.states = {i: states[i][:, a:b] for i in p.features}
    # Only the rows whose logits are wanted reach the head (the norm and the head are both row-wise).
    kept = [(b - min(p.keep, b - a), b) if p.keep else (a, b) for p, (a, b) in zip(parts, spans, strict=True)]
    if kept != spans:
        h = torch.cat([h[:, a:b] for a, b in kept], dim=1)
        a, spans = 0, []
        for lo, hi in kept:
            spans.append((a, a + hi - lo))
            a += hi - lo
    logits = rowwise(model.lm_head if top in wanted else lambda x: model.lm_head(lm.norm(x)), h, block)
    return [logits[0, a:b] for a, b in spans]


def _attention(attn: torch.nn.Module, x: torch.Tensor, parts: list[VerifyPart], spans: list[tuple[int, int]],
               masks: list, rotary: tuple[torch.Tensor, torch.Tensor], block: int = 0) -> torch.Tensor:
    """The attention block: projections and rotary embeddings over all rows at once (both row-wise), then
    attention per part against its own cache, written into one output for the output projection."""
    shape = (1, x.shape[1], -1, attn.head_dim)
    if "_qkv" in attn.__dict__:  # one product for the three (metasd/models/cpu_linear.py; the same bits)
        q, k, v = rowwise(attn._qkv, x, block).split(attn._qkv_sizes, -1)
    else:
        q, k, v = (rowwise(p, x, block) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
    q, k = apply_rotary_pos_emb(q, k, *rotary)
    interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, _eager_missing)
    out = torch.empty((1, x.shape[1], q.shape[1] * attn.head_dim), dtype=q.dtype, device=q.device)
    for p, (a, b), mask in zip(parts, spans, masks, strict=True):
        keys, values = p.cache.update(k[:, :, a:b], v[:, :, a:b], attn.layer_idx)
        if isinstance(mask, _Additive):
            o = cpu_attention.sdpa(q[:, :, a:b], keys, values, attn_mask=mask.bias, scale=attn.scaling,
                                   enable_gqa=True).transpose(1, 2)
        else:
            o, _ = interface(attn, q[:, :, a:b], keys, values, mask, dropout=0.0, scaling=attn.scaling)
        out[:, a:b] = o.reshape(1, b - a, -1)
    return rowwise(attn.o_proj, out, block)


@dataclass
class _Additive:
    """A part's additive float mask (0 / -inf), made once per pass, for torch's sdpa called directly."""

    bias: torch.Tensor


def _pass_mask(mask: object, rows: int, direct: bool) -> object:
    """What each layer's attention is handed for one part: transformers' mask as is, or, where the pass calls
    torch's sdpa itself (`direct`) and transformers' would expand the key/value heads for this part (several
    query rows and a boolean mask), an `_Additive`."""
    if direct and rows > 1 and isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
        return _Additive(torch.zeros(mask.shape, dtype=torch.float32).masked_fill_(~mask, float("-inf")))
    return mask


def _direct_sdpa(config: object, h: torch.Tensor) -> bool:
    """Whether the pass may call torch's sdpa itself with grouped key/value heads (`enable_gqa`) instead of
    transformers' sdpa, which copies the key/value heads out for every query group first when there is a
    mask. On the CPU the flash kernel reads the same numbers either way, so the bits are the same (tests check
    it against the solo pass) and a part's attention costs 2.5x less at a class's size."""
    heads = getattr(config, "num_attention_heads", 0)
    return (getattr(config, "_attn_implementation", None) == "sdpa" and h.device.type == "cpu"
            and h.dtype == torch.float32 and heads > getattr(config, "num_key_value_heads", heads))


def _eager_missing(*args: object, **kwargs: object) -> None:
    raise NotImplementedError("eager attention: load the target with sdpa attention")


@torch.no_grad()
def row_invariant(model: torch.nn.Module, rows: int = 48, seed: int = 0, block: int = 0) -> bool:
    """Whether every kind of linear layer of `model` (type and shape) gives each row the same bits alone and
    beside up to `rows` others (batching then changes no request's output); with `block`, called as the shared
    passes call them then (`rowwise`: blocks of that many rows, a row anywhere in a block)."""
    g = torch.Generator().manual_seed(seed)
    dev = next(model.parameters()).device
    seen: set[tuple] = set()
    # The products a pass runs: every linear module, those a module holds as a plain attribute included (the
    # fused _gate_up and _qkv, a white-box head's draft-vocabulary LM head: cpu_linear.held_modules, the walk
    # packing makes); not a fused layer's parts, which no pass calls (`release`).
    for m in held_modules(model):
        if not hasattr(m, "in_features") or not hasattr(m, "out_features") or getattr(m, "_w", True) is None:
            continue
        kind = (type(m), m.in_features, m.out_features)  # the kernel is chosen per type and shape: one probe each
        if kind in seen:
            continue
        seen.add(kind)
        dtype = next((p.dtype for p in m.parameters() if p.is_floating_point()), torch.float32)
        x = torch.randn(1, rows, m.in_features, generator=g).to(dev, dtype)
        windows = [(j, n) for j in (0, 1, rows // 2, rows - 1) for n in (1, 2, 3, 5, 9) if j + n <= rows]
        if not rows_agree(lambda t, m=m: rowwise(m, t, block), x, windows):
            return False
    return True


# Blocks of rows tried, smallest first, where a model's rows are not invariant in calls of any size (a CPU whose
# kernels vary with the row count at every size; a GPU's cuBLAS, which picks kernels by shape).
BLOCKS_TRIED = (4, 8, 16, 32, 64)


def pass_block(model: torch.nn.Module, asked: int = 0, tried: tuple[int, ...] = BLOCKS_TRIED) -> int | None:
    """The rows per row-wise call with which a shared pass gives every row the bits it has alone: 0 (calls of any
    size: the model is row-invariant), `asked` if given and it works, else the smallest of `tried` that works
    (rowwise's blocks, a lone request's pass included); None where nothing does (the passes are not shared)."""
    if asked:
        return asked if row_invariant(model, block=asked) else None
    if row_invariant(model):
        return 0
    return next((b for b in tried if row_invariant(model, block=b)), None)


@torch.no_grad()
def check_shared_pass(model: torch.nn.Module, block: int = 0, seed: int = 0) -> str | None:
    """The whole shared pass checked before a server shares one (supports() reads the layout, row_invariant the
    linear layers; a model with an extra norm or a scaled embedding passes both and would still compute other
    logits): three requests of different lengths and drafts in one verify_together, each against its own pass.
    Without blocks its own pass is the model's forward, bit for bit; with blocks it is the same blocked pass
    holding that request alone (what a lone request is given), bit for bit, and the model's forward to float
    rounding (1e-4 of the logits' scale). None if it holds, else what failed."""
    dev = next(model.parameters()).device
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    shapes = ((5, 3), (17, 0), (9, 5))  # (context, draft): a draft, a lone id (a plain step), a full draft
    contexts = [torch.randint(0, vocab, (c,), generator=g).tolist() for c, _ in shapes]
    feeds = [torch.randint(0, vocab, (d + 1,), generator=g).tolist() for _, d in shapes]
    caches = []
    for ctx in contexts:
        c = new_cache(model.config)
        model(input_ids=torch.tensor([ctx], device=dev), past_key_values=c, use_cache=True)
        caches.append(c)

    def part(i: int) -> VerifyPart:  # request i on a copy of its cache (each pass extends the cache it is given)
        return VerifyPart(feeds[i], len(contexts[i]), deepcopy(caches[i]))

    together = verify_together(model, [part(i) for i in range(len(shapes))], block)
    for i, got in enumerate(together):
        p = part(i)
        pos = torch.arange(p.start, p.start + len(p.ids), device=dev).view(1, -1)
        own = model(input_ids=torch.tensor([p.ids], device=dev), position_ids=pos, past_key_values=p.cache,
                     use_cache=True).logits[0]
        alone = own if not block else verify_together(model, [part(i)], block)[0]
        if not torch.equal(got, alone):
            return f"request {i + 1} of 3 got other logits in company than alone"
        scale = own.abs().max().item() + 1e-6
        if block and (got - own).abs().max().item() > 1e-4 * scale:
            return f"request {i + 1} of 3: the shared pass does not compute the model's own logits"
    return None


@dataclass(frozen=True)
class PassCost:
    """Shared-pass time against requests per pass, measured at start-up: `ms[i]` for `requests[i]` requests of
    `rows` ids each (a round's last id and a full draft), every one against its own KV cache, so the per-request
    attention is in the price as well as the rows."""

    requests: tuple[int, ...]
    ms: tuple[float, ...]
    rows: int

    def fit(self) -> tuple[float, float]:
        """Least-squares line through the measured points: ms = fixed + per_request * n (one noisy point, on a
        machine with two cores, does not move the bound much)."""
        n = len(self.requests)
        mx, my = sum(self.requests) / n, sum(self.ms) / n
        sxx = sum((x - mx) ** 2 for x in self.requests)
        slope = sum((x - mx) * (y - my) for x, y in zip(self.requests, self.ms, strict=True)) / sxx if sxx else 0.0
        return my - slope * mx, max(slope, 1e-9)

    def best_batch(self, slowdown: float) -> int:
        """The most requests one pass may carry while, on the fitted line, it costs at most `slowdown` times a
        single request's pass (each running stream then keeps at least 1/slowdown of its solo speed). The single
        pass is the measured one where it was measured: one slow sample of the largest pass tilts the line and
        puts its value at one request far below the measurement (20 ms against 61 at a start-up here, which
        bounded the batch at 23 instead of 36)."""
        fixed, per = self.fit()
        solo = self.ms[self.requests.index(1)] if 1 in self.requests else fixed + per
        return max(1, int((slowdown * solo - fixed) // per))

    def describe(self) -> str:
        fixed, per = self.fit()
        points = ", ".join(f"{n}: {ms:.0f} ms" for n, ms in zip(self.requests, self.ms, strict=True))
        return f"passes of {self.rows} ids per request {points}; fitted {fixed:.0f} ms + {per:.1f} ms per request"


@torch.no_grad()
def measure_pass_cost(model: torch.nn.Module, rows: int, requests: tuple[int, ...] = (1, 8, 16, 32),
                      context: int = 32, repeats: int = 2, block: int = 0) -> PassCost:
    """Time one shared pass (verify_together) for each number of requests, every request `rows` ids after
    `context` ids of its own cache: the batch bound's cost model. The first pass warms the kernels up."""
    dev = next(model.parameters()).device
    base = new_cache()
    model(input_ids=torch.arange(1, context + 1, device=dev).view(1, -1), past_key_values=base, use_cache=True)
    caches = [deepcopy(base) for _ in range(max(requests))]
    ids = list(range(context + 1, context + 1 + rows))

    def one_pass(n: int) -> float:
        t = time.perf_counter()
        verify_together(model, [VerifyPart(ids, context, c) for c in caches[:n]], block)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)  # the pass's kernels have run, not only been queued
        spent = time.perf_counter() - t
        for c in caches[:n]:
            crop_to(c, context)  # back to the context alone for the next pass
        return spent

    one_pass(1)
    # Each size is timed once per sweep and the sweeps follow one another, so a slow spell of a shared machine
    # (its speed moved by 2x within minutes here) lands on one sample of every size rather than on every
    # sample of the largest ones, which would tilt the fitted line and shrink the batch. Four sizes in two sweeps
    # take about 3 s of a 2-core start against 7.7 s for six in three, and bounded the batch alike here (the cap,
    # 32; fitted 18.9-19.7 ms per request against 16.9-17.4).
    best = [1000 * one_pass(n) for n in requests]
    for _ in range(repeats - 1):
        best = [min(b, 1000 * one_pass(n)) for b, n in zip(best, requests, strict=True)]
    return PassCost(tuple(requests), tuple(best), rows)


log = logging.getLogger(__name__)


class _End:
    pass


END = _END = _End()  # a request's last item in its outbox


class Outbox(Protocol):
    def put(self, item: Any) -> None: ...


class Neighbours(Protocol):
    """Other rounds on the same machine (metasd.serving.remote.RoundsPool): how many requests they hold, so that a
    driver takes every core only while nobody else computes, and what this one holds, for theirs."""

    def publish(self, n: int) -> None: ...

    def others(self) -> int: ...


_PARKED = object()  # a member whose round ended: it begins its next one in the driver's next round


class _Member:
    """A joined request: its step generator (metasd.decoding.engine.steps), what it yielded last, its outbox."""

    def __init__(self, req: Any, it: Generator, out: Outbox) -> None:
        self.req, self.it, self.out = req, it, out
        # What it yielded last: a VerifyPart or DraftPart waiting for a pass, _PARKED after a round, None (not started)
        self.x: Any = None


# The drivers' threads are daemons (a server never waits for an idle one to end), but one must not be freeing
# tensors when the interpreter shuts down: Python then ends a daemon thread inside torch's deallocator as it asks
# for the interpreter lock back, and the process aborts ("terminate called without an active exception", exit
# 134), after a run that had succeeded (a driver that ends frees its Rounds, kept prompt passes and all). At exit
# every idle driver ends at once, a busy one after its round, and the interpreter waits for them to be gone.
_DRIVERS: weakref.WeakSet[Rounds] = weakref.WeakSet()
_DRIVER_THREADS: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_EXITING = threading.Event()


@atexit.register
def _end_drivers(timeout: float = 10.0) -> None:
    _EXITING.set()
    for rounds in list(_DRIVERS):
        with rounds._cv:
            rounds._cv.notify_all()
    for thread in list(_DRIVER_THREADS):
        if thread is not threading.current_thread():
            thread.join(timeout)


class Rounds:
    """The lockstep driver: one thread advances every joined request round by round. Each request drafts on
    its own, except that its model drafter's forwards join those of every request on the same drafter model
    (DraftPart, one pass each step); one pass verifies them all (verify_together); each then keeps what passed,
    learns and emits its event, which goes to its own stream. Requests join between rounds (their prefill runs then, alone) and
    leave when done or stopped (a request's stop signal is read by its own step generator every round).
    At most `max_batch` requests share a pass; more wait, in order, for one to leave."""

    def __init__(self, model: torch.nn.Module, max_batch: int, threads: int | None = None, idle_s: float = 30.0,
                 share: bool | None = None, prefixes: PrefixStore | None = None, share_drafts: bool = True,
                 crowd_threads: int | None = None, block: int = 0):
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.model, self.max_batch, self.idle_s = model, max_batch, idle_s
        # torch's threads for a run alone; by default its maker's (a new thread would take torch's process-wide
        # count of the moment, whatever another thread last set).
        self.threads = threads if threads is not None else torch.get_num_threads()
        # With `block` (a GPU: kernels chosen by the number of rows), every pass's row-wise layers run in calls of
        # `block` rows (`rowwise`), a request alone included, so that its bits never depend on its company.
        self.block = block
        # torch's threads while more than one request runs (None: `threads` always). With the server's own work
        # in another process, one thread kept its speed beside it where two lost a third (docs/BENCHMARKS.md).
        self.crowd_threads = crowd_threads
        self._threads_now = 0
        self.neighbours: Neighbours | None = None  # other rounds' processes on this machine, where there are
        # Prompt passes kept for the next request with the same prompt (metasd.decoding.prefix), taken only by a
        # request that joins others: a class running the same examples reads each prompt once.
        self.prefixes = prefixes
        # Passes are shared only where no row's result depends on its neighbours (else each request has its own).
        self.share = row_invariant(model, block=block) if share is None else share
        self.most = 0  # the most requests one pass has verified
        self._joining: deque[_Member] = deque()
        self._members: list[_Member] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self.together = 0  # requests in the latest pass
        self.passes = 0
        # Drafter models whose forwards for several requests run in one pass (id -> whether that holds bit for
        # bit, measured on first use as for the target), how many such passes ran, and the most parts in one.
        self.share_drafts = share_drafts
        self._draft_shared: dict[int, bool] = {}
        self.draft_passes = self.most_drafts = 0

    def submit(self, req: Any, it: Generator) -> Iterator[Any]:
        """Join `req` (its step generator `it`); its events, in order, ending with its summary (or its error)."""
        out: queue.SimpleQueue = queue.SimpleQueue()
        self.join(req, it, out)
        return drain(out)

    def join(self, req: Any, it: Generator, out: Outbox) -> None:
        """Join `req`: its events, then its error if it fails, then END, are put into `out` by the rounds'
        thread (a queue in this process, or a pipe to another: metasd.serving.remote)."""
        if getattr(req, "threads", 0) is None:  # its prices are those of a run alone here, whatever its company
            req.threads = self.threads
        with self._cv:
            self._joining.append(_Member(req, it, out))
            self._publish()  # at once: a neighbour choosing its threads now counts this one
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="metasd-rounds", daemon=True)
                _DRIVERS.add(self)
                _DRIVER_THREADS.add(self._thread)
                self._thread.start()
            self._cv.notify_all()

    @property
    def running(self) -> int:
        with self._cv:
            return len(self._members) + len(self._joining)

    def mixes_thread_counts(self) -> bool:
        """Whether a request's passes may run at two thread counts here: alone (and its prompt) at `threads`, in a
        crowd at `crowd_threads`."""
        return bool(self.crowd_threads and self.threads and self.crowd_threads != self.threads)

    def keep_bits_across_counts(self) -> bool:
        """Where a request's passes mix thread counts and attention's bits move with the count, this process's
        attention runs on one thread from now on, so that a request computes the same bits alone and in a crowd
        (metasd/models/cpu_attention.py; one thread costs a two-thread pass ~8% on the CPU that needs it). Called
        by the driver as it starts: in the process that runs the rounds, not the server that forked it. Returns
        whether attention is pinned."""
        if self.mixes_thread_counts() and getattr(self.model, "config", None) is not None:
            return cpu_attention.pin_if_needed(self.model.config)
        return cpu_attention.pinned()

    def _loop(self) -> None:
        self._threads_now = 0
        self.keep_bits_across_counts()
        while not _EXITING.is_set() and self._admit():
            try:
                self._round()  # in a call of its own: its locals (a finished request's tensors) are freed as it returns
            except Exception as e:  # noqa: BLE001  (the driver outlives a round it could not finish)
                # Every member's own steps and passes are guarded (_advance, _answer): what fails here is the
                # driver's own bookkeeping, whose state no member can trust, so the members of this round end with
                # the error and the driver goes on serving the runs that join next.
                log.exception("shared rounds: a round failed outside any request; its %d runs end", len(self._members))
                for m in list(self._members):
                    self._leave(m, RuntimeError(f"the shared rounds failed a round ({type(e).__name__})"))

    def _round(self) -> None:
        for m in list(self._members):
            if m.x is None:  # a newcomer: its prompt's pass, one large batch, where every thread pays
                self._set_threads(self.threads if not self._elsewhere() else None)
            self._advance(m, None)
        self._set_threads()
        self._drafts()
        live = [m for m in self._members if isinstance(m.x, VerifyPart)]
        if live:
            self._answer(live, self._pass)

    def _elsewhere(self) -> int:
        """Requests the neighbouring rounds hold now (0 without neighbours)."""
        return self.neighbours.others() if self.neighbours is not None else 0

    def _set_threads(self, want: int | None = None) -> None:
        """torch's threads for the next pass: `want`, or the crowd's while more than one request runs here or
        beside (two processes on every core each would fight over the cores)."""
        if want is None:
            crowd = len(self._members) + self._elsewhere() > 1
            want = self.crowd_threads if self.crowd_threads and crowd else self.threads
        if want and want != self._threads_now:
            torch.set_num_threads(want)
            self._threads_now = want

    def _answer(self, group: list[_Member], run: Callable[[list[_Member]], list[Any]]) -> None:
        """Run one pass for `group` and hand each member its result. A failed pass of several is run again for
        each member alone, its caches first rolled back to where the pass found them: only a member whose own
        pass fails ends (with the error), the others go on as if nothing had happened."""
        caches = [_cache_of(m.x) for m in group]
        lengths = [0 if c is None else c.get_seq_length() for c in caches]
        try:
            results = run(group)
        except Exception as e:  # noqa: BLE001  (a failed pass fails its requests, never the driver)
            if len(group) == 1:
                self._leave(group[0], e)
                return
            log.warning("shared rounds: a pass of %d runs failed (%s: %s); each runs alone", len(group),
                        type(e).__name__, e)
            for m, c, n in zip(group, caches, lengths, strict=True):
                if c is not None:
                    crop_to(c, n)
                self._answer([m], run)
            return
        for m, result in zip(group, results, strict=True):
            self._advance(m, result)

    def _admit(self) -> bool:
        """Take joining requests up to max_batch; False (the thread ends) after idle_s with nobody."""
        with self._cv:
            while not self._members and not self._joining:
                self._publish()
                if _EXITING.is_set() or (not self._cv.wait(self.idle_s) and not self._joining):
                    self._thread = None
                    return False
            while self._joining and len(self._members) < self.max_batch:
                m = self._joining.popleft()
                self._members.append(m)
                if self.prefixes is not None:
                    m.req.prefixes = self.prefixes
                    m.req.prefix_reuse = not m.req.timed and (
                        len(self._members) + len(self._joining) + self._elsewhere() > 1)
            self._publish()
            return True

    def _publish(self) -> None:
        if self.neighbours is not None:
            self.neighbours.publish(len(self._members) + len(self._joining))

    def _drafts(self) -> None:
        """Run the members' drafter forwards until every one waits for its verification: one pass per drafter
        model for all the members that asked it something (a draft's next token, a catch-up), step by step."""
        while True:
            asking: dict[int, list[_Member]] = {}
            for m in self._members:
                if isinstance(m.x, (DraftPart, HeadPart)):
                    asking.setdefault(id(m.x.model), []).append(m)
            if not asking:
                return
            for group in asking.values():
                self._answer(group, lambda ms: self._draft_pass([m.x for m in ms]))

    def drafts_together(self, model: torch.nn.Module) -> bool:
        """Whether requests drafting with `model` share its forwards: probed once per model (the server probes
        its preset's drafters at start-up, so no class waits for it; any other model on its first pass)."""
        key = id(model)
        if key not in self._draft_shared:
            # A Llama-layout drafter model, or a white-box head (its own `run_together`).
            self._draft_shared[key] = (self.share and self.share_drafts
                                       and (supports(model) or hasattr(model, "run_together"))
                                       and row_invariant(model, block=self.block))
        return self._draft_shared[key]

    def _draft_pass(self, parts: list[DraftPart] | list[HeadPart]) -> list[Any]:
        """One drafter model's forwards for several requests (or one head's layer calls): together where the
        model allows it bit for bit (as the target's passes), else one by one; each part's share of the time
        goes back with it."""
        model = parts[0].model
        heads = isinstance(parts[0], HeadPart)
        if (len(parts) == 1 and not self.block) or not self.drafts_together(model):
            alone = head_alone if heads else forward_alone
            return [alone(d) for d in parts]
        t = time.perf_counter()
        if heads:
            out = model.run_together(parts, lambda fn, x: rowwise(fn, x, self.block))
        else:
            out = verify_together(model, [d.part for d in parts], self.block)
        share = (time.perf_counter() - t) / len(parts)
        for d in parts:
            d.spent_s = share
        self.draft_passes += 1
        self.most_drafts = max(self.most_drafts, len(parts))
        return out

    def _pass(self, live: list[_Member]) -> list[tuple[torch.Tensor, Any]]:
        """One verification pass for every live request (with its hidden states where a white-box head asks), or
        each its own pass where rows are not invariant."""
        self.together = len(live) if self.share else 1
        self.passes, self.most = self.passes + 1, max(self.most, self.together)
        shared = len(live) > 1 and self.share
        fed = sum(len(m.x.ids) for m in live)
        for m in live:  # each prices its next plan by its share of a pass like this one (costs.VerifyCost.share)
            cost = getattr(m.req, "verify_cost", None)
            if cost is not None:
                cost.company = (len(live), fed - len(m.x.ids)) if shared else None
        if shared or (self.block and self.share):
            out = verify_together(self.model, [m.x for m in live], self.block)
            return [(logits, m.x.states) for m, logits in zip(live, out, strict=True)]
        return [m.req.pass_alone(m.x) for m in live]

    def _advance(self, m: _Member, result: tuple[torch.Tensor, Any] | None) -> None:
        """Run m's steps until it asks for a pass (a chain's or a token tree's verification, a drafter's
        forward), ends a round (it is parked until the driver's next round) or ends, handing its events to its
        stream."""
        try:
            if result is not None:
                m.x = m.it.send(result)
            elif m.x is None or m.x is _PARKED:
                m.x = next(m.it)
            while not isinstance(m.x, (VerifyPart, DraftPart, HeadPart)):
                m.out.put(m.x)
                if isinstance(m.x, RoundEvent):
                    m.x = _PARKED
                    return
                m.x = next(m.it)
        except StopIteration:
            self._leave(m, None)
        except BaseException as e:  # noqa: BLE001  (the request's failure, re-raised in its own stream)
            self._leave(m, e)

    def _leave(self, m: _Member, error: BaseException | None) -> None:
        with self._cv:
            self._members.remove(m)
        m.it.close()  # frees the request's caches in this thread
        if error is not None:
            m.out.put(error)
        m.out.put(_END)


def _cache_of(x: VerifyPart | DraftPart | HeadPart) -> Any:
    """The cache a failed pass rolls back (a head's part extends nothing before its answer: none)."""
    return x.part.cache if isinstance(x, DraftPart) else None if isinstance(x, HeadPart) else x.cache


_NOTHING = object()  # drain: the outbox had nothing within `every`


def drain(out: queue.SimpleQueue, every: float | None = None, between: Callable[[], None] | None = None
          ) -> Iterator[Any]:
    """A request's outbox as its events: up to END, re-raising an error put there. With `every`, `between()`
    runs at least that often while it waits and after each event (a remote run polls its Stop this way)."""
    while True:
        try:
            item = out.get(timeout=every)
        except queue.Empty:
            item = _NOTHING
        if between is not None:
            between()
        if item is _NOTHING:
            continue
        if isinstance(item, _End):
            return
        if isinstance(item, BaseException):
            raise item
        yield item


def kv_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes one token takes in a request's KV cache (keys and values, every layer)."""
    cfg = model.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * heads * head_dim * next(model.parameters()).element_size()
