"""Build the retrieval drafter's datastore: the offline target's own greedy answers to training prompts.

    PYTHONPATH=. .venv/bin/python scripts/build_datastore.py            # writes assets/datastore/offline.*

The prompts are metasd/training/train_data.py's templated code, math and chat prompts (made on the spot from a
seed, nothing downloaded). Any prompt that equals or nearly equals a Spec-Bench turn or one of the page's
examples (assets/examples.json) is dropped first, so the benchmark never retrieves its own answers.
The target answers each prompt greedily through its chat template, batched by prompt length and
left-padded, in fp32 on one torch thread; each answer (up to its EOS) is stored as uint16 token ids
followed by the separator 0xFFFF in `offline.npy`. `offline.json` records what was built and how (read
by metasd.drafting.retrieval.load_datastore to check that the datastore fits the target) and `offline.md` is its
card. `--holdout N --holdout-out FILE.npy` also answers N further prompts (another seed) into FILE, a
development set for tuning the drafter that is not part of the datastore.

`--corpus DIR` adds the answers of a corpus folder's train shards (python -m metasd.training.corpus: the
target's own greedy answers, their prompts already checked against Spec-Bench and the page's examples), and
`--base FILE.npy --prompts 0` starts from an existing datastore's answers instead of answering prompts anew:

    .venv/bin/python scripts/build_datastore.py --base assets/datastore/offline.npy --prompts 0 \
        --corpus data/corpus --out /tmp/store/offline.npy
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import re
import shlex
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SEPARATOR = 0xFFFF  # after every answer; no token id of the offline target reaches it
FORMAT = "metasd-datastore-1"
DEFAULT_SHARES = {"chat": 0.4, "code": 0.3, "math": 0.3}


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _shingles(text: str, n: int = 3) -> set[tuple[str, ...]]:
    w = _words(text)
    return {tuple(w[i : i + n]) for i in range(max(1, len(w) - n + 1))} if w else set()


class NearMatch:
    """Flags a prompt equal to a reference text up to case, spacing and punctuation, or sharing at least
    `containment` of the smaller one's word 3-grams with it (an edited copy)."""

    def __init__(self, references: list[str], containment: float = 0.5) -> None:
        self.exact = {" ".join(_words(r)) for r in references}
        self.refs = [_shingles(r) for r in references]
        self.index: dict[tuple[str, ...], list[int]] = {}
        for i, s in enumerate(self.refs):
            for g in s:
                self.index.setdefault(g, []).append(i)
        self.containment = containment

    def __call__(self, text: str) -> bool:
        if " ".join(_words(text)) in self.exact:
            return True
        mine = _shingles(text)
        shared: dict[int, int] = {}
        for g in mine:
            for i in self.index.get(g, ()):
                shared[i] = shared.get(i, 0) + 1
        return any(c / max(1, min(len(mine), len(self.refs[i]))) >= self.containment for i, c in shared.items())


def reference_prompts(specbench: Path, examples: Path) -> list[str]:
    from metasd.training.train_data import benchmark_prompts

    refs = sorted(benchmark_prompts(specbench))
    if examples.exists():
        for ex in json.loads(examples.read_text(encoding="utf-8")):
            refs.extend(t for t in ex.get("turns", []) if isinstance(t, str))
    return refs


def pick_prompts(total: int, seed: int, near: NearMatch, exclude: set[str] = frozenset()) -> tuple[list[tuple[str, str]], int]:
    """(domain, prompt) pairs, `total` in all split by DEFAULT_SHARES, and how many near matches were dropped."""
    from metasd.training.train_data import domain_prompts

    out: list[tuple[str, str]] = []
    dropped = 0
    domains = list(DEFAULT_SHARES)
    for j, d in enumerate(domains):
        want = total - sum(round(total * DEFAULT_SHARES[x]) for x in domains[:-1]) if j == len(domains) - 1 \
            else round(total * DEFAULT_SHARES[d])
        got: list[str] = []
        ask, dropped_d = want, 0
        while want and len(got) < want and ask < 8 * want + 64:
            cand = domain_prompts(d, ask, seed)
            got = []
            dropped_d = 0
            for p in cand:
                if p in exclude:
                    continue
                if near(p):
                    dropped_d += 1
                    continue
                got.append(p)
            ask = ask * 2 if len(got) < want else ask
        dropped += dropped_d
        out.extend((d, p) for p in got[:want])
    return out, dropped


