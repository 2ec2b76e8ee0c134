"""Drafters: propose up to k tokens, learn from what the target verified, reset per request.

The interface is in the spirit of transformers' `CandidateGenerator`, but smaller. A drafter
object holds one request's state only (caches, tables); model weights are shared and read-only.
"""

from __future__ import annotations

import copy
import heapq
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel

from metasd.core.kvcache import new_cache
from metasd.core.passes import DraftPart, VerifyPart, crop_to, forward_alone, solo
from metasd.core.sampling import Sampling, sample_or_argmax, warp
from metasd.drafting.registry import register_kind


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    q: torch.Tensor | None  # [len(tokens), V] warped probabilities, None if deterministic/greedy


@dataclass(frozen=True)
class Verified:
    """What the target verified in a round, shown to every drafter afterwards."""

    start: int  # len(ids) before the round
    inputs: list[int]  # what the target was fed: [ids[start - 1]] + draft
    logits: torch.Tensor  # [len(inputs), V] the target's logits at those inputs
    emitted: list[int]  # the ids appended to the context
    # A token-tree round (metasd/decoding/tree.py) verified more than the chain above: every node's row. Row j
    # of tree_logits follows tree_inputs[j] in that node's own context (its ancestors), not in a chain's.
    tree_inputs: list[int] | None = None
    tree_logits: torch.Tensor | None = None


class Drafter(ABC):
    """One arm of the bandit."""

    name: str
    deterministic: bool = True  # q is one-hot of the draft (no distribution to compare)
    model_free: bool = False  # scoring it on a verified chunk costs microseconds, not a forward pass
    shared_layers: int = 0  # leading decoder layers that are the target's own (model drafters: see adopt)

    def __init__(self, name: str) -> None:
        self.name = name
        self._ms_per_token = 0.0  # measured, smoothed

    @abstractmethod
    def reset(self, prompt_ids: list[int]) -> None:
        """Forget everything from the previous request."""

    @abstractmethod
    def propose(self, ids: list[int], k: int, s: Sampling, generator: torch.Generator | None) -> Draft:
        """Up to k tokens that should follow `ids`."""

    def propose_steps(self, ids: list[int], k: int, s: Sampling, generator: torch.Generator | None
                      ) -> Generator[DraftPart, torch.Tensor, Draft]:
        """`propose` as steps: a drafter that runs a model yields each forward it needs (a DraftPart) and
        receives its logits, so that a driver serving many requests runs theirs in one pass. The draft is
        the same either way. Default: nothing to share, the draft at once."""
        return self.propose(ids, k, s, generator)
        yield  # a generator that never yields

    def alternatives(self, ids: list[int], k: int, n: int) -> list[tuple[tuple[int, ...], float]]:
        """Up to n candidate paths (each at most k ids) that could follow `ids` besides the chain `propose`
        gives, for a token tree's spare room: (path, estimated chance that the whole path is right). The set
        must be prefix-closed (every prefix of a path is a path too) and deterministic. Default: none."""
        return []

    def mark_scaffold(self, positions: frozenset[int]) -> None:  # noqa: B027 (optional hook)
        """Prompt positions the user did not write (the chat template's roles, special tokens, the
        generation prompt). A drafter that copies from the context must not copy those."""

    def observe(self, ids: list[int], verified: Verified) -> None:  # noqa: B027 (optional hook)
        """Learn from the target's verification (ids already include the emitted tokens)."""

    # Prompt positions whose target predictions this drafter wants at prefill (see `seed`). Each
    # costs the engine one row of the target's LM head, so only drafters that learn from them ask.
    seed_rows: int = 0

    def seed(self, inputs: list[int], logits: torch.Tensor) -> None:  # noqa: B027 (optional hook)
        """The target's predictions at prefill: row j of `logits` follows prompt token inputs[j]
        (only the user's own tokens, at most `seed_rows` of them, never the template's scaffolding)."""

    # The target's hidden states this drafter reads (indices into its `hidden_states`: 0 the embeddings,
    # L the final normed state). White-box drafters (metasd/drafting/whitebox.py) ask; the engine then has every
    # target pass return them and hands over the rows it keeps.
    feature_layers: tuple[int, ...] = ()

    def take_features(self, start: int, hidden: tuple[torch.Tensor, ...], rows: int) -> None:  # noqa: B027
        """The target's hidden states at positions start .. start + rows - 1 (row j of each [1, n, d]
        tensor of `hidden` is position start + j): after prefill, and after each verification for the
        positions it kept. Positions from `start` on replace whatever the drafter held there."""

    def attach(self, target_cache: DynamicCache, ids: list[int]) -> None:  # noqa: B027 (optional hook)
        """Called before the drafter drafts or predicts, with the target's live cache (which holds
        ids[:-1]). A drafter that shares layers with the target takes their keys and values here."""

    @abstractmethod
    def predict(self, ids: list[int], start: int, n: int, s: Sampling) -> torch.Tensor:
        """Teacher-forced predictions for positions start..start+n-1 of `ids` (full information).

        Returns [n] predicted ids for a deterministic drafter or greedy decoding, else [n, V] q rows.
        """

    def record_time(self, seconds: float, tokens: int) -> None:
        if tokens:
            ms = 1000.0 * seconds / tokens
            self._ms_per_token = ms if self._ms_per_token == 0 else 0.8 * self._ms_per_token + 0.2 * ms

    @property
    def ms_per_token(self) -> float:
        """Measured cost of drafting one token (smoothed); c = this / the target's step time."""
        return self._ms_per_token


