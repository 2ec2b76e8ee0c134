"""What the page and the conversion know before any model loads: the drafters a preset can offer here, and the
GGUF file parsed once while the offline target is converted (metasd/decoding/loading.py)."""

from __future__ import annotations

import gguf
import numpy as np

from metasd.decoding.loading import _gguf_parsed_once, default_drafters, drafter_names, present_specs
from metasd.models.presets import PRESETS, DrafterSpec, Preset


def test_a_trained_drafter_without_its_weights_file_is_left_out_before_anything_loads(tmp_path):
    weights = tmp_path / "here.safetensors"
    weights.write_bytes(b"")
    p = Preset("t", "test", "none", (
        DrafterSpec("lookup", "prompt-lookup", ""),
        DrafterSpec("here", "distilled", "", weights=str(weights)),
        DrafterSpec("gone", "distilled", "", weights=str(tmp_path / "gone.safetensors")),
        DrafterSpec("head", "white-box", "", weights=str(tmp_path / "head.safetensors")),
    ), bandit_drafters=("here", "gone"))
    specs = present_specs(p)
    assert list(specs) == ["lookup", "here"]
    assert drafter_names(specs)[:2] == ["lookup", "here"]
    assert default_drafters(p, specs) == ["here"]  # the preset's choice among those present
    offline = PRESETS["offline"]  # its shipped drafters all have their files in the repository
    assert list(present_specs(offline)) == [d.name for d in offline.drafters]


def test_the_gguf_file_is_parsed_once_within_the_conversion_and_gguf_is_put_back(tmp_path):
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with _gguf_parsed_once():
        a, b = gguf.GGUFReader(str(path)), gguf.GGUFReader(path)
        assert a is b and [t.name for t in a.tensors] == ["token_embd.weight"]
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
    assert gguf.GGUFReader is reader and gguf.get_tensor_name_map is name_map
    assert gguf.GGUFReader(str(path)) is not a  # outside it, a fresh parse again
