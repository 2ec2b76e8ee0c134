"""Prompt passes kept for the next request with the same prompt (a class running the page's examples).

A server's shared rounds (metasd.serving.batch.Rounds) prefill each joining request alone, and on a CPU the
prompt's pass is most of the wait for a first token: 0.3-0.6 s for a page example on the offline preset.
When a class runs the same few examples, each distinct prompt is read once; the next request with the same
ids takes a copy of the keys and values (and of the few logits its drafters are seeded from) instead of
running the pass again. The copy is the pass's own output, so the request's cache holds exactly the bits
its own pass would have written: greedy outputs stay the target's, sampled ones keep their distribution.

White-box heads read the pass's hidden states too: a request with heads asks for the layers they read, and
the pass kept for it keeps those layers' rows as well (a prompt's pass is kept once per set of layers asked).

Bounded in bytes, least recently used first out. Not used by the CLI or the benchmarks (they time prefill).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from metasd.core.kvcache import ReservedLayer


@dataclass(frozen=True)
class Prefix:
    """One prompt's pass: per layer (keys, values), the logits of its last `keep` rows, and the hidden states
    its request's white-box heads read (index as transformers' `hidden_states` -> [1, rows, width])."""

    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    logits: torch.Tensor
    states: dict[int, torch.Tensor]

    @property
    def nbytes(self) -> int:
        return (self.logits.nbytes + sum(k.nbytes + v.nbytes for k, v in self.layers)
                + sum(t.nbytes for t in self.states.values()))


class PrefixStore:
    """Prompt passes by (prompt ids, rows of logits kept, hidden states kept), at most `max_bytes` of them."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple, Prefix] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(p.nbytes for p in self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    @staticmethod
    def fits(cache: DynamicCache) -> bool:
        """Whether `cache` is one this store can fill and keep: plain growing layers (no sliding windows)."""
        return all(type(lay) in (DynamicLayer, ReservedLayer) for lay in cache.layers)

    def take(self, ids: list[int], keep: int, cache: DynamicCache, features: tuple[int, ...] = ()
             ) -> tuple[torch.Tensor, dict[int, torch.Tensor]] | None:
        """Fill the empty `cache` with the kept pass over `ids` and return its logits ([keep, vocab]) and the
        hidden states `features` names; None (cache untouched) when this prompt was not kept with them."""
        key = (tuple(ids), keep, tuple(sorted(set(features))))
        with self._lock:
            p = self._items.get(key)
            if p is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
        for i, (k, v) in enumerate(p.layers):  # update concatenates: the request's cache gets its own copy
            cache.update(k, v, i)
        return p.logits.clone(), dict(p.states)  # readers copy what they keep (WhiteBoxDrafter.take_features)

    def keep(self, ids: list[int], keep: int, cache: DynamicCache, logits: torch.Tensor,
             states: dict[int, torch.Tensor] | None = None) -> None:
        """Keep the pass that just filled `cache` over `ids` (its logits: the last `keep` rows; `states`: the
        hidden states its request's heads read)."""
        layers = tuple((lay.keys.clone(), lay.values.clone()) for lay in cache.layers)
        p = Prefix(layers, logits.detach().clone(), {i: t.detach().clone() for i, t in (states or {}).items()})
        if p.nbytes > self.max_bytes:
            return
        key = (tuple(ids), keep, tuple(sorted(p.states)))
        with self._lock:
            self._items[key] = p
            self._items.move_to_end(key)
            total = sum(q.nbytes for q in self._items.values())
            while total > self.max_bytes:
                _, old = self._items.popitem(last=False)
                total -= old.nbytes
