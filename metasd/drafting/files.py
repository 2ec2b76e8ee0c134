"""Drafter files: the one place that reads, writes, counts and describes a trained drafter's weights.

A trained drafter (a distilled one, `metasd-distilled-1`, or a white-box head, `metasd-white-box-1`) is a
safetensors file of its own weights in fp16, plus optionally `draft_vocab`, the int64 ids of the draft
vocabulary its head is restricted to (DraftHead). Its metadata holds `format`, `config` (JSON: what the
loader builds) and `info` (JSON: the training record that the model card is written from). The target's
embedding and head are never stored: they are attached at load time.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from metasd.models.presets import DrafterSpec
from metasd.paths import DRAFTERS_DIR, ROOT

DISTILLED_FORMAT = "metasd-distilled-1"
WHITEBOX_FORMAT = "metasd-white-box-1"
DRAFT_VOCAB = "draft_vocab"  # optional int64 tensor of token ids in a drafter file (see DraftHead)


class DraftHead(torch.nn.Module):
    """The target's LM head restricted to a draft vocabulary (as in FR-Spec / EAGLE-3).

    A one-layer drafter's full head (576 x 49152 for SmolLM2) costs about twice its decoder layer, yet
    the tokens such a drafter gets right are frequent ones. So the head multiplies by the rows of the
    draft vocabulary only (a copy of the target's rows, never trained) and returns logits over the full
    id space with -inf elsewhere: q = 0 off the draft vocabulary, which speculative sampling handles
    exactly, so nothing about losslessness changes.
    """

    def __init__(self, head: torch.nn.Module, ids: torch.Tensor) -> None:
        super().__init__()
        full = head.weight
        ids = torch.as_tensor(ids, dtype=torch.long).to(full.device).unique(sorted=True)
        if ids.numel() == 0 or int(ids[0]) < 0 or int(ids[-1]) >= full.shape[0]:
            raise ValueError(f"draft vocabulary ids must lie in [0, {full.shape[0]})")
        self.vocab_size = full.shape[0]
        self.register_buffer("ids", ids, persistent=False)
        # A linear layer of its own, so that the CPU packing (metasd/models/cpu_linear.py) reaches it too: a row's
        # bits then do not depend on the rows beside it, and several requests' drafts share one pass bit for bit.
        self.proj = torch.nn.Linear(full.shape[1], ids.numel(), bias=False, device="meta", dtype=full.dtype)
        self.proj.weight = torch.nn.Parameter(full.detach()[ids].clone(), requires_grad=False)
        # full id -> row of self.weight (or -1): lets training map the target's labels onto it.
        local = torch.full((self.vocab_size,), -1, dtype=torch.long, device=full.device)
        local[ids] = torch.arange(ids.numel(), device=full.device)
        self.register_buffer("local", local, persistent=False)

    @property
    def weight(self) -> torch.nn.Parameter:
        """The target's head rows of the draft vocabulary (a copy, never trained)."""
        return self.proj.weight

    def reduced(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary only, in the order of self.ids."""
        return self.proj(hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        small = self.reduced(hidden)
        out = small.new_full((*small.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.ids, small)


def drafter_path(spec: DrafterSpec) -> Path:
    """A trained drafter's weights: the spec's `weights` (relative to the repository) or
    assets/drafters/<name>.safetensors."""
    if spec.weights:
        p = Path(spec.weights)
        return p if p.is_absolute() else ROOT / p
    return DRAFTERS_DIR / f"{spec.name}.safetensors"


def save_drafter_file(path: str | Path, own: dict[str, torch.Tensor], lm_head: torch.nn.Module, fmt: str,
                      config_json: str, info: dict) -> str:
    """Write a drafter's own weights in fp16 (and its draft vocabulary's ids where its head has one) with
    its config and training record as metadata. Returns the file's sha256."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in own.items()}
    if isinstance(lm_head, DraftHead):
        tensors[DRAFT_VOCAB] = lm_head.ids.detach().cpu().to(torch.int64).contiguous()
    save_file(tensors, str(path), metadata={"format": fmt, "config": config_json,
                                            "info": json.dumps(info, sort_keys=True)})
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_drafter_file(path: str | Path, fmt: str, what: str) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(metadata, tensors) of a drafter file, refusing a file of another format; `what` names the kind
    in the message ("distilled drafter", "white-box head")."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != fmt:
            raise ValueError(f"{path} is not a MetaSD {what} (format {meta.get('format')!r})")
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    return meta, tensors


def read_format(path: str | Path) -> str | None:
    """The `format` a drafter file declares (None where it has none)."""
    with safe_open(str(path), framework="pt") as f:
        return (f.metadata() or {}).get("format")


def read_info(path: str | Path) -> tuple[dict, dict]:
    """(config, training record) stored in a drafter file's metadata, without reading its weights."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    return json.loads(meta["config"]), json.loads(meta.get("info", "{}"))


def parameter_count(path: str | Path) -> int:
    """Parameters stored in a safetensors file (the draft vocabulary's ids are not parameters)."""
    with safe_open(str(path), framework="pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys() if k != DRAFT_VOCAB)  # noqa: SIM118


def has_draft_vocab(path: str | Path) -> bool:
    with safe_open(str(path), framework="pt") as f:
        return DRAFT_VOCAB in set(f.keys())  # noqa: SIM118


def card_file_lines(path: Path) -> list[str]:
    """The model card's first facts, read from the file itself: its name, size and sha256."""
    data = path.read_bytes()
    return [f"- `{path.name}`: {len(data):,} bytes, sha256 `{hashlib.sha256(data).hexdigest()}`"]


def write_card_text(path: Path, lines: list[str]) -> Path:
    """Write NAME.md beside NAME.safetensors."""
    card = path.with_suffix(".md")
    card.write_text("\n".join(lines), encoding="utf-8")
    return card
