"""Attention whose bits do not depend on torch's thread count (metasd/models/cpu_attention.py): both paths, pinned
to one thread (forced here on any CPU) and as torch runs it (where the probe finds it invariant), give a packed
model's pass the same logits and hidden states on one thread and on two; shared rounds that mix thread counts
pin it where the probe says they must."""

from __future__ import annotations

import pytest
import torch

from metasd.core.kvcache import new_cache
from metasd.models import cpu_attention
from metasd.models.cpu_linear import pack_linears
from tests.tiny import tiny_llama


@pytest.fixture
def pin_state():
    """Whatever a test sets, the process's switch is as it was afterwards (it is process-wide)."""
    before = cpu_attention.pinned()
    yield
    cpu_attention.pin(before)


def _passes(model, threads: int) -> list[tuple[torch.Tensor, ...]]:
    """Logits and every hidden state of passes of 1-9 and 20 ids after 0-100 cached ones, on `threads` threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    out = []
    try:
        for past in (0, 7, 30, 100):
            for rows in (1, 2, 3, 5, 9, 20):
                ids = torch.randint(0, 48, (1, past + rows), generator=g)
                cache = new_cache(model.config)
                with torch.no_grad():
                    if past:
                        model(input_ids=ids[:, :past], past_key_values=cache, use_cache=True)
                    o = model(input_ids=ids[:, past:], position_ids=torch.arange(past, past + rows).view(1, -1),
                              past_key_values=cache, use_cache=True, output_hidden_states=True)
                out.append((o.logits, *o.hidden_states))
    finally:
        torch.set_num_threads(before)
    return out


def _same(a: list[tuple[torch.Tensor, ...]], b: list[tuple[torch.Tensor, ...]]) -> bool:
    return all(torch.equal(x, y) for ta, tb in zip(a, b, strict=True) for x, y in zip(ta, tb, strict=True))


def test_pinned_attention_gives_a_pass_the_same_bits_on_one_thread_and_on_two(pin_state):
    model = tiny_llama(vocab=48, layers=3, seed=5, scale=3.0)
    assert pack_linears(model) > 0
    cpu_attention.pin(True)
    one, two = _passes(model, 1), _passes(model, 2)
    assert _same(one, two)
    # Pinned, two threads compute what one does unpinned: the pin changes how many threads run, never the result.
    cpu_attention.pin(False)
    assert _same(one, _passes(model, 1))


def test_rounds_that_mix_thread_counts_pin_attention_where_the_probe_says_it_must(pin_state):
    """The probe's verdict on this CPU, checked on a model: a Rounds whose crowd runs at another thread count than a
    run alone pins attention exactly where the probe finds its bits moving (the test above covers that path); where
    they do not move, the unpinned passes agree across thread counts. A Rounds at one count never pins."""
    from metasd.serving.batch import Rounds

    model = tiny_llama(vocab=48, layers=3, seed=5, scale=3.0)
    assert pack_linears(model) > 0
    cpu_attention.pin(False)
    assert not Rounds(model, 2, threads=2, share=True).keep_bits_across_counts()
    invariant = cpu_attention.thread_invariant(4, 2, 8)
    mixed = Rounds(model, 2, threads=2, crowd_threads=1, share=True)
    assert mixed.mixes_thread_counts() and mixed.keep_bits_across_counts() == (not invariant)
    if invariant:
        assert _same(_passes(model, 1), _passes(model, 2))


def test_a_pinned_call_runs_on_one_thread_and_gives_the_count_back(pin_state):
    seen: list[int] = []

    def fn(q: torch.Tensor) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return q

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        cpu_attention.pin(True)
        cpu_attention.call(fn, torch.zeros(1))
        cpu_attention.call(fn, torch.zeros(1, device="meta"))  # not the CPU: as torch runs it
        assert torch.get_num_threads() == 2
        cpu_attention.pin(False)
        cpu_attention.call(fn, torch.zeros(1))
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 2, 2]


def test_transformers_sdpa_entry_reads_the_switch(pin_state):
    """pin() wraps transformers' sdpa attention once; every model forward goes through it, pinned or not."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    cpu_attention.pin(True)
    entry = ALL_ATTENTION_FUNCTIONS.get_interface("sdpa", None)
    cpu_attention.pin(False)
    cpu_attention.pin(True)
    assert ALL_ATTENTION_FUNCTIONS.get_interface("sdpa", None) is entry and hasattr(entry, "__wrapped__")


def test_a_rounds_made_without_threads_runs_at_its_makers_count():
    """A new thread takes torch's process-wide count of the moment (whatever another thread last set); the rounds'
    driver instead runs at the count of the thread that made the Rounds."""
    import threading

    from metasd.serving.batch import Rounds

    model = tiny_llama(vocab=48, layers=2)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        elsewhere = threading.Thread(target=torch.set_num_threads, args=(1,))
        elsewhere.start()
        elsewhere.join()
        assert Rounds(model, 2, share=True).threads == 2
        assert Rounds(model, 2, threads=1, share=True).threads == 1
    finally:
        torch.set_num_threads(before)