# --------------------------------------------------------------------------------------------
# Model-free drafters


Children = Callable[[tuple[int, ...], Any], list[tuple[int, float, Any]]]


def best_first(children: Children, root: Any, k: int, n: int) -> list[tuple[tuple[int, ...], float]]:
    """The n most probable paths (at most k ids) of a candidate tree, as (path, chance): a best-first walk
    from `root`, where children(path, state) gives each next id with its conditional chance and the state
    to expand it from. The result is prefix-closed (a path comes out only after its parent)."""
    out: list[tuple[tuple[int, ...], float]] = []
    heap: list[tuple[float, int, tuple[int, ...], Any]] = [(-1.0, 0, (), root)]
    tie = 0
    while heap and len(out) < n:
        neg, _, path, state = heapq.heappop(heap)
        if path:
            out.append((path, -neg))
        if len(path) >= k:
            continue
        for tok, chance, child in children(path, state):
            tie += 1
            heapq.heappush(heap, (neg * chance, tie, (*path, tok), child))
    return out


def _last_match(arr: np.ndarray, end: int, max_ngram: int, min_ngram: int) -> int:
    """Start of the continuation after the latest earlier occurrence of arr[end-n:end], or -1."""
    for n in range(min(max_ngram, end - 1), min_ngram - 1, -1):
        pattern = arr[end - n : end]
        # Windows starting at i = 0 .. end - n - 1, i.e. all occurrences before the suffix itself.
        windows = np.lib.stride_tricks.sliding_window_view(arr[: end - 1], n)
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        if hits.size:
            return int(hits[-1]) + n
    return -1


class PromptLookup(Drafter):
    """Copy what followed the latest earlier occurrence of the context's last n-gram.

    Strong where the answer repeats its input: summarization, RAG, extraction, code editing.
    """

    model_free = True

    def __init__(self, name: str = "prompt-lookup", max_ngram: int = 3, min_ngram: int = 1) -> None:
        super().__init__(name)
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.scaffold: frozenset[int] = frozenset()

    def reset(self, prompt_ids: list[int]) -> None:
        self.scaffold = frozenset()

    def mark_scaffold(self, positions: frozenset[int]) -> None:
        self.scaffold = frozenset(positions)

    def _content(self, ids: list[int]) -> np.ndarray:
        """The context with every scaffold position replaced by its own negative stand-in: the template's
        "assistant" and newlines then neither match a query nor get copied into a draft."""
        arr = np.asarray(ids, dtype=np.int64)
        for i in self.scaffold:
            if i < len(arr):
                arr[i] = -1 - i
        return arr

    def propose(self, ids, k, s, generator):
        arr = self._content(ids)
        start = _last_match(arr, len(ids), self.max_ngram, self.min_ngram)
        if start < 0:
            return Draft([], None)
        cont = arr[start : start + k]
        stop = np.flatnonzero(cont < 0)  # a copy ends where the user's text ends
        return Draft([int(t) for t in cont[: stop[0] if stop.size else len(cont)]], None)

    def predict(self, ids, start, n, s):
        arr = self._content(ids)
        out = []
        for j in range(start, start + n):
            m = _last_match(arr, j, self.max_ngram, self.min_ngram)
            out.append(int(arr[m]) if m >= 0 and arr[m] >= 0 else -1)
        return torch.tensor(out)


