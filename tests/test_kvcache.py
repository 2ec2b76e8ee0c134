"""The in-place KV cache (metasd/core/kvcache.py) against transformers' DynamicCache: the same logits bit for bit
through any sequence of passes, roll-backs, shallow copies (a layer-skip drafter's adoption), assigned tensors
(token trees) and deep copies; and a shallow copy never sees the original's later writes, nor the other way."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from transformers import DynamicCache

from metasd.core import kvcache
from metasd.core.kvcache import ReservedLayer, new_cache
from metasd.core.passes import crop_to
from metasd.decoding.tree import keep_rows
from tests.tiny import tiny_llama


def _pass(model, cache, ids: list[int], start: int) -> torch.Tensor:
    pos = torch.arange(start, start + len(ids)).view(1, -1)
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), position_ids=pos, past_key_values=cache, use_cache=True).logits


def _same(a, b) -> None:
    assert a.get_seq_length() == b.get_seq_length()
    for la, lb in zip(a.layers, b.layers, strict=True):
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


def test_new_cache_uses_reserved_layers():
    model = tiny_llama(layers=3)
    assert all(type(layer) is ReservedLayer for layer in new_cache(model.config).layers)
    lazy = new_cache()  # no config: layers are made at their first update, of our kind
    _pass(model, lazy, [1, 2, 3], 0)
    assert len(lazy.layers) == 3 and all(type(layer) is ReservedLayer for layer in lazy.layers)


@pytest.mark.parametrize("seed", range(4))
def test_rounds_give_the_logits_of_dynamic_cache(seed, monkeypatch):
    """Random rounds as the engine plays them (a pass of 1-6 ids, then a roll-back of what was rejected), with
    little room to spare on odd seeds so the buffers also move while growing: every pass bitwise equal to
    DynamicCache's."""
    if seed % 2:
        monkeypatch.setattr(kvcache, "GROW_MIN", 2)
    rng = random.Random(seed)
    model = tiny_llama(vocab=40, layers=2, seed=seed)
    ours, theirs = new_cache(model.config), DynamicCache(config=model.config)
    buffers = set()
    ids = [rng.randrange(40) for _ in range(rng.randrange(1, 30))]
    assert torch.equal(_pass(model, ours, ids, 0), _pass(model, theirs, ids, 0))
    n = len(ids)
    for _ in range(60):
        feed = [rng.randrange(40) for _ in range(rng.randrange(1, 7))]
        assert torch.equal(_pass(model, ours, feed, n), _pass(model, theirs, feed, n))
        n += rng.randrange(0, len(feed) + 1)  # what was kept
        crop_to(ours, n)
        crop_to(theirs, n)
        _same(ours, theirs)
        buffers.add(ours.layers[0].keys.data_ptr())
    assert (len(buffers) > 3) == bool(seed % 2)  # the buffers moved (little room) or never did


def test_a_shallow_copy_and_its_original_never_write_into_each_other():
    """A layer-skip drafter adopts the target's layer objects (copy.copy). Afterwards the target rolls back past
    the copied length and writes there, and the copy writes its own positions: each keeps what it had."""
    model = tiny_llama(vocab=40, layers=2)
    target = new_cache(model.config)
    _pass(model, target, list(range(10)), 0)
    borrowed = new_cache(model.config)
    borrowed.layers = [copy.copy(layer) for layer in target.layers]
    held = [(layer.keys.clone(), layer.values.clone()) for layer in borrowed.layers]
    crop_to(target, 6)
    _pass(model, target, [30, 31, 32, 33, 34, 35, 36], 6)  # over positions 6-9, which the copy holds
    for layer, (k, v) in zip(borrowed.layers, held, strict=True):
        assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)
    target_now = [(layer.keys.clone(), layer.values.clone()) for layer in target.layers]
    _pass(model, borrowed, [5, 6], 10)  # the copy grows: the target's positions 10-11 stay the target's
    crop_to(borrowed, 4)
    _pass(model, borrowed, [7, 8, 9], 4)
    for layer, (k, v) in zip(target.layers, target_now, strict=True):
        assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)
    # And each still computes what a DynamicCache fed the same passes would (the same passes: a row's bits may
    # depend on how many rows share its pass, on CPUs whose default kernels are not row-invariant).
    ref = DynamicCache(config=model.config)
    _pass(model, ref, list(range(10)), 0)
    crop_to(ref, 6)
    _pass(model, ref, [30, 31, 32, 33, 34, 35, 36], 6)
    assert torch.equal(_pass(model, target, [1], 13), _pass(model, ref, [1], 13))


