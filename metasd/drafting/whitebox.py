"""White-box drafters: small heads that read the target's own hidden states (the EAGLE family).

A black-box drafter (a distilled one-layer model) sees only token ids. A white-box head also sees the
target's features at the last verified position, which already hold most of what the target will
say next, so one decoder layer predicts far better for the same cost (EAGLE, Li et al. 2024).

What this head reads and why (docs/DESIGN.md, "White-box drafters"):
- features from three depths of the target, low, middle and top (EAGLE-3's fusion: the top layer alone
  is tuned to the very next token, the lower ones keep what later tokens need), concatenated and
  projected to the target's width by `fuse`;
- with the embedding of the token that follows (EAGLE-1's shift: the feature at position t and the
  token at t + 1 together predict the token at t + 2), projected again by `fc`;
- one Llama decoder layer with its own KV cache, then the target's final-norm-like RMSNorm and the
  target's LM head restricted to a draft vocabulary (metasd.drafting.files.DraftHead), as the distilled drafters do.

Drafting several tokens feeds the head's own output state back in place of the target's features
(EAGLE-3 drops EAGLE-1's feature regression for this), and training unrolls exactly that: "training-
time test" (EAGLE-3, HASS), where step s at position t attends to the true-feature keys before t - s + 1
and to its own earlier steps' keys, as it will at inference.

The target's hidden states come from the forward passes the engine already runs (prefill and every
verification, `Drafter.take_features`); the head never runs the target.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Generator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from metasd.core.passes import HeadPart, head_alone, solo
from metasd.core.sampling import Sampling, warp
from metasd.drafting.drafters import Draft, Drafter, GreedySiblings, chain_steps, fit_vocab
from metasd.drafting.files import DRAFT_VOCAB, WHITEBOX_FORMAT, DraftHead, read_drafter_file, read_info, save_drafter_file
from metasd.drafting.registry import register_kind
from metasd.models import cpu_attention


@dataclass(frozen=True)
class HeadConfig:
    """The head's shape (the target's width, heads and RoPE) and which of the target's hidden states it reads."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    # Indices into the target's `hidden_states` tuple (0: the embeddings, L: the last layer's output after
    # the final norm, which is what the LM head reads).
    feature_layers: tuple[int, ...]

    @classmethod
    def from_target(cls, config, feature_layers: tuple[int, ...] | None = None) -> HeadConfig:
        layers = int(config.num_hidden_layers)
        rope = getattr(config, "rope_parameters", None) or {}
        theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        heads = int(config.num_attention_heads)
        return cls(
            hidden_size=int(config.hidden_size), num_heads=heads,
            num_kv_heads=int(getattr(config, "num_key_value_heads", heads)),
            head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
            intermediate_size=int(config.intermediate_size), rms_norm_eps=float(config.rms_norm_eps),
            rope_theta=theta, feature_layers=tuple(feature_layers or default_feature_layers(layers)),
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> HeadConfig:
        d = json.loads(text)
        d["feature_layers"] = tuple(d["feature_layers"])
        return cls(**d)


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """Low, middle and top: after layer 2, after the middle layer, and the final (normed) state."""
    return (min(2, num_layers), num_layers // 2, num_layers)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(v + self.eps)).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    """Grouped-query attention with RoPE, named like a Llama layer's so a target layer's weights load as is."""

    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x: [B, H, T, D]; pos: [B, T] absolute positions."""
        ang = pos.float()[:, None, :, None] * self.inv_freq
        ang = torch.cat((ang, ang), dim=-1)
        return (x.float() * ang.cos() + rotate_half(x.float()) * ang.sin()).to(x.dtype)

    def project(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of x [B, T, d] at positions pos, RoPE applied: [B, heads, T, D]."""
        b, t, _ = x.shape
        c = self.c
        q = self.q_proj(x).view(b, t, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        return self.rope(q, pos), self.rope(k, pos), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """mask: bool [T_q, T_k] or [B, 1, T_q, T_k], True where a query may look."""
        return self.o_proj(self.mix(q, k, v, mask))

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Attention before the output projection: [B, T_q, heads * D]."""
        # Grouped-query attention inside the kernel: no copy of the keys and values per query head (measured:
        # 18 against 41 us for one query over 121 positions, the same bits).
        out = cpu_attention.sdpa(q, k, v, attn_mask=mask, enable_gqa=self.c.num_heads != self.c.num_kv_heads)
        b, _, t, _ = out.shape
        return out.transpose(1, 2).reshape(b, t, -1)


class Layer(nn.Module):
    """A pre-norm Llama decoder layer; its parameter names match the target's layers."""

    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = nn.ModuleDict({
            "gate_proj": nn.Linear(c.hidden_size, c.intermediate_size, bias=False),
            "up_proj": nn.Linear(c.hidden_size, c.intermediate_size, bias=False),
            "down_proj": nn.Linear(c.intermediate_size, c.hidden_size, bias=False),
        })

    def ffn(self, h: torch.Tensor) -> torch.Tensor:
        m = self.mlp
        x = self.post_attention_layernorm(h)
        return h + m["down_proj"](F.silu(m["gate_proj"](x)) * m["up_proj"](x))


class WhiteBoxHead(nn.Module):
    """fuse(target features) -> fc(with the next token's embedding) -> one decoder layer -> norm -> head.

    The embedding table and the LM head are the target's (held, not registered: they are neither trained
    nor saved); only `fuse`, `fc`, the layer and the norm are this head's own weights.
    """

    def __init__(self, c: HeadConfig, embed: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.c = c
        d = c.hidden_size
        self.fuse = nn.Linear(len(c.feature_layers) * d, d, bias=False)
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.layer = Layer(c)
        self.norm = RMSNorm(d, c.rms_norm_eps)
        object.__setattr__(self, "embed", embed)
        object.__setattr__(self, "lm_head", lm_head)

    def inputs(self, g: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """The layer's input at each position: a feature (fused target features, or the head's own output
        state) with the embedding of the token that follows it."""
        return self.fc(self.pair(g, next_tokens))

    def pair(self, g: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """`fc`'s input: each feature row beside the embedding of the token after it."""
        return torch.cat((g, self.embed(next_tokens).to(g.dtype)), dim=-1)

    def logits(self, a: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(a))

    @torch.inference_mode()
    def run_together(self, parts: list[HeadPart], rows: Callable[[Callable, torch.Tensor], torch.Tensor] | None = None
                     ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Several requests' steps in one call: the row-wise parts (`inputs`, norms, projections, rotary angles,
        the MLP, the last rows' logits) once over every part's rows, attention per part against its own cached
        keys and values with its own causal mask. Each part gets the bits a call of its own gives it where the
        linear layers are row-invariant (the shared rounds check that, as for the target). `rows(fn, x)`: how
        a row-wise call runs (the shared rounds' blocks on a GPU; default: at once)."""
        rows = rows or (lambda fn, x: fn(x))
        L, c = self.layer, self.c
        at = L.self_attn
        g, nxt = torch.cat([p.g for p in parts]), torch.cat([p.tokens for p in parts])
        x = rows(self.fc, self.pair(g, nxt)[None])  # `inputs`, row by row
        pos = torch.cat([p.pos for p in parts], dim=1)
        n = x.shape[1]
        hn = rows(L.input_layernorm, x)
        q, k, v = (rows(f, hn).view(1, n, -1, c.head_dim).transpose(1, 2) for f in (at.q_proj, at.k_proj, at.v_proj))
        q, k = at.rope(q, pos), at.rope(k, pos)
        edges = list(itertools.accumulate((len(p.tokens) for p in parts), initial=0))
        mixed, caches = [], []
        for p, (a, b) in zip(parts, itertools.pairwise(edges), strict=True):
            keys = k[:, :, a:b] if p.past is None else torch.cat((p.past[0], k[:, :, a:b]), dim=2)
            vals = v[:, :, a:b] if p.past is None else torch.cat((p.past[1], v[:, :, a:b]), dim=2)
            n_past = keys.shape[2] - (b - a)
            # One row (a drafting step) sees every key: no mask to build.
            mask = None if b - a == 1 else torch.ones(b - a, keys.shape[2], dtype=torch.bool, device=x.device).tril(n_past)
            mixed.append(at.mix(q[:, :, a:b], keys, vals, mask))
            caches.append((keys, vals))
        h = x + rows(at.o_proj, torch.cat(mixed, dim=1))
        out = rows(L.ffn, h)
        last = rows(self.logits, out[:, [e - 1 for e in edges[1:]]])[0]
        return [(out[:, lo:hi], keys, vals, last[j])
                for j, ((lo, hi), (keys, vals)) in enumerate(zip(itertools.pairwise(edges), caches, strict=True))]


def own_state(head: WhiteBoxHead) -> dict[str, torch.Tensor]:
    return {k: v for k, v in head.state_dict().items() if not k.startswith(("embed.", "lm_head."))}


def build_head(target, c: HeadConfig, draft_vocab: torch.Tensor | None, init_layer: int | None = None) -> WhiteBoxHead:
    """A head on `target`'s embedding and LM head (restricted to `draft_vocab`), its layer copied from the
    target's layer `init_layer` where given (a better start than random weights), its norm from the target's."""
    lm = target.get_output_embeddings()
    head = WhiteBoxHead(c, target.get_input_embeddings(), lm if draft_vocab is None else DraftHead(lm, draft_vocab))
    if init_layer is not None:
        src = target.model.layers[init_layer].state_dict()
        head.layer.load_state_dict({k: v for k, v in src.items() if k in head.layer.state_dict()}, strict=True)
        head.norm.load_state_dict(target.model.norm.state_dict())
    with torch.no_grad():
        # fc starts as "keep the feature, add a little of the embedding"; fuse as the top feature alone.
        d = c.hidden_size
        head.fc.weight.zero_()
        head.fc.weight[:, :d] = torch.eye(d)
        head.fc.weight[:, d:] = 0.1 * torch.eye(d)
        head.fuse.weight.zero_()
        head.fuse.weight[:, -d:] = torch.eye(d)
    dev = next(target.parameters()).device
    return head.to(dev)


def save_head(head: WhiteBoxHead, path: str | Path, info: dict) -> str:
    """Write a head's own weights (metasd.drafting.files); returns the file's sha256."""
    return save_drafter_file(path, own_state(head), head.lm_head, WHITEBOX_FORMAT, head.c.to_json(), info)


def load_head(path: str | Path, target, device: torch.device, dtype: torch.dtype) -> WhiteBoxHead:
    """Load a head's own weights (fp16 on disk) onto the target's embedding and LM head."""
    meta, tensors = read_drafter_file(path, WHITEBOX_FORMAT, "white-box head")
    c = HeadConfig.from_json(meta["config"])
    if c.hidden_size != target.config.hidden_size or max(c.feature_layers) > target.config.num_hidden_layers:
        raise ValueError(f"{path} was trained for another target (width {c.hidden_size}, layers {c.feature_layers})")
    head = build_head(target, c, tensors.pop(DRAFT_VOCAB, None))
    head.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=False)
    missing = set(own_state(head)) - set(tensors)
    if missing:
        raise ValueError(f"{path}: missing weights {sorted(missing)[:3]}")
    return head.to(device=device, dtype=dtype).eval().requires_grad_(False)


read_head_info = read_info  # (config, training record) of a head's file


class WhiteBoxDrafter(GreedySiblings, Drafter):
    """One request's use of a white-box head: the target's features it was given and the head's KV cache.

    Feature row t is the target's hidden state at position t (known for every position the target's cache
    holds, i.e. ids[:-1]). The head's input at position t is (feature t, token t + 1) and it predicts token
    t + 2; so with features through len(ids) - 2 its first draft token is ids' next one. The cache holds only
    positions computed from true features; the positions a draft adds are dropped right after drafting.
    With a `window`, a cold start (first pull, a long idle spell) reads only the last `window` positions.
    """

    deterministic = False

    def __init__(self, name: str, head: WhiteBoxHead, target_vocab: int, tokenizer_vocab: int,
                 min_confidence: float = 0.3, window: int = 0) -> None:
        super().__init__(name)
        self.head = head
        self.feature_layers = head.c.feature_layers
        self.window = window
        self.min_confidence = min_confidence
        self.target_vocab, self.tokenizer_vocab = target_vocab, tokenizer_vocab
        self.device = next(head.parameters()).device
        self.dtype = next(head.parameters()).dtype
        self.reset([])

    def reset(self, prompt_ids: list[int]) -> None:
        self._drafted = None
        self._buf: torch.Tensor | None = None  # [capacity, len(layers) * d]: rows 0 .. nf - 1 hold features
        self.nf = 0
        self.f0 = 0  # position of the features' row 0
        self.k = self.v = None  # head cache [1, kv_heads, T, D] for positions c0 .. c0 + T - 1
        self.c0 = 0
        self.tokens: list[int] = []  # ids[c0 + 1 : c0 + 1 + T]: the next tokens those positions read

    # ---- features from the engine ----------------------------------------------------------

    @property
    def feats(self) -> torch.Tensor | None:
        """The raw target features held, [n, len(layers) * d], row 0 at position f0 (a view)."""
        return None if self._buf is None else self._buf[: self.nf]

    def take_features(self, start: int, hidden: tuple[torch.Tensor, ...], rows: int) -> None:
        # Written in place into a buffer that doubles when full: every round adds a few rows, and copying
        # the whole history each time (as a concatenation would) grows with the answer's length.
        off = start - self.f0
        if self._buf is None or off < 0 or off > self.nf:
            self.f0, self.nf, off = start, 0, 0
        need = off + rows
        if self._buf is None or need > self._buf.shape[0]:
            width = sum(hidden[i].shape[-1] for i in self.feature_layers)
            cap = max(need, 2 * (0 if self._buf is None else self._buf.shape[0]), 256)
            grown = torch.empty(cap, width, dtype=self.dtype, device=hidden[self.feature_layers[0]].device)
            if off:
                grown[:off] = self._buf[:off]
            self._buf = grown
        col = 0
        for i in self.feature_layers:
            d = hidden[i].shape[-1]
            self._buf[off:need, col : col + d] = hidden[i][0, :rows]
            col += d
        self.nf = need
        keep = (self.window or 1 << 30) + 64  # a cold start reads at most `window` positions back
        if self.nf > 2 * keep:  # rows cut..nf move to the front (no overlap: cut > keep)
            cut = self.nf - keep
            self._buf[:keep] = self._buf[cut : self.nf]
            self.f0, self.nf = self.f0 + cut, keep

    def _feature_rows(self, lo: int, hi: int) -> torch.Tensor | None:
        if self._buf is None or lo < self.f0 or hi > self.f0 + self.nf:
            return None
        return self._buf[lo - self.f0 : hi - self.f0]

    # ---- the head's cache -------------------------------------------------------------------

    def _crop(self, n: int) -> None:
        """Keep the first n cached positions."""
        if self.k is not None:
            self.k, self.v = self.k[:, :, :n], self.v[:, :, :n]
        del self.tokens[n:]

    def _sync(self, ids: list[int], upto: int, feed_from: int
              ) -> Generator[HeadPart, Any, tuple[torch.Tensor, torch.Tensor] | None]:
        """Make the cache hold positions c0 .. upto - 1 (true features), recomputing at least feed_from ..
        upto - 1; returns the head's output states there [upto - feed_from, d] and the draft logits of the
        last, or None without features."""
        c = 0
        limit = min(len(self.tokens), feed_from - self.c0)
        while c < limit and self.tokens[c] == ids[self.c0 + 1 + c]:
            c += 1
        if self.k is None or (self.window and upto - (self.c0 + c) > self.window) or feed_from < self.c0:
            self.k = self.v = None
            self.tokens = []
            c = 0
            self.c0 = max(0, min(feed_from, upto - self.window)) if self.window else 0
            if self._buf is not None:
                self.c0 = max(self.c0, self.f0)
        self._crop(c)
        lo = self.c0 + c
        f = self._feature_rows(lo, upto)
        if f is None or upto <= lo:
            return None
        g = self.head.fuse(f.to(self.device))
        nxt = torch.tensor(ids[lo + 1 : upto + 1], device=self.device)
        pos = torch.arange(lo, upto, device=self.device)[None]
        a, last = yield from self._run(g, nxt, pos)
        self.tokens.extend(ids[lo + 1 : upto + 1])
        return a[0, feed_from - lo :], last

    def _run(self, g: torch.Tensor, nxt: torch.Tensor, pos: torch.Tensor
             ) -> Generator[HeadPart, Any, tuple[torch.Tensor, torch.Tensor]]:
        """The head's step over feature rows g and their next tokens at pos after its cache, asked of whoever
        drives (a HeadPart): its output states and its last row's draft logits; the cache grows."""
        past = None if self.k is None else (self.k, self.v)
        a, self.k, self.v, last = yield HeadPart(self.head, g, nxt, pos, past)
        return a, last

    def _logits(self, a: torch.Tensor) -> torch.Tensor:
        return self._fit(self.head.logits(a))

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        return fit_vocab(logits, self.target_vocab, self.tokenizer_vocab)

    @torch.inference_mode()
    def propose(self, ids, k, s: Sampling, generator):
        return solo(self.propose_steps(ids, k, s, generator), head_alone)

    @torch.inference_mode()
    def propose_steps(self, ids, k, s, generator):
        n = len(ids)
        self._drafted = None
        if k <= 0 or n < 2:
            return Draft([], None)
        synced = yield from self._sync(ids, n - 1, n - 2)
        if synced is None:
            return Draft([], None)
        true_len = len(self.tokens)
        state, last = synced[0][-1:], synced[1]
        rows: list[torch.Tensor] | None = [] if s.greedy else None
        chain = chain_steps(self._fit(last), k, s, generator, self.min_confidence, rows)
        try:
            x, i = next(chain), 0
            while True:
                # The head's own output stands in for the target's feature at the next position.
                a, last = yield from self._run(state, x.view(1), torch.tensor([[n - 1 + i]], device=self.device))
                state = a[0]
                x, i = chain.send(self._fit(last)), i + 1
        except StopIteration as end:
            tokens, qs = end.value
        self._crop(true_len)  # drafted positions never stay: the next round brings true features
        toks = torch.stack(tokens).tolist()
        self.keep_rows(ids, toks, rows)
        return Draft(toks, torch.stack(qs) if qs else None)

    @torch.inference_mode()
    def predict(self, ids, start, n, s):
        # Token j is predicted at position j - 2 from (feature j - 2, token j - 1): the head's first step.
        lo = max(start - 2, 0)
        synced = solo(self._sync(ids, start + n - 2, lo), head_alone)
        a = None if synced is None else synced[0]
        missing = n - (0 if a is None else a.shape[0])
        if a is None or a.shape[0] == 0:
            logits = torch.zeros(0, self.target_vocab, device=self.device)
        else:
            logits = self._logits(a)
        if missing:  # positions with no feature before them (a one-token context): predict nothing
            pad = torch.full((missing, self.target_vocab), float("-inf"), device=self.device)
            pad[:, 0] = 0.0
            logits = torch.cat((pad, logits))
        if s.greedy:
            out = logits.argmax(-1)
            if missing:
                out[:missing] = -1
            return out
        q = warp(logits, s)
        if missing:
            q[:missing] = 0.0
        return q


register_kind("white-box", lambda bundle, spec: WhiteBoxDrafter(
    spec.name, bundle.models[spec.name], bundle.target_vocab, bundle.tokenizer_vocab, window=spec.window))