def answer(bundle, prompts: list[str], max_new_tokens: int, batch_size: int, desc: str) -> list[list[int]]:
    """The target's greedy answers (ids, up to and including EOS), batched by length and left-padded."""
    import torch
    from torch.nn.utils.rnn import pad_sequence
    from tqdm import tqdm

    from metasd.decoding.engine import encode_prompt

    enc = [encode_prompt(bundle, p, True) for p in prompts]
    order = sorted(range(len(enc)), key=lambda i: len(enc[i]))
    eos = bundle.eos_ids
    pad = bundle.tokenizer.pad_token_id if bundle.tokenizer.pad_token_id is not None else min(eos or {0})
    answers: list[list[int]] = [[] for _ in enc]
    made = 0
    with tqdm(total=len(enc), desc=desc, unit="prompt", dynamic_ncols=True, file=sys.stderr) as bar, torch.inference_mode():
        for b in range(0, len(order), batch_size):
            idx = order[b : b + batch_size]
            rows = [torch.tensor(enc[i]) for i in idx]
            inp = pad_sequence(rows, batch_first=True, padding_value=pad, padding_side="left")
            mask = pad_sequence([torch.ones_like(r) for r in rows], batch_first=True, padding_side="left")
            width = inp.shape[1]
            out = bundle.target.generate(inp, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                                         eos_token_id=sorted(eos) or None, pad_token_id=pad)
            for r, i in enumerate(idx):
                ids = out[r, width:].tolist()
                end = next((j + 1 for j, t in enumerate(ids) if t in eos), len(ids))
                answers[i] = ids[:end]
                made += end
            bar.update(len(idx))
            bar.set_postfix(tokens=made)
    return answers


def pack(answers: list[list[int]]) -> np.ndarray:
    flat: list[int] = []
    for a in answers:
        flat.extend(a)
        flat.append(SEPARATOR)
    arr = np.asarray(flat, dtype=np.int64)
    if arr.size and int(arr[arr != SEPARATOR].max(initial=0)) >= SEPARATOR:
        raise ValueError("a token id does not fit uint16 below the separator")
    return arr.astype(np.uint16)


def unpack(arr: np.ndarray) -> list[list[int]]:
    """A datastore's answers, each without its separator."""
    ends = np.flatnonzero(arr == SEPARATOR)
    starts = np.concatenate(([0], ends[:-1] + 1))
    return [arr[s:e].astype(np.int64).tolist() for s, e in zip(starts, ends, strict=True)]


def corpus_answers(folder: Path) -> dict[str, list[list[int]]]:
    """The answers of a corpus folder's finished train shards, by domain."""
    from metasd.training.corpus import DOMAINS, iter_corpus

    out = {d: [answer for _, answer in iter_corpus(folder, domain=d, split="train")] for d in DOMAINS}
    return {d: answers for d, answers in out.items() if answers}