def test_token_tree_rows_and_deep_copies_keep_the_bits():
    """keep_rows assigns new tensors (the tree's kept branch); deepcopy gives an independent cache (the shared
    rounds' start-up measurement): both then go on computing DynamicCache's logits."""
    model = tiny_llama(vocab=40, layers=2, seed=3)
    ours, theirs = new_cache(model.config), DynamicCache(config=model.config)
    for c in (ours, theirs):
        _pass(model, c, list(range(12)), 0)
        _pass(model, c, [20, 21, 22, 23, 24], 12)
        keep_rows(c, 12, [1, 3])
    _same(ours, theirs)
    twin = copy.deepcopy(ours)
    assert torch.equal(_pass(model, ours, [5, 6], 14), _pass(model, theirs, [5, 6], 14))
    _pass(model, twin, [9], 14)  # the twin writes where the original just did
    assert torch.equal(_pass(model, ours, [7], 16), _pass(model, theirs, [7], 16))


def test_a_tree_kept_branch_moves_in_place_unless_a_copy_holds_it():
    model = tiny_llama(vocab=40, layers=2, seed=4)
    ours, theirs = new_cache(model.config), DynamicCache(config=model.config)
    for c in (ours, theirs):
        _pass(model, c, list(range(8)), 0)
        _pass(model, c, [20, 21, 22, 23], 8)
    before = ours.layers[0].keys.data_ptr()
    keep_rows(ours, 8, [2, 3])
    keep_rows(theirs, 8, [2, 3])
    _same(ours, theirs)
    assert ours.layers[0].keys.data_ptr() == before  # no copy of the cache: rows moved within the buffer
    for c in (ours, theirs):
        crop_to(c, 6)
        _pass(model, c, [30, 31, 32], 6)
    # A copy now holds positions 0-8; the kept branch from position 6 must not write over them.
    held = copy.copy(ours.layers[1])
    k, v = held.keys.clone(), held.values.clone()
    for c in (ours, theirs):
        keep_rows(c, 6, [0, 2])
    _same(ours, theirs)
    assert torch.equal(held.keys, k) and torch.equal(held.values, v)
    assert torch.equal(_pass(model, ours, [3], 8), _pass(model, theirs, [3], 8))


def test_a_layer_and_its_shallow_copy_deep_copied_together_stay_apart():
    """One deepcopy over both (a request with its layer-skip drafter, say) must not hand them one storage again."""
    model = tiny_llama(vocab=40, layers=1, seed=5)
    target = new_cache(model.config)
    _pass(model, target, list(range(9)), 0)
    pair = copy.deepcopy([target.layers[0], copy.copy(target.layers[0])])
    held = pair[1].keys.clone()
    pair[0].crop(-4)
    pair[0].update(torch.ones(1, *held.shape[1:2], 4, held.shape[-1]), torch.ones(1, *held.shape[1:2], 4, held.shape[-1]))
    assert torch.equal(pair[1].keys, held)


def test_keep_rows_refuses_rows_outside_the_pass():
    model = tiny_llama(vocab=40, layers=1, seed=6)
    cache = new_cache(model.config)
    _pass(model, cache, list(range(6)), 0)
    with pytest.raises(IndexError):
        cache.layers[0].keep_rows(4, torch.tensor([5, 6]))
