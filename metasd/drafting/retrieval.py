"""A model-free retrieval drafter: the longest earlier match of the context's suffix, continued by frequency.

Two sources are searched for the longest suffix of the context (never past a scaffold position):

- the live context, i.e. the prompt and the answer so far, through an index that grows with the answer
  (each token's earlier positions; the longest match is found by extending those backwards);
- a datastore of text the target itself generated (its greedy answers to training prompts,
  scripts/build_datastore.py), through a suffix array searched by binary search.

This follows REST (He et al., NAACL 2024: exact longest-suffix retrieval from a datastore through a
suffix array, the retrieved continuations weighted by how often they occur) and SuffixDecoding (Oliaro et
al., 2024: one structure over the current request's prompt and output, one over earlier outputs; a
continuation scored by its empirical frequency, the count of a child over the count of its parent;
speculation that grows with the matched length, at most alpha x match length tokens, and, in its released
implementation, stops below a minimum probability). Like SAM-Decoding (Hu et al., 2024, suffix automata
over the live text and a static corpus) it uses the exact longest match rather than a fixed n-gram.
Where this departs from them:

- verification here is a chain, so instead of a speculation tree the drafter proposes the single most
  frequent path (greedy descent of the continuation tree), while its estimated probability, the product
  of count(child) / (count(parent) + prior / match length), stays at or above `min_prob`: the pseudo-count
  brings the match length into the estimate, which a bare count ratio ignores (a continuation seen once
  would be certain);
- the live context always comes first: the datastore is searched only when the context has no match of
  the minimum length or its continuation is too unlikely to propose, rather than scoring both and keeping
  the better (the live text is the more specific evidence);
- the datastore is a suffix array over fixed-width big-endian token bytes (so that byte order is token
  order and Python's bisect compares whole patterns in C) rather than a suffix tree or automaton, and the
  live context is indexed by token positions rather than a per-request suffix tree: both are O(match)
  to query in practice and cheap to build in Python.

The chat template's scaffolding (positions given to `mark_scaffold`) is never matched and never copied:
those positions hold unique negative stand-ins, as in PromptLookup. The datastore holds answers only.
"""

from __future__ import annotations

import json
import math
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from metasd import paths
from metasd.drafting.drafters import Draft, Drafter, best_first
from metasd.drafting.registry import register_drafter, register_kind

SEPARATOR = 0xFFFF  # ends every document of a datastore; never a token id
DATASTORE_DIR = paths.DATASTORE_DIR
DEFAULT_NAME = "retrieval"


# --------------------------------------------------------------------------------------------
# The datastore: a suffix array over the documents' token ids