def write_card(meta: dict, path: Path) -> None:
    dom = ", ".join(f"{n} {d}" for d, n in meta["domains"].items())
    lines = [
        "# Retrieval datastore: offline preset", "",
        f"Token ids of {meta['target']}'s own greedy answers to {meta['documents']:,} training prompts "
        f"({dom}; metasd/training/train_data.py's templates, seed {meta['seed']}"
        + (f"; {meta['corpus']['answers']:,} of them from the corpus {meta['corpus']['dir']}, its train shards"
           if meta.get("corpus") else "") + "), read by the `retrieval` drafter (metasd/drafting/retrieval.py).", "",
        "## File", "",
        f"- `{meta['file']}`: {meta['bytes']:,} bytes, sha256 `{meta['sha256']}`",
        f"- {meta['tokens']:,} answer tokens (EOS included where the answer ended) in {meta['documents']:,} answers, "
        f"uint16, each answer followed by the separator {SEPARATOR} ({meta['tokens'] + meta['documents']:,} values)",
        f"- target vocabulary {meta['target_vocab']:,} ids (tokenizer {meta['tokenizer_vocab']:,}); EOS ids {meta['eos_ids']}",
        "", "## How it was made", "",
        f"- prompts: {meta['prompts_considered']:,} considered, {meta['dropped_near_matches']} dropped as equal or near "
        "(at least half the word 3-grams of the shorter text shared) to a Spec-Bench turn or an example of the page "
        "(assets/examples.json)",
        f"- answers: greedy, through the chat template, at most {meta['max_new_tokens']} new tokens, batches of "
        f"{meta['batch_size']} prompts of similar length, left-padded, fp32, {meta['torch_threads']} torch thread(s); "
        "batching can round a near-tie differently from one-prompt greedy decoding, which only changes what the "
        "drafter may propose, never the output (the target verifies every draft)",
        f"- {meta['seconds']:.0f} s on {meta['machine']}, {meta['created']}",
        f"- command: `{meta['command']}`",
    ]
    if meta.get("development_prompts"):
        lines.append(f"- `--holdout`: {meta['development_prompts']} further prompts (seed {meta['seed'] + 1000}) were answered "
                     "into a separate development set for tuning the drafter; they are not in this datastore")
    lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "assets" / "datastore" / "offline.npy"))
    ap.add_argument("--prompts", type=int, default=960, help="training prompts the target answers (all domains)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (one leaves the other core free)")
    ap.add_argument("--specbench", default=str(ROOT.parent / "shared" / "specbench" / "question.jsonl"))
    ap.add_argument("--holdout", type=int, default=0, help="further prompts (seed + 1000) for a development set")
    ap.add_argument("--holdout-out", help="where the development set's ids go (.npy, same format)")
    ap.add_argument("--base", help="start from this datastore's answers (.npy; its .json beside it)")
    ap.add_argument("--corpus", help="also store the answers of this corpus folder's train shards")
    a = ap.parse_args(argv)
    import platform

    import torch

    from metasd.decoding.loading import load_bundle

    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    near = NearMatch(reference_prompts(Path(a.specbench), ROOT / "assets" / "examples.json"))
    chosen, dropped = pick_prompts(a.prompts, a.seed, near)
    print(f"[datastore] {len(chosen)} prompts ({dropped} near matches of benchmark prompts dropped)", file=sys.stderr)
    bundle = load_bundle("offline")
    answers = answer(bundle, [p for _, p in chosen], a.max_new_tokens, a.batch_size, "target answers") if chosen else []
    base = json.loads(Path(a.base).with_suffix(".json").read_text(encoding="utf-8")) if a.base else {}
    if a.base:
        answers = unpack(np.load(a.base, allow_pickle=False)) + answers
    corpus = corpus_answers(Path(a.corpus)) if a.corpus else {}
    for rows in corpus.values():
        answers += rows
    arr = pack(answers)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, arr)
    data = out.read_bytes()
    domains: dict[str, int] = dict(base.get("domains", {}))
    for d, _ in chosen:
        domains[d] = domains.get(d, 0) + 1
    for d, rows in corpus.items():
        domains[d] = domains.get(d, 0) + len(rows)
    meta = {
        "format": FORMAT, "file": out.name, "target": bundle.preset.target, "preset": bundle.preset.name,
        "target_vocab": bundle.target_vocab, "tokenizer_vocab": bundle.tokenizer_vocab, "eos_ids": sorted(bundle.eos_ids),
        "separator": SEPARATOR, "documents": len(answers), "tokens": int(sum(len(x) for x in answers)),
        "domains": domains, "seed": a.seed,
        "prompts_considered": len(chosen) + dropped + base.get("prompts_considered", 0),
        "dropped_near_matches": dropped + base.get("dropped_near_matches", 0),
        "corpus": {"dir": a.corpus, "answers": sum(map(len, corpus.values())),
                   "tokens": sum(len(r) for rows in corpus.values() for r in rows)} if a.corpus else None,
        "base": {"file": a.base, "sha256": base.get("sha256"), "documents": base.get("documents")} if a.base else None,
        "max_new_tokens": a.max_new_tokens, "batch_size": a.batch_size, "torch_threads": a.threads,
        "seconds": round(time.perf_counter() - t0, 1), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
        "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()} CPU, torch {torch.__version__}",
        "development_prompts": a.holdout if a.holdout_out else 0,
        "command": "PYTHONPATH=. .venv/bin/python scripts/build_datastore.py "
                   + shlex.join(argv if argv is not None else sys.argv[1:]),
    }
    out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    write_card(meta, out.with_suffix(".md"))
    print(f"[datastore] {meta['tokens']:,} tokens in {meta['documents']} answers, {len(data):,} bytes, "
          f"{meta['seconds']:.0f} s -> {out}", file=sys.stderr)
    if a.holdout and a.holdout_out:
        taken = {p for _, p in chosen}
        dev, _ = pick_prompts(a.holdout, a.seed + 1000, near, exclude=taken)
        dev_answers = answer(bundle, [p for _, p in dev], a.max_new_tokens, a.batch_size, "development answers")
        np.save(a.holdout_out, pack(dev_answers))
        Path(a.holdout_out).with_suffix(".prompts.json").write_text(json.dumps(dev, indent=0), encoding="utf-8")
        print(f"[datastore] development set: {len(dev_answers)} answers -> {a.holdout_out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