class TokenRecycling(Drafter):
    """Follow the target's own top successors of each token (an adjacency table).

    The table is refreshed from every row of logits the target computes, accepted or not, so
    candidates that the target once considered are recycled later (Luo et al. 2024, as a chain).
    """

    model_free = True
    # Seeded from the target's predictions after the prompt's last 32 user tokens. Each row costs a
    # row of the LM head (576 x 49152 on the offline preset): 128 rows cost ~70 ms of the first
    # token's delay on a 2-core CPU, 32 cost ~20; the table learns from every verification afterwards.
    seed_rows = 32
    # Successors kept per token: the chain follows the first; a token tree's spare room takes the others
    # (the paper keeps a token's top-k in its adjacency matrix and drafts a static tree from it).
    width = 4

    def __init__(self, name: str = "token-recycling", vocab_size: int = 0, min_confidence: float = 0.2) -> None:
        super().__init__(name)
        self.vocab_size = vocab_size
        # Stop the chain once the product of the target's recorded probabilities falls below
        # this: each extra verified id costs a little (docs/DESIGN.md §4), so a long unlikely tail
        # costs more than it can win.
        self.min_confidence = min_confidence
        # The chain's table (what `propose` and `predict` read) learns from the chain's rows only, so that the
        # drafter replayed over a finished answer (metasd/decoding/lanes.py) predicts what it proposed live. The wide
        # table, for a tree's spare room, also learns from every other node of a token tree.
        self.table = np.full(vocab_size, -1, dtype=np.int64)
        self.conf = np.zeros(vocab_size, dtype=np.float32)
        self.wide = np.full((vocab_size, self.width), -1, dtype=np.int64)
        self.wide_conf = np.zeros((vocab_size, self.width), dtype=np.float32)

    def reset(self, prompt_ids: list[int]) -> None:
        for a, empty in ((self.table, -1), (self.conf, 0.0), (self.wide, -1), (self.wide_conf, 0.0)):
            a.fill(empty)

    def learn(self, inputs: list[int], logits: torch.Tensor, chain: bool = True) -> None:
        """Row j of `logits` is the target's prediction after token inputs[j]. chain=False: a token tree's
        other rows, for the wide table only."""
        top = torch.softmax(logits.float(), -1).topk(min(self.width, logits.shape[-1]), -1)
        idx = np.asarray(inputs, dtype=np.int64)
        ids, conf = top.indices.cpu().numpy(), top.values.cpu().numpy()
        self.wide[idx], self.wide_conf[idx] = ids, conf
        if chain:  # the chain follows the most likely successor only
            self.table[idx], self.conf[idx] = ids[:, 0], conf[:, 0]

    def propose(self, ids, k, s, generator):
        out: list[int] = []
        t, run = ids[-1], 1.0
        for _ in range(k):
            run *= float(self.conf[t])
            t = int(self.table[t])
            if t < 0 or run < self.min_confidence:
                break
            out.append(t)
        return Draft(out, None)

    def alternatives(self, ids, k, n):
        """Best first through the table: a path's chance is the product of the recorded probabilities."""

        def successors(path: tuple[int, ...], last: int):
            return [(t, c, t) for t, c in zip(self.wide[last].tolist(), self.wide_conf[last].tolist(), strict=True)
                    if t >= 0 and c > 0.0]

        return best_first(successors, ids[-1], k, n)

    def seed(self, inputs, logits):
        self.learn(inputs, logits)

    def observe(self, ids, verified):
        if verified.tree_inputs is not None:  # every node's row, then the kept chain's (its context wins)
            self.learn(verified.tree_inputs, verified.tree_logits, chain=False)
        self.learn(verified.inputs, verified.logits)

    def predict(self, ids, start, n, s):
        rows = np.asarray(ids[start - 1 : start - 1 + n], dtype=np.int64)
        return torch.from_numpy(self.table[rows].copy())


# --------------------------------------------------------------------------------------------
# Model drafters


