"""Attention whose bits do not depend on how many threads torch runs.

The engine's promises are bitwise: the shared rounds give every request the bits its solo run gives, and a
white-box head reads the features its solo run reads. The packed linear layers (metasd/models/cpu_linear.py)
give a row the same bits whatever the rows beside it and whatever the thread count; torch's CPU flash attention
does not always: on an AMD EPYC (Zen 4, AVX-512, 2026-12-06) `scaled_dot_product_attention` gave other bits
with one thread than with two for 1, 3, 5 and 9 query rows at most context lengths (the offline target's shape:
12 of 36 shapes tried; 1, 2 and 4-33 rows with the tiny test models' shape), while the Intel Xeon of the days
before gave the same bits at any count. A request whose passes run at one count alone and at another in company
(the shared rounds' crowd threads, a prompt read with more threads than the rounds) then computes other bits
than its solo run, and its answer may part from it at a near-tie.

So where a request's passes mix thread counts (the shared rounds' processes: a crowd on `$METASD_CROWD_THREADS`,
a run alone and its prompt on the run's own count; `Rounds.keep_bits_across_counts`), the attention is probed
once per head layout (`thread_invariant`) and, where its bits move with the count, every CPU attention call of
that process runs on one thread (`pin`): transformers' sdpa entry (every model forward), the shared pass's own
sdpa call (metasd/serving/batch.py) and the white-box heads' (metasd/drafting/whitebox.py). Torch's math backend
would also be invariant, at 2-3x one-thread flash's time. One thread costs 16 us a layer on a one-id pass (51
against 35 us at 200 positions), but switching the count twice a layer costs more: on that CPU a two-thread
pass took 44.3 against 40.5 ms a round pinned (6 Spec-Bench prompts, 128 tokens, ab_bench), so nothing else
pins: a run outside the shared rounds computes every pass at its own thread plan, its reference included.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

# Where the probe found the attention's bits moving with the thread count: every CPU attention call then runs on
# one thread. A process-wide switch (torch's thread count is process-wide too).
_pinned = False
_wrapped = False


def pinned() -> bool:
    return _pinned


def call(fn: Callable[..., torch.Tensor], query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """fn(query, ...) on one torch thread where attention is pinned and the query is on the CPU."""
    if not _pinned or query.device.type != "cpu":
        return fn(query, *args, **kwargs)
    before = torch.get_num_threads()
    if before == 1:
        return fn(query, *args, **kwargs)
    torch.set_num_threads(1)
    try:
        return fn(query, *args, **kwargs)
    finally:
        torch.set_num_threads(before)


def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """torch's scaled_dot_product_attention, pinned where it must be."""
    return call(F.scaled_dot_product_attention, query, key, value, **kwargs)


@torch.no_grad()
def thread_invariant(heads: int, kv_heads: int, head_dim: int, threads: int = 0, seed: int = 0) -> bool:
    """Whether torch's CPU sdpa gives the same bits on one thread and on `threads` (default: the cores, at least
    two) for this head layout: 1-9 and 17 query rows (a pass's ids; a short prompt) after 0-513 cached positions,
    a boolean causal mask (as transformers hands it) and an additive one (the shared pass's)."""
    threads = threads or max(2, os.cpu_count() or 2)
    g = torch.Generator().manual_seed(seed)
    before = torch.get_num_threads()
    try:
        for rows in (1, 2, 3, 4, 5, 9, 17):
            for past in (0, 7, 31, 64, 200, 513):
                q = torch.randn(1, heads, rows, head_dim, generator=g)
                k, v = (torch.randn(1, kv_heads, past + rows, head_dim, generator=g) for _ in range(2))
                see = torch.ones(rows, past + rows, dtype=torch.bool).tril(past)
                for mask in (see, torch.zeros(see.shape).masked_fill(~see, float("-inf"))):
                    outs = []
                    for n in (1, threads):
                        torch.set_num_threads(n)
                        outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                   enable_gqa=heads != kv_heads))
                    if not torch.equal(*outs):
                        return False
        return True
    finally:
        torch.set_num_threads(before)


def pin(on: bool = True) -> None:
    """Run every CPU attention call on one thread (on=False: as torch chooses). Wraps transformers' sdpa entry once;
    the wrapper reads the switch on every call."""
    global _pinned, _wrapped
    _pinned = on
    if on and not _wrapped:
        from transformers.modeling_utils import AttentionInterface

        own = AttentionInterface._global_mapping["sdpa"]

        @functools.wraps(own)
        def sdpa_one_thread(module: torch.nn.Module, query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            return call(lambda q, *a, **k: own(module, q, *a, **k), query, *args, **kwargs)

        AttentionInterface.register("sdpa", sdpa_one_thread)
        _wrapped = True


@functools.cache
def _probed(heads: int, kv_heads: int, head_dim: int) -> bool:
    return thread_invariant(heads, kv_heads, head_dim)


def pin_if_needed(config: Any) -> bool:
    """Probe the attention of a CPU model with this config (once per head layout) and pin every CPU attention call
    to one thread if its bits move with the thread count. Returns whether attention is pinned now."""
    heads = getattr(config, "num_attention_heads", 0)
    if not heads or getattr(config, "_attn_implementation", "sdpa") not in ("sdpa", None):
        return _pinned
    kv = getattr(config, "num_key_value_heads", None) or heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if not _probed(heads, kv, dim):
        pin()
    return _pinned
