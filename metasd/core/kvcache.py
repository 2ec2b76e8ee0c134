"""The KV cache every pass of ours extends: transformers' DynamicCache with layers that write in place.

transformers' DynamicLayer appends a pass's keys and values by concatenation, so every pass copies the whole
cache of every layer: for the offline target at 300 positions that is 60 copies of ~230 KB a pass, about 2 ms
of a 67 ms one-id verification (3%; more as the answer grows). A speculative round also rolls the cache back
after every verification, which DynamicLayer does by slicing. `ReservedLayer` keeps each layer's keys and values
in a buffer with room to spare, writes a pass's rows into it, and rolls back by moving its length; what
attention reads is a view of the first `length` positions, the same values in the same order, so every logit is
bitwise what DynamicLayer gives (tests/test_kvcache.py compares them pass by pass).

Writing in place is safe only where nobody else holds those positions. Two kinds of holder exist:
- a shallow copy (a layer-skip drafter adopts the target's layer objects, metasd/drafting/drafters.py): a copy
  shares the buffer but may not write into it (its room is only its length), and the original marks the copied
  positions `frozen`: a write below them (after a roll-back past the copy's length) first moves it to a buffer of
  its own;
- a buffer made under torch.inference_mode cannot be written in place outside it: the layer moves first;
- a tensor assigned from outside (`layer.keys = ...`, as transformers' batch helpers and the token trees do) is
  taken as frozen too: it is never written, only copied from when the layer grows.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

# Room added when a layer grows past its buffer, at least: reallocations (each a copy of the layer) stay rare.
GROW_MIN = 256


class ReservedLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views of buffers with spare room (see the module's notes)."""

    def __init__(self, reserve: int = 0) -> None:
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None
        self._n = 0  # positions held
        self._frozen = 0  # leading positions another holder may read: never written in place
        self._reserve = reserve  # room to allocate at the first write (the request's longest context)
        super().__init__()

    # keys / values: what attention and transformers read; assigning adopts the tensor as a frozen buffer.
    @property
    def keys(self) -> torch.Tensor | None:
        return self._keys

    @keys.setter
    def keys(self, t: torch.Tensor | None) -> None:
        self._keys = t
        self._kbuf = t if t is not None and t.dim() == 4 else None
        self._n = self._frozen = t.shape[-2] if self._kbuf is not None else 0

    @property
    def values(self) -> torch.Tensor | None:
        return self._values

    @values.setter
    def values(self, t: torch.Tensor | None) -> None:
        self._values = t
        self._vbuf = t if t is not None and t.dim() == 4 else None

    def _views(self) -> None:
        assert self._kbuf is not None and self._vbuf is not None
        self._keys = self._kbuf[:, :, : self._n]
        self._values = self._vbuf[:, :, : self._n]

    def _move(self, room: int, like_k: torch.Tensor, like_v: torch.Tensor) -> None:
        """New buffers of `room` positions of our own, holding the current ones."""
        kb = like_k.new_empty((*like_k.shape[:2], room, like_k.shape[-1]))
        vb = like_v.new_empty((*like_v.shape[:2], room, like_v.shape[-1]))
        if self._n:
            kb[:, :, : self._n].copy_(self._keys)
            vb[:, :, : self._n].copy_(self._values)
        self._kbuf, self._vbuf, self._frozen = kb, vb, 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, add = self._n, key_states.shape[-2]
        need = n + add
        if (self._kbuf is None or self._vbuf is None or need > self._kbuf.shape[-2] or n < self._frozen
                or self._kbuf.shape[:2] != key_states.shape[:2]
                # made under torch.inference_mode and now written outside it, which torch forbids in place
                or (self._kbuf.is_inference() and not torch.is_inference_mode_enabled())):
            self._move(max(need + max(GROW_MIN, need // 4), self._reserve), key_states, value_states)
        assert self._kbuf is not None and self._vbuf is not None
        self._kbuf[:, :, n:need].copy_(key_states)
        self._vbuf[:, :, n:need].copy_(value_states)
        self._n = need
        self._views()
        return self._keys, self._values

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def get_seq_length(self) -> int:
        return self._n

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count (the positions to drop), as DynamicLayer's")
        if tokens_to_remove == 0 or not self.is_initialized or self._kbuf is None:
            return
        self._n = max(0, self._n + tokens_to_remove)
        self._views()

    def keep_rows(self, past: int, idx: torch.Tensor) -> None:
        """Keep positions before `past` and after them the positions `idx` (each >= past, in order): a token
        tree's kept branch. In place where no other holder reads past `past`; otherwise into buffers of our own."""
        assert self._kbuf is not None and self._vbuf is not None
        if len(idx) and not (past <= int(idx.min()) and int(idx.max()) < self._n):
            raise IndexError(f"rows {idx.tolist()} outside the positions {past}..{self._n - 1} of this pass")
        picked_k, picked_v = self._kbuf.index_select(2, idx), self._vbuf.index_select(2, idx)  # copies first
        self._n = past
        self._views()
        if past < self._frozen or (self._kbuf.is_inference() and not torch.is_inference_mode_enabled()):
            self._move(self._kbuf.shape[-2], picked_k, picked_v)
        self._kbuf[:, :, past: past + len(idx)].copy_(picked_k)
        self._vbuf[:, :, past: past + len(idx)].copy_(picked_v)
        self._n = past + len(idx)
        self._views()

    def reset(self) -> None:
        self._kbuf = self._vbuf = None
        self._keys = self._values = None
        self._n = self._frozen = 0
        self.is_initialized = False

    def __copy__(self) -> ReservedLayer:
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        if self._kbuf is not None:
            # The copy's buffers end at its length (it moves before any write); ours keep their room but the
            # copied positions are now read by another holder.
            new._kbuf, new._vbuf = self._keys, self._values
            new._frozen = self._frozen = max(self._frozen, self._n)
        new._reserve = 0  # a copy grows as it needs (a drafter's layers: not the request's whole reservation)
        return new

    def __deepcopy__(self, memo: dict) -> ReservedLayer:
        new = object.__new__(type(self))
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            if k not in ("_kbuf", "_vbuf", "_keys", "_values"):
                new.__dict__[k] = copy.deepcopy(v, memo)
        # Buffers of its own, compact: never through the memo, which would give a layer and its shallow copy,
        # deep-copied together, one shared storage again.
        new._keys = new._kbuf = self._keys.clone() if self._keys is not None else None
        new._values = new._vbuf = self._values.clone() if self._values is not None else None
        new._frozen = 0
        return new


def new_cache(config: Any = None, reserve: int = 0) -> DynamicCache:
    """A DynamicCache for `config` whose full-attention layers are ReservedLayers (room for `reserve` positions
    at their first write; 0: grow as needed). Sliding-window layers stay transformers' own."""
    cache = DynamicCache(config=config) if config is not None else DynamicCache()
    if cache.layer_class_to_replicate is DynamicLayer:  # no config: layers are made at their first update
        cache.layer_class_to_replicate = ReservedLayer
    cache.layers = [ReservedLayer(reserve) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