def fit_vocab(logits: torch.Tensor, target_vocab: int, tokenizer_vocab: int) -> torch.Tensor:
    """A drafter's logits over the target's id space.

    Models sharing a tokenizer may have embedding tables of different sizes (padding rows,
    e.g. 151936 vs 152064 in the Qwen2.5 family). Only the tokenizer's ids are real tokens:
    the drafter never proposes the rest, and ids the target has but the drafter lacks get q = 0.
    """
    v = logits.shape[-1]
    if v > target_vocab:
        logits = logits[..., :target_vocab]
    elif v < target_vocab:
        pad = logits.new_full((*logits.shape[:-1], target_vocab - v), float("-inf"))
        logits = torch.cat([logits, pad], dim=-1)
    if tokenizer_vocab < target_vocab:
        logits = logits.clone()
        logits[..., tokenizer_vocab:] = float("-inf")
    return logits


def chain_steps(logits: torch.Tensor, k: int, s: Sampling, generator: torch.Generator | None, min_confidence: float,
                seen: list[torch.Tensor] | None = None
                ) -> Generator[torch.Tensor, torch.Tensor, tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """Draft up to k tokens from a model's logits, one at a time: yields each token the model must be fed
    and receives the logits after it (never for the last one: nothing needs its logits). Stops early
    when the drafter's own top probability falls below `min_confidence` (after the first token): unlikely
    tokens are rarely accepted and each costs a drafter step. Returns the tokens and, when sampling, their q rows.
    `seen`, when given, collects every logits row the chain read (one per token, and the row it stopped at)."""
    tokens: list[torch.Tensor] = []
    qs: list[torch.Tensor] = []
    for i in range(k):
        if seen is not None:
            seen.append(logits)
        x, q = sample_or_argmax(logits, s, generator)
        if i > 0 and min_confidence > 0:
            top = q.max() if q is not None else torch.softmax(logits.float(), -1).max()
            if float(top) < min_confidence:
                break
        tokens.append(x)
        if q is not None:
            qs.append(q)
        if i < k - 1:
            logits = yield x
    return tokens, qs


SIBLINGS = 3  # runner-up ids a greedy model draft offers a token tree at each position it read


def sibling_paths(tokens: list[int], rows: list[torch.Tensor], k: int, n: int, width: int = SIBLINGS
                  ) -> list[tuple[tuple[int, ...], float]]:
    """A greedy model draft's runner-ups as a token tree's extra candidates (EAGLE-2's dynamic tree, cut to
    one level off the chain): at each position j the drafter read (`rows[j]`, its logits after the chain's
    first j ids), its `width` most probable ids other than the chain's, each with the drafter's own chance of
    the whole path (the chain's first j ids, then the runner-up). The chain's own prefixes come too, so that
    the set is prefix-closed. At most n paths of at most k ids, the most probable first."""
    rows = rows[:k]
    if not rows or n <= 0:
        return []
    probs = torch.softmax(torch.stack(rows).float(), -1)
    top_p, top_x = probs.topk(min(width + 1, probs.shape[-1]), -1)
    out: list[tuple[tuple[int, ...], float]] = []
    chance = 1.0
    for j, (ps, xs) in enumerate(zip(top_p.tolist(), top_x.tolist(), strict=True)):
        head = tuple(tokens[:j])
        mine = tokens[j] if j < len(tokens) else None
        out.extend((head + (x,), chance * p) for p, x in zip(ps, xs, strict=True) if x != mine)
        if mine is None:
            break
        chance *= float(probs[j, mine])
        out.append((head + (mine,), chance))
    out.sort(key=lambda c: (-c[1], len(c[0])))  # a prefix never after its extensions
    return out[:n]


class GreedySiblings:
    """For model drafters: remember the rows of the last greedy draft, so that `alternatives` can offer its
    runner-ups. A greedy draft is a function of the context, so they are deterministic candidates, which a
    token tree may verify beside any chain; a sampled draft keeps none (its rows depend on its own draws)."""

    _drafted: tuple[int, list[int], list[torch.Tensor]] | None = None  # (len(ids), tokens, rows read)

    def keep_rows(self, ids: list[int], tokens: list[int], rows: list[torch.Tensor] | None) -> None:
        self._drafted = (len(ids), tokens, rows) if rows else None

    def alternatives(self, ids: list[int], k: int, n: int) -> list[tuple[tuple[int, ...], float]]:
        d = self._drafted
        if d is None or d[0] != len(ids):  # only right after a draft from these very ids
            return []
        return sibling_paths(d[1], d[2], k, n)


class ModelDrafter(GreedySiblings, Drafter):
    """Any causal LM that shares the target's tokenizer, with its own KV cache.

    The cache catches up lazily: when the drafter is chosen again after other drafters were
    active, it is cropped to the longest prefix it shares with the context and only the
    missing tokens are fed, in one forward call.

    With a `window`, the drafter reads at most that many tokens it has not seen: a cold cache (the
    first pull, or a catch-up longer than the window) starts afresh at the window's first token,
    at its true position. A one-layer distilled drafter predicts as well from the last 32-64
    tokens as from the whole context (measured on Spec-Bench answers), while prefilling a
    770-token RAG prompt cost it ~40 ms, about one target step, per request and drafter.
    """

    deterministic = False

    def __init__(self, name: str, model: PreTrainedModel, target_vocab: int, tokenizer_vocab: int,
                 min_confidence: float = 0.3, window: int = 0) -> None:
        super().__init__(name)
        self.model = model
        self.window = window  # 0: always the whole context
        # Stop drafting when the drafter's own top probability falls below this (after the
        # first token): unlikely tokens are rarely accepted and each costs a drafter step.
        self.min_confidence = min_confidence
        self.target_vocab, self.tokenizer_vocab = target_vocab, tokenizer_vocab
        self.device = next(model.parameters()).device
        self.model_vocab = model.get_input_embeddings().weight.shape[0]
        self.reset([])

    def reset(self, prompt_ids: list[int]) -> None:
        self._drafted = None
        self.cache = new_cache(self.model.config)
        self.cached: list[int] = []  # the token ids whose keys/values are in self.cache
        self.offset = 0  # ...which are ids[offset : offset + len(cached)] (0 unless windowed)

    # The target's hidden states this drafter reads (indices into its `hidden_states`: 0 the embeddings,
    # L the final normed state). White-box drafters (metasd/drafting/whitebox.py) ask; the engine then has every
    # target pass return them and hands over the rows it keeps.
    feature_layers: tuple[int, ...] = ()

    def take_features(self, start: int, hidden: tuple[torch.Tensor, ...], rows: int) -> None:  # noqa: B027
        """The target's hidden states at positions start .. start + rows - 1 (row j of each [1, n, d]
        tensor of `hidden` is position start + j): after prefill, and after each verification for the
        positions it kept. Positions from `start` on replace whatever the drafter held there."""

    def attach(self, target_cache: DynamicCache, ids: list[int]) -> None:
        if self.shared_layers:
            self.adopt(target_cache, ids)

    def adopt(self, target_cache: DynamicCache, ids: list[int]) -> None:
        """Take over the target's keys and values for the layers this drafter shares with it.

        A self-drafter running the target's first L layers computes exactly the target's keys
        and values in those layers, so it never needs to catch up: its cache starts as shallow
        copies of the target's layer objects (metasd/core/kvcache.py: a copy never writes into the buffers
        it shares, and the target moves to buffers of its own before writing over positions a copy holds).
        """
        cache = new_cache(self.model.config)
        for i in range(self.shared_layers):
            cache.layers[i] = copy.copy(target_cache.layers[i])
        self.cache = cache
        self.cached = list(ids[: target_cache.get_seq_length()])
        self.offset = 0

    def _part(self, tokens: list[int] | torch.Tensor, keep: int = 1) -> DraftPart:
        """The forward that feeds `tokens` after the cached ones (the caller records them in self.cached)."""
        inp = torch.as_tensor(tokens, device=self.device).view(-1)
        if self.model_vocab < self.target_vocab:
            # Ids beyond this drafter's table are padding rows a real tokenizer never produces;
            # read them as id 0 rather than fail (verification keeps the output lossless anyway).
            inp = inp.masked_fill(inp >= self.model_vocab, 0)
        return DraftPart(self.model, VerifyPart(inp, self.offset + self.cache.get_seq_length(), self.cache, keep))

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        return fit_vocab(logits, self.target_vocab, self.tokenizer_vocab)

    def _sync(self, ids: list[int], upto: int, feed_from: int, keep: int = 1
              ) -> Generator[DraftPart, torch.Tensor, torch.Tensor]:
        """Make the cache hold ids[offset:upto], feeding at least ids[feed_from:upto] (one forward, yielded).

        Returns the logits after the last `keep` fed tokens. Crops to the prefix the cache shares
        with `ids` (cheap), so only what is missing is computed; after an idle spell the catch-up
        runs the drafter's layers over every missed token (at most `window` of them when it has
        one) but its LM head only over the rows asked for.
        """
        o = self.offset
        c = 0
        limit = min(len(self.cached), feed_from - o)
        while c < limit and self.cached[c] == ids[o + c]:
            c += 1
        if self.window and (upto - (o + c) > self.window or feed_from < o):
            # Cheaper to start afresh on the last `window` tokens than to feed everything missed.
            self.reset([])
            c, self.offset = 0, max(0, min(feed_from, upto - self.window))
        if c < len(self.cached):
            crop_to(self.cache, c)
            del self.cached[c:]
        missing = ids[self.offset + c : upto]
        logits = self._fit((yield self._part(missing, keep=min(keep, len(missing)))))
        self.cached.extend(missing)
        return logits

    @torch.inference_mode()
    def propose(self, ids, k, s, generator):
        return solo(self.propose_steps(ids, k, s, generator), forward_alone)

    @torch.inference_mode()
    def propose_steps(self, ids, k, s, generator):
        self._drafted = None
        if k <= 0:
            return Draft([], None)
        logits = (yield from self._sync(ids, len(ids), len(ids) - 1, keep=1))[-1]
        rows: list[torch.Tensor] | None = [] if s.greedy else None
        chain = chain_steps(logits, k, s, generator, self.min_confidence, rows)
        try:
            x = next(chain)
            while True:
                self.cached.append(-1)  # filled in below, after one host sync for the whole draft
                x = chain.send(self._fit((yield self._part(x.view(1))))[-1])
        except StopIteration as end:
            tokens, qs = end.value
        toks = torch.stack(tokens).tolist()
        fed = len(toks) if len(toks) < k else k - 1
        self.cached[len(self.cached) - fed :] = toks[:fed]
        self.keep_rows(ids, toks, rows)
        return Draft(toks, torch.stack(qs) if qs else None)

    @torch.inference_mode()
    def predict(self, ids, start, n, s):
        # Position j is predicted by the logits after ids[j - 1].
        logits = solo(self._sync(ids, start + n - 1, start - 1, keep=n), forward_alone)[-n:]
        return logits.argmax(-1) if s.greedy else warp(logits, s)


class LayerSkipDrafter(ModelDrafter):
    """A self-drafter: the target's first layers (and its norm and head), sharing its cache."""

    def __init__(self, name: str, view: PreTrainedModel, keep: list[int], target_vocab: int, tokenizer_vocab: int) -> None:
        super().__init__(name, view, target_vocab, tokenizer_vocab)
        # Only a contiguous block from layer 0 sees exactly the target's hidden states.
        contiguous = sorted(keep) == list(range(len(keep)))
        self.shared_layers = len(keep) if contiguous else 0


def layer_skip_view(model: PreTrainedModel, keep: list[int]) -> PreTrainedModel:
    """A self-drafter: the target itself running only the decoder layers in `keep`.

    Shares every weight with the target (no extra memory). Each kept layer still indexes the
    drafter's own cache by its original layer number, which DynamicCache allows.
    """
    if 0 not in keep:
        raise ValueError("a layer-skip drafter must keep layer 0 (its cache length is read there)")
    # Shallow copies share the module dicts, so give each copy its own before swapping children:
    # otherwise the target itself would lose its layers.
    view = copy.copy(model)
    view._modules = dict(model._modules)
    inner = copy.copy(model.model)
    inner._modules = dict(model.model._modules)
    inner._modules["layers"] = torch.nn.ModuleList([model.model.layers[i] for i in sorted(keep)])
    view._modules["model"] = inner
    return view


# The built-in kinds go through the registry plugins use: kind -> factory(bundle, spec).
register_kind("prompt-lookup", lambda bundle, spec: PromptLookup(spec.name))
register_kind("token-recycling", lambda bundle, spec: TokenRecycling(spec.name, vocab_size=bundle.target_vocab))
register_kind("layer-skip", lambda bundle, spec: LayerSkipDrafter(
    spec.name, bundle.models[spec.name], list(spec.layers), bundle.target_vocab, bundle.tokenizer_vocab))
for _kind in ("model", "distilled"):
    register_kind(_kind, lambda bundle, spec: ModelDrafter(
        spec.name, bundle.models[spec.name], bundle.target_vocab, bundle.tokenizer_vocab, window=spec.window))