def suffix_order(values: np.ndarray, depth: int) -> np.ndarray:
    """Positions of `values` sorted by the `depth` values starting at each (ties in an arbitrary fixed order).

    Prefix doubling: ranks of 1-, 2-, 4-, ... value windows, each round one lexsort of (rank, rank h later).
    Windows that run past the end compare as if padded with -1; callers pad `values` so that the first
    `depth` values of every position they look up lie inside the array.
    """
    n = len(values)
    rank = values.astype(np.int64)
    h = 1
    order = np.argsort(rank, kind="stable")
    while h < depth:
        later = np.full(n, -1, dtype=np.int64)
        later[: n - h] = rank[h:]
        order = np.lexsort((later, rank))
        a, b = rank[order], later[order]
        new = np.empty(n, dtype=bool)
        new[0] = True
        new[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.cumsum(new) - 1
        h *= 2
        if new.all():
            break
    return order


class Datastore:
    """Documents of token ids, each ended by SEPARATOR, indexed for exact longest-suffix retrieval.

    Read-only once built, so one object serves every request (and thread). `depth` bounds match length
    plus continuation length: the suffix array is sorted by that many tokens.
    """

    def __init__(self, tokens: Sequence[int] | np.ndarray, depth: int = 64, meta: dict[str, Any] | None = None) -> None:
        arr = np.asarray(tokens, dtype=np.int64).ravel()
        if arr.size and (arr.min() < 0 or arr.max() > SEPARATOR):
            raise ValueError("datastore token ids must lie in [0, 0xFFFF] (0xFFFF separates documents)")
        if arr.size and arr[-1] != SEPARATOR:
            arr = np.append(arr, SEPARATOR)
        self.meta = dict(meta or {})
        self.depth = depth
        self.size = int(arr.size)
        self.documents = int((arr == SEPARATOR).sum())
        self.tokens = self.size - self.documents
        # Padding: every window of `depth` values from a real position stays inside the array.
        self.values = np.concatenate([arr, np.full(depth, SEPARATOR, dtype=np.int64)])
        self.bytes = self.values.astype(">u2").tobytes()  # big-endian: byte order is token order
        order = suffix_order(self.values, depth)
        starts = order[(order < self.size) & (self.values[order] != SEPARATOR)]
        self.sa = array("q", starts.astype(np.int64).tobytes())  # for bisect (fast int indexing)
        self.sa_np = np.frombuffer(self.sa, dtype=np.int64) if len(self.sa) else np.zeros(0, dtype=np.int64)

    @classmethod
    def load(cls, path: str | Path, depth: int = 64) -> Datastore:
        """A datastore file: .npy of uint16 ids with separators, and its .json record beside it where present."""
        path = Path(path)
        meta_path = path.with_suffix(".json")
        meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else {}
        return cls(np.load(path, allow_pickle=False), depth=depth, meta=meta)

    def __len__(self) -> int:
        return self.tokens

    def _key(self, width: int):
        buf = self.bytes
        return lambda i: buf[2 * i : 2 * i + width]

    def _first(self, pat: bytes) -> int:
        """The first suffix-array index whose suffix starts with the bytes `pat`, or -1."""
        key = self._key(len(pat))
        lo = bisect_left(self.sa, pat, key=key)
        return lo if lo < len(self.sa) and key(self.sa[lo]) == pat else -1

    def find(self, pattern: Sequence[int]) -> tuple[int, int]:
        """The suffix-array range [lo, hi) of positions where `pattern` occurs (empty: lo == hi)."""
        pat = np.asarray(pattern, dtype=">u2").tobytes()
        lo = self._first(pat)
        if lo < 0:
            return 0, 0
        return lo, bisect_right(self.sa, pat, lo, key=self._key(len(pat)))

    def longest_match(self, suffix: Sequence[int], max_len: int) -> tuple[int, int, int]:
        """(m, lo, hi): the longest m <= max_len such that suffix[-m:] occurs, and its range (m = 0: none).

        An occurrence of a suffix implies occurrences of all its shorter suffixes, so m is found by a
        binary search over lengths, each probe one search of the suffix array.
        """
        top = min(max_len, len(suffix), self.depth - 1)
        pat = np.asarray(suffix[len(suffix) - top :], dtype=">u2").tobytes()
        best = 0
        lo_m, hi_m = 1, top
        while lo_m <= hi_m:
            mid = (lo_m + hi_m) // 2
            if self._first(pat[2 * (top - mid) :]) >= 0:
                best, lo_m = mid, mid + 1
            else:
                hi_m = mid - 1
        if not best:
            return 0, 0, 0
        lo, hi = self.find(suffix[len(suffix) - best :])
        return best, lo, hi

    def next_counts(self, lo: int, hi: int, offset: int) -> tuple[list[int], list[int], list[int]]:
        """For the range [lo, hi) (whose suffixes agree on their first `offset` tokens): the distinct values at
        `offset` in sorted order, where each one's run starts in the suffix array, and how many suffixes it holds."""
        if hi - lo <= 32:
            vals = [int(self.values[self.sa[i] + offset]) for i in range(lo, hi)]
            starts = [0, *(j for j in range(1, len(vals)) if vals[j] != vals[j - 1])]
            firsts = [vals[j] for j in starts]
        else:
            arr = self.values[self.sa_np[lo:hi] + offset]
            st = np.concatenate(([0], np.nonzero(arr[1:] != arr[:-1])[0] + 1))
            starts, firsts = st.tolist(), arr[st].tolist()
        ends = [*starts[1:], hi - lo]
        return firsts, [lo + a for a in starts], [b - a for a, b in zip(starts, ends, strict=True)]


_cache: dict[str, Datastore | None] = {}
_cache_lock = threading.Lock()


def load_datastore(path: str | Path | None = None) -> Datastore | None:
    """The datastore at `path` (default assets/datastore/offline.npy), built once per process; None if absent."""
    p = Path(path) if path is not None else DATASTORE_DIR / "offline.npy"
    key = str(p.resolve())
    with _cache_lock:
        if key not in _cache:
            _cache[key] = Datastore.load(p) if p.exists() else None
        return _cache[key]


def datastore_for(bundle: Any, path: str | Path | None = None) -> Datastore | None:
    """The datastore made by this bundle's target, or None (absent, or made by another model)."""
    ds = load_datastore(path)
    if ds is None:
        return None
    meta = ds.meta
    target = getattr(getattr(bundle, "preset", None), "target", None)
    if meta.get("target") != target or int(meta.get("target_vocab", -1)) != int(getattr(bundle, "target_vocab", -2)):
        return None
    return ds


# --------------------------------------------------------------------------------------------
# The drafter


class RetrievalDrafter(Drafter):
    """Longest-suffix retrieval from the live context, then a datastore; the most frequent continuation.

    Draft-length rule (per round): nothing unless the longest match has at least `min_match` tokens (live
    context) or `min_match_store` (datastore); otherwise follow the most frequent continuation while the
    product of count(child) / (count(parent) + prior / m) stays >= `min_prob`, and for at most
    ceil(`spec_factor` x m) tokens (and k), m being the match length. The pseudo-count prior / m makes a
    continuation seen once after a long match nearly certain, and one seen once after a short match doubtful.
    """

    model_free = True

    # Defaults chosen on development answers (templated prompts outside the datastore, and Spec-Bench prompts
    # 4-5 of each category, never the measured ones) by simulating the engine's rounds: the simulated
    # speed-up hardly moves across spec_factor 1-4, prior 0-1 and min_prob 0.2-0.5; min_prob 0.5 and datastore
    # matches of 3+ tokens keep the drafts it makes precise, which matters when a bandit chooses among arms.
    def __init__(self, name: str = DEFAULT_NAME, datastore: Datastore | None = None, *, min_match: int = 1,
                 min_match_store: int = 3, max_match: int = 32, spec_factor: float = 2.0, min_prob: float = 0.5,
                 prior: float = 0.5) -> None:
        super().__init__(name)
        self.datastore = datastore
        self.min_match, self.min_match_store, self.max_match = min_match, min_match_store, max_match
        self.spec_factor, self.min_prob, self.prior = spec_factor, min_prob, prior
        self.scaffold: frozenset[int] = frozenset()
        self.source = ""  # where the last proposal came from: "context", "datastore" or ""
        self._clear()

    # -- per-request state: the live index --------------------------------------------------

    def _clear(self) -> None:
        self._raw: list[int] = []  # the context as given
        self._ids: list[int] = []  # the same, scaffold positions replaced by -1 - position
        self._post: dict[int, list[int]] = {}  # token -> its positions p with a known successor (p < len - 1)
        self._barrier = -1  # the latest scaffold position

    def reset(self, prompt_ids: list[int]) -> None:
        self.scaffold = frozenset()
        self._clear()

    def mark_scaffold(self, positions: frozenset[int]) -> None:
        self.scaffold = frozenset(positions)
        self._clear()  # rebuilt lazily, with the scaffold masked

    def _sync(self, ids: Sequence[int], upto: int) -> None:
        """Index ids[:upto], appending what is new. Within a request the context only grows (the engine's
        contract); a context that is shorter or differs in the last tokens indexed is indexed afresh."""
        n = len(self._raw)
        back = max(0, n - 16)
        if upto < n or self._raw[back:] != list(ids[back:n]):
            self._clear()
            n = 0
        raw, masked, post, scaffold = self._raw, self._ids, self._post, self.scaffold
        for i in range(n, upto):
            t = int(ids[i])
            raw.append(t)
            if i in scaffold:
                masked.append(-1 - i)
                self._barrier = i
            else:
                masked.append(t)
            prev = i - 1
            if prev >= 0 and masked[prev] >= 0:
                post.setdefault(masked[prev], []).append(prev)

    # -- matching ---------------------------------------------------------------------------

    def _suffix(self) -> list[int]:
        """The context's last tokens after the latest scaffold position (at most max_match), and after any id a
        datastore cannot hold (>= SEPARATOR: another tokenizer's)."""
        suffix = self._ids[max(self._barrier + 1, len(self._ids) - self.max_match) :]
        for j in range(len(suffix) - 1, -1, -1):
            if suffix[j] >= SEPARATOR:
                return suffix[j + 1 :]
        return suffix

    def context_match(self) -> tuple[int, list[int]]:
        """(m, ends): the longest m such that the context's last m tokens occurred earlier, and the last
        positions p of those earlier occurrences (their continuation starts at p + 1)."""
        ids = self._ids
        n = len(ids)
        if not n or ids[-1] < 0:
            return 0, []
        alive = self._post.get(ids[-1], [])
        if not alive:
            return 0, []
        limit = min(self.max_match, n - 1 - self._barrier)
        m = 1
        while m < limit:
            t = ids[n - 1 - m]
            longer = [p for p in alive if p >= m and ids[p - m] == t]
            if not longer:
                break
            alive, m = longer, m + 1
        return m, list(alive)

    def _context_chain(self, m: int, ends: list[int], k: int) -> list[int]:
        ids = self._ids
        out: list[int] = []
        run = 1.0
        for d in range(1, k + 1):
            seq_len = len(ids)
            # The continuation may run into the draft itself (a repeat that overlaps its source).
            nxt = [ids[p + d] if p + d < seq_len else out[p + d - seq_len] for p in ends]
            counts: dict[int, int] = {}
            for t in nxt:
                counts[t] = counts.get(t, 0) + 1
            # Most frequent proposable token; ties go to the latest occurrence (ends are in position order).
            best, best_c = -1, 0
            for t in reversed(nxt):
                c = counts[t]
                if t >= 0 and c > best_c:
                    best, best_c = t, c
            if best < 0:
                break
            run *= best_c / (len(ends) + self.prior / m)
            if run < self.min_prob:
                break
            out.append(best)
            ends = [p for p, t in zip(ends, nxt, strict=True) if t == best]
        return out

    def _store_chain(self, m: int, lo: int, hi: int, k: int) -> list[int]:
        ds = self.datastore
        assert ds is not None
        out: list[int] = []
        run = 1.0
        for d in range(k):
            if m + d >= ds.depth:
                break
            vals, starts, counts = ds.next_counts(lo, hi, m + d)
            j = -1  # the most frequent value that is not the end of a document; ties: the smallest id
            for i, (v, c) in enumerate(zip(vals, counts, strict=True)):
                if v != SEPARATOR and (j < 0 or c > counts[j]):
                    j = i
            if j < 0:
                break
            run *= counts[j] / (hi - lo + self.prior / m)
            if run < self.min_prob:
                break
            out.append(vals[j])
            lo, hi = starts[j], starts[j] + counts[j]
        return out

    def _draft(self, k: int) -> list[int]:
        if k <= 0:
            return []
        self.source = ""
        m, ends = self.context_match()
        if m >= self.min_match:
            out = self._context_chain(m, ends, min(k, math.ceil(self.spec_factor * m)))
            if out:
                self.source = "context"
                return out
        if self.datastore is not None:
            suffix = self._suffix()
            if suffix:
                m, lo, hi = self.datastore.longest_match(suffix, self.max_match)
                if m >= self.min_match_store:
                    out = self._store_chain(m, lo, hi, min(k, math.ceil(self.spec_factor * m)))
                    if out:
                        self.source = "datastore"
                        return out
        return []

    # -- the Drafter interface ----------------------------------------------------------------

    def propose(self, ids, k, s, generator):
        self._sync(ids, len(ids))
        return Draft(self._draft(k), None)

    def alternatives(self, ids, k, n):
        """The continuation trees themselves, best first (the chance of a path is the product of its count
        ratios, as for the chain): the live context's and the datastore's, each when its match is long enough."""
        self._sync(ids, len(ids))
        out = []
        m, ends = self.context_match()
        if m >= self.min_match:
            out += best_first(lambda path, ps: self._context_children(path, ps, m), list(ends), k, n)
        suffix = self._suffix() if self.datastore is not None else []
        if suffix:
            ms, lo, hi = self.datastore.longest_match(suffix, self.max_match)
            if ms >= self.min_match_store:
                out += best_first(lambda path, st: self._store_children(st, ms), (lo, hi, ms), k, n)
        return out

    def _context_children(self, path: tuple[int, ...], ends: list[int], m: int) -> list[tuple[int, float, list[int]]]:
        """The ids that followed the matched occurrences `ends` after `path`, each with its count ratio and the
        occurrences that continue with it (a repeat may run into the path itself, as in _context_chain)."""
        ids, seq = self._ids, len(self._ids)
        groups: dict[int, list[int]] = {}
        for p in ends:
            j = p + len(path) + 1
            t = ids[j] if j < seq else path[j - seq]
            if t >= 0:
                groups.setdefault(t, []).append(p)
        total = len(ends) + self.prior / m
        return [(t, len(g) / total, g) for t, g in groups.items()]

    def _store_children(self, state: tuple[int, int, int], m: int) -> list[tuple[int, float, tuple[int, int, int]]]:
        """The datastore's next ids for the suffix-array range [lo, hi) at `offset`, with count ratios."""
        lo, hi, offset = state
        ds = self.datastore
        if ds is None or offset >= ds.depth:
            return []
        vals, starts, counts = ds.next_counts(lo, hi, offset)
        total = hi - lo + self.prior / m
        return [(v, c / total, (a, a + c, offset + 1)) for v, a, c in zip(vals, starts, counts, strict=True)
                if v != SEPARATOR]

    def observe(self, ids, verified):
        self._sync(ids, len(ids))  # index the emitted tokens now rather than in the next round's draft

    def predict(self, ids, start, n, s):
        out = []
        for j in range(start, start + n):
            self._sync(ids, j)
            d = self._draft(1)
            out.append(d[0] if d else -1)
        return torch.tensor(out, dtype=torch.long)


def make_retrieval(bundle: Any, name: str = DEFAULT_NAME, path: str | Path | None = None, **params: Any) -> RetrievalDrafter:
    """A fresh drafter for one request of `bundle`, with the datastore its target made (if there is one)."""
    return RetrievalDrafter(name, datastore_for(bundle, path), **params)


def register(name: str = DEFAULT_NAME, path: str | Path | None = None, **params: Any) -> None:
    """Make `name` a drafter of every bundle (metasd.drafting.registry); the preset's own spec, if any, takes precedence."""
    def make(bundle: Any) -> RetrievalDrafter:
        return make_retrieval(bundle, name, path, **params)

    register_drafter(name, make, kind="model-free",
                     description="longest suffix match in the prompt, the answer so far and the target's own past "
                                 "answers; drafts the most frequent continuation while it is likely")


register_kind("retrieval", lambda bundle, spec: make_retrieval(bundle, spec.name))
