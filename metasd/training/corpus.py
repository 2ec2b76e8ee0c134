"""The specialists' data: the target's own answers to prompts of the paper's domains, in shards.

    python -m metasd.training.corpus --out data/corpus --hours 2 --workers 2   # unattended; rerun to resume

Shard i is one domain (`DOMAINS[i % 6]`) and its prompts come from seed i, so any machine rebuilds
the same prompts and a rerun skips the shards already on disk: a stop loses at most the shard in
progress. Each shard is `shard-NNNNN.npz` (token ids, uint16 where the vocabulary fits) beside a
`shard-NNNNN.json` that says how it was made (prompts' sources and licences, generation settings,
time, tokens per second); `manifest.json` sums them. Every sixteenth round of shards is held out
(`split: eval`) for the drafters' held-out agreement.

No prompt may be a Spec-Bench prompt or a page example, nor share a run of `HELD_OUT_NGRAM` words
with one (`HeldOut`): the speed-ups we report are measured on those.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from metasd.paths import EXAMPLES_FILE
from metasd.training import sources
from metasd.training.chat_tasks import CHAT_PROMPTS_VERSION, chat_task
from metasd.training.train_data import (
    CODE_PROMPTS_VERSION,
    MATH_PROMPTS_VERSION,
    SPECBENCH,
    chat_prompts,
    code_prompts,
    math_prompts,
)

DOMAINS = ("code", "math", "translation", "summarization", "qa", "chat")
FORMAT = "metasd-corpus-1"
HELD_OUT_NGRAM = 8
EVAL_EVERY = 16  # rounds of shards; round 1 of every 16 is held out
OWN = "own templates (this repository, Apache-2.0)"
# The version of a domain's prompt makers, recorded in each shard: a shard keeps the prompts it was made from,
# so a folder may hold shards of an earlier version (their json says which).
PROMPTS_VERSION = {"code": CODE_PROMPTS_VERSION, "math": MATH_PROMPTS_VERSION, "chat": CHAT_PROMPTS_VERSION}


@dataclass(frozen=True)
class Prompt:
    text: str
    source: str  # "templates", "man:...", "pydoc:...", "stdlib"
    licence: str


# ---------------------------------------------------------------------------------------------- held out


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


class HeldOut:
    """The prompts we measure on (Spec-Bench's turns and the page's examples): a training prompt equal
    to one, or sharing any run of `n` words with one, is refused."""

    def __init__(self, texts: list[str], n: int = HELD_OUT_NGRAM):
        self.n = n
        self.exact = {" ".join(_words(t)) for t in texts}
        self.grams = {g for t in texts for g in self._grams(t)}

    def _grams(self, text: str) -> set[tuple[str, ...]]:
        w = _words(text)
        return {tuple(w[i : i + self.n]) for i in range(len(w) - self.n + 1)}

    def hits(self, text: str) -> bool:
        return " ".join(_words(text)) in self.exact or not self.grams.isdisjoint(self._grams(text))

    @classmethod
    def default(cls, specbench: Path = SPECBENCH, examples: Path = EXAMPLES_FILE) -> HeldOut:
        texts: list[str] = []
        for path in (specbench, examples):
            if not path.exists():
                continue
            raw = path.read_text(encoding="utf-8")
            rows = json.loads(raw) if raw.lstrip().startswith("[") else [json.loads(ln) for ln in raw.splitlines() if ln]
            for row in rows:
                texts += [t for t in row.get("turns", []) if isinstance(t, str)]
        return cls(texts)


# ---------------------------------------------------------------------------------------------- prompts

TRANSLATE_DE = ["Translate into English: {s}", "Translate this German sentence into English: {s}",
                "What does this German text mean in English?\n\n{s}", "Translate German to English:\n{s}",
                "Please translate the following into English.\n\n{s}"]
TRANSLATE_EN = ["Translate into {lang}: {s}", "How would you say this in {lang}? {s}",
                "Translate the following English text into {lang}:\n\n{s}"]
LANGS = ["French", "German", "Spanish", "Italian", "Portuguese"]
SUMMARIZE = ["Summarize the following text in {k} sentences:\n\n{t}", "Write a short summary of this text.\n\n{t}",
             "Summarize in one paragraph:\n\n{t}", "What are the key points of the text below? Answer briefly.\n\n{t}",
             "{t}\n\nSummarize the text above for a beginner.", "Give a one-sentence summary:\n\n{t}"]
QUESTIONS = ["According to the passage, what does {title} do?", "What is the main point of the passage?",
             "Which options or settings does the passage mention, and what do they do?",
             "Explain the passage in simple words.", "What would a beginner need to know from this passage?",
             "Based only on the passage, what happens by default?", "List the facts the passage states."]
RAG = ["Answer the question using the passage below.\n\nPassage: {t}\n\nQuestion: {q}",
       "Read the documentation and answer.\n\n{t}\n\n{q}", "Context:\n{t}\n\nQuestion: {q}\nAnswer:",
       "{q}\n\nUse this text:\n{t}"]
ROLEPLAY = ["Pretend you are {who}. Describe your day.", "You are {who}. Give advice to someone {act}.",
            "Act as {who} and answer: what is the best part of your job?",
            "Imagine you are {who} explaining {topic} to a visitor.",
            "Write a dialogue between {who} and a student about {topic}."]
WHO = ["a museum guide", "a ship captain", "a chef", "a librarian", "a park ranger", "a detective", "a teacher",
       "a robot", "a medieval knight", "an astronaut", "a travel agent", "a gardener", "a personal trainer"]


def _passage(rng: random.Random, families: list[list[Path]], max_chars: int = 1400) -> sources.Passage | None:
    """A passage of real documentation: a man page or one of Python's documentation topics."""
    if families and rng.random() < 0.7:
        p = sources.man_passage(rng, families, max_chars=max_chars)
        if p is not None:
            return p
    return sources.pydoc_passage(rng, max_chars=max_chars)


def _gather(n: int, tries: int, make: Callable[[], Prompt | None]) -> list[Prompt]:
    """Up to n prompts from `make`, called at most `tries` times (it returns None where its source had nothing)."""
    out: list[Prompt] = []
    for _ in range(tries):
        if len(out) >= n:
            break
        p = make()
        if p is not None:
            out.append(p)
    return out


def translation_prompts(rng: random.Random, n: int, en: list[list[Path]], de: list[list[Path]]) -> list[Prompt]:
    def one() -> Prompt | None:
        german = bool(de) and rng.random() < 0.6
        p = sources.man_passage(rng, de) if german else _passage(rng, en)
        sents = sources.sentences(p.text) if p is not None else []
        if not sents:
            return None
        k = rng.choice([1, 1, 2, 3])
        i = rng.randrange(len(sents))
        s = " ".join(sents[i : i + k])
        t = (rng.choice(TRANSLATE_DE).format(s=s) if german
             else rng.choice(TRANSLATE_EN).format(lang=rng.choice(LANGS), s=s))
        return Prompt(t, p.source, p.licence)

    return _gather(n, n * 4, one)


def summarization_prompts(rng: random.Random, n: int, en: list[list[Path]]) -> list[Prompt]:
    def one() -> Prompt | None:
        p = _passage(rng, en, max_chars=rng.choice([600, 1000, 1600]))
        if p is None:
            return None
        return Prompt(rng.choice(SUMMARIZE).format(k=rng.choice(["two", "three"]), t=p.text), p.source, p.licence)

    return _gather(n, n * 3, one)


def qa_prompts(rng: random.Random, n: int, en: list[list[Path]]) -> list[Prompt]:
    def one() -> Prompt | None:
        if rng.random() < 0.25:  # closed-book questions, as in Spec-Bench's qa
            return Prompt(chat_prompts(rng, 1)[0], "templates", OWN)
        p = _passage(rng, en, max_chars=rng.choice([500, 900, 1300]))
        if p is None:
            return None
        q = rng.choice(QUESTIONS).format(title=p.title)
        return Prompt(rng.choice(RAG).format(t=p.text, q=q), p.source, p.licence)

    return _gather(n, n * 3, one)


def roleplay_prompts(rng: random.Random, n: int) -> list[str]:
    from metasd.training.train_data import ACTIVITIES, TOPICS
    return [rng.choice(ROLEPLAY).format(who=rng.choice(WHO), act=rng.choice(ACTIVITIES), topic=rng.choice(TOPICS))
            for _ in range(n)]


def domain_prompts(domain: str, seed: int, n: int) -> list[Prompt]:
    """n prompts of one domain from seed (not yet checked against the held-out prompts)."""
    rng = random.Random(f"corpus:{domain}:{seed}")
    if domain == "code":
        return [Prompt(t, "templates+stdlib", f"{OWN}; {sources.PSF}") for t in code_prompts(rng, n)]
    if domain == "math":
        return [Prompt(t, "templates", OWN) for t in math_prompts(rng, n)]
    if domain == "chat":  # versions 2-3: three in four composed (chat_tasks.py), the rest version 1's templates
        k = n // 4
        texts = [chat_task(rng) for _ in range(n - k)] + chat_prompts(rng, k - k // 3) + roleplay_prompts(rng, k // 3)
        rng.shuffle(texts)
        return [Prompt(t, "templates", OWN) for t in texts]
    en = sources.man_families(sources.man_pages())
    if domain == "translation":
        return translation_prompts(rng, n, en, sources.man_families(sources.man_pages("de")))
    if domain == "summarization":
        return summarization_prompts(rng, n, en)
    if domain == "qa":
        return qa_prompts(rng, n, en)
    raise ValueError(f"unknown domain {domain!r}; one of {', '.join(DOMAINS)}")


def shard_plan(i: int) -> tuple[str, str]:
    """(domain, split) of shard i: domains in turn, one round of shards in EVAL_EVERY held out."""
    rnd = i // len(DOMAINS)
    return DOMAINS[i % len(DOMAINS)], ("eval" if rnd % EVAL_EVERY == 1 else "train")


# ---------------------------------------------------------------------------------------------- generation


def encode(tokenizer, text: str, max_prompt_tokens: int) -> list[int] | None:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    ids = list(ids)
    return ids if len(ids) <= max_prompt_tokens else None


def answers(target, prompts: list[list[int]], max_new_tokens: int, eos_ids: set[int], pad_id: int,
            batch_size: int) -> list[list[int]]:
    """The target's greedy answers, many at a time: prompts sorted by length, left-padded, batched `generate`."""
    import torch

    from metasd.training.common import left_pad

    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[list[int]] = [[] for _ in prompts]
    eos = sorted(eos_ids) or None
    dev = next(target.parameters()).device
    with torch.inference_mode():
        for b0 in range(0, len(order), batch_size):
            idx = order[b0 : b0 + batch_size]
            inp, mask = left_pad([prompts[i] for i in idx], pad_id)
            width = inp.shape[1]
            seq = target.generate(inp.to(dev), attention_mask=mask.to(dev), do_sample=False,
                                  max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad_id)[:, width:]
            for r, i in enumerate(idx):
                ans = seq[r].tolist()
                cut = next((j + 1 for j, t in enumerate(ans) if t in eos_ids), len(ans))
                out[i] = ans[:cut]
    return out


# ---------------------------------------------------------------------------------------------- shards


def shard_path(out: Path, i: int, ext: str) -> Path:
    return out / f"shard-{i:05d}.{ext}"


def done_shards(out: Path) -> list[int]:
    """Shards complete on disk (the .json is written last, so a shard without it is not done)."""
    nums = (int(p.stem.split("-")[1]) for p in out.glob("shard-*.json"))
    return sorted(i for i in nums if shard_path(out, i, "npz").exists())


def write_shard(out: Path, i: int, rows: list[tuple[list[int], list[int]]], info: dict) -> None:
    flat = [t for p, a in rows for t in p + a]
    dtype = np.uint16 if max(flat, default=0) < 2**16 else np.uint32
    lens = np.array([[len(p), len(a)] for p, a in rows], dtype=np.int32).reshape(-1, 2)
    tmp = shard_path(out, i, "tmp.npz")
    np.savez(tmp, ids=np.array(flat, dtype=dtype), lengths=lens)
    os.replace(tmp, shard_path(out, i, "npz"))
    tmp_json = shard_path(out, i, "json.tmp")
    tmp_json.write_text(json.dumps(info, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp_json, shard_path(out, i, "json"))


def read_shard(out: Path, i: int) -> list[tuple[list[int], list[int]]]:
    with np.load(shard_path(out, i, "npz")) as z:
        ids, lens = z["ids"].astype(np.int64), z["lengths"]
    rows, pos = [], 0
    for lp, la in lens.tolist():
        rows.append((ids[pos : pos + lp].tolist(), ids[pos + lp : pos + lp + la].tolist()))
        pos += lp + la
    return rows


def shard_infos(out: str | Path) -> Iterator[tuple[int, dict]]:
    """(number, record) of every finished shard of a folder, in order: the one walk over the shards' json."""
    out = Path(out)
    for i in done_shards(out):
        yield i, json.loads(shard_path(out, i, "json").read_text(encoding="utf-8"))


def iter_corpus(out: str | Path, domain: str | None = None, split: str | None = None
                ) -> Iterator[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) of every finished shard of a domain and split."""
    for i, info in shard_infos(out):
        if (domain is None or info["domain"] == domain) and (split is None or info["split"] == split):
            yield from read_shard(Path(out), i)


def corpus_data(a: argparse.Namespace, target: Any) -> tuple[list, list, float, dict]:
    """The drafter's domains of a corpus folder (`--corpus`): its train shards for training, its eval shards
    held out. Also returned: the target's seconds that made those shards, and what the drafter's file records of
    them (`shards_summary`), both read from the very shards loaded, so that a corpus run adding shards to the
    folder during training changes neither."""
    from metasd.training.common import CORPUS_DOMAINS, corpus_examples

    domains = CORPUS_DOMAINS[a.domain]
    first = getattr(a, "shards_from", 0)  # a piece may train on the shards added since the piece before
    # In the order of the drafter's domains, then of the shards (as the rows have always been read).
    shards = sorted(((i, info) for i, info in shard_infos(a.corpus) if info["domain"] in domains and i >= first),
                    key=lambda s: (domains.index(s[1]["domain"]), s[0]))
    rows: dict[str, list] = {"train": [], "eval": []}
    for i, info in shards:
        rows[info["split"]] += read_shard(Path(a.corpus), i)
    if not rows["train"]:
        raise SystemExit(f"{a.corpus} has no finished train shards of {', '.join(domains)}"
                         + (f" numbered {first} or more" if first else ""))
    if first and not rows["eval"]:  # a piece's held-out agreement needs held-out shards of its own range
        raise SystemExit(f"{a.corpus} has no held-out shards of {', '.join(domains)} numbered {first} or more; "
                         "choose a lower --shards-from")
    random.Random(a.seed).shuffle(rows["eval"])
    score = getattr(a, "kind", "distilled") != "white-box"  # a head's features pass scores the rows itself
    train_ex = corpus_examples(target, rows["train"], topk=a.topk, desc=f"{a.domain}: target on the corpus", score=score)
    eval_ex = corpus_examples(target, rows["eval"][: a.eval_prompts], topk=a.topk, desc=f"{a.domain}: held out",
                              score=score)
    secs = sum(info["seconds"] for _, info in shards)
    return train_ex, eval_ex, float(secs), shards_summary([info for _, info in shards], first)


def shards_summary(infos: list[dict], first: int = 0) -> dict:
    """What a drafter's file records of the shards it trained on: counts of train and eval shards, answers, and
    shards per prompts version (a folder may hold several); `first`, where the piece read only shards from it on."""
    c: Counter = Counter()
    versions: Counter = Counter()
    domains: Counter = Counter()
    for info in infos:
        c.update({f"{info['split']}_shards": 1, "answers": info["answers"]})
        versions[str(info.get("prompts_version", 1))] += 1
        domains[info["domain"]] += 1
    return {"train_shards": c["train_shards"], "eval_shards": c["eval_shards"], "answers": c["answers"],
            "prompts_versions": dict(sorted(versions.items())), "domains": dict(sorted(domains.items())),
            **({"first_shard": first} if first else {})}


def write_manifest(out: Path) -> dict:
    shards = [info for _, info in shard_infos(out)]
    by: dict[str, Counter] = {}
    for s in shards:
        c = by.setdefault(f"{s['domain']}/{s['split']}", Counter())
        c.update(shards=1, answers=s["answers"], answer_tokens=s["answer_tokens"], prompt_tokens=s["prompt_tokens"])
    licences = sorted({lic for s in shards for lic in s["licences"]})
    man = {"format": FORMAT, "shards": len(shards), "answer_tokens": sum(s["answer_tokens"] for s in shards),
           "generation_seconds": round(sum(s["seconds"] for s in shards), 1),
           "by_domain": {k: dict(v) for k, v in sorted(by.items())}, "licences": licences,
           "settings": shards[-1]["settings"] if shards else {}}
    tmp = out / f"manifest.json.{os.getpid()}.tmp"  # two runs may share a folder (`--only` splits the work)
    tmp.write_text(json.dumps(man, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out / "manifest.json")
    return man


def make_shard(i: int, bundle, a: argparse.Namespace, held: HeldOut) -> tuple[list, dict]:
    domain, split = shard_plan(i)
    t0 = time.perf_counter()
    prompts = domain_prompts(domain, i, a.prompts_per_shard)
    kept = [p for p in prompts if not held.hits(p.text)]
    encoded = [(p, encode(bundle.tokenizer, p.text, a.max_prompt_tokens)) for p in kept]
    encoded = [(p, ids) for p, ids in encoded if ids is not None]
    pad = bundle.tokenizer.pad_token_id if bundle.tokenizer.pad_token_id is not None else 0
    outs = answers(bundle.target, [ids for _, ids in encoded], a.max_new_tokens, bundle.eos_ids, pad, a.batch)
    secs = time.perf_counter() - t0
    rows = [(ids, ans) for (_, ids), ans in zip(encoded, outs, strict=True) if ans]
    ntok = sum(len(x) for _, x in rows)
    info = {"format": FORMAT, "shard": i, "domain": domain, "split": split, "seed": i,
            "prompts": len(prompts), "prompts_version": PROMPTS_VERSION.get(domain, 1),
            "held_out_dropped": len(prompts) - len(kept),
            "too_long_dropped": len(kept) - len(encoded), "answers": len(rows),
            "prompt_tokens": sum(len(p) for p, _ in rows), "answer_tokens": ntok,
            "seconds": round(secs, 1), "answer_tokens_per_s": round(ntok / max(secs, 1e-9), 1),
            "sources": dict(Counter(p.source.split(":")[0] for p, _ in encoded)),
            "licences": sorted({p.licence for p, _ in encoded}),
            "settings": {"target": bundle.preset.target, "greedy": True, "chat_template": True,
                         "max_new_tokens": a.max_new_tokens, "max_prompt_tokens": a.max_prompt_tokens,
                         "batch": a.batch, "threads": a.threads, "generator": "transformers generate, batched"},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    return rows, info


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m metasd.training.corpus", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="data/corpus", help="shard folder (created; rerun with the same folder to resume)")
    ap.add_argument("--shards", type=int, default=600, help="stop when this many shards exist")
    ap.add_argument("--hours", type=float, default=0.0, help="stop starting new shards after this long (0: no limit)")
    ap.add_argument("--prompts-per-shard", type=int, default=48)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--max-prompt-tokens", type=int, default=640)
    ap.add_argument("--batch", type=int, default=16, help="answers generated together (measured: docs/BENCHMARKS.md)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each worker")
    ap.add_argument("--workers", type=int, default=1,
                    help="processes making shards side by side, each with --threads (2 x 1 on a 2-core CPU: "
                    "docs/BENCHMARKS.md); they split the shards to make and share the folder")
    ap.add_argument("--tag", default="", help=argparse.SUPPRESS)  # a worker's name in its progress lines
    ap.add_argument("--only", default="", help="comma-separated shard numbers to make (tests, repairs)")
    ap.add_argument("--domains", default="", help=f"comma-separated domains ({', '.join(DOMAINS)}): make only the "
                    "shards the plan gives them (the others stay to make later); default: every domain")
    return ap


def wanted_shards(a: argparse.Namespace) -> list[int]:
    """The shard numbers a run is to have: `--only`, or the first `--shards`, kept to `--domains`' shards."""
    wanted = [int(x) for x in a.only.split(",") if x] if a.only else list(range(a.shards))
    domains = [d.strip() for d in a.domains.split(",") if d.strip()]
    if unknown := sorted(set(domains) - set(DOMAINS)):
        raise SystemExit(f"unknown domain(s) {', '.join(unknown)}; one of {', '.join(DOMAINS)}")
    if domains:  # a domain's shards keep their numbers (and so their prompts and split): gaps are filled later
        wanted = [i for i in wanted if shard_plan(i)[0] in domains]
    return wanted


def run_workers(a: argparse.Namespace, argv: list[str], todo: list[int]) -> int:
    """`--workers N`: N processes of this command, each making every Nth shard still to make (`--only`)."""
    import subprocess

    parts = [todo[w :: a.workers] for w in range(a.workers)]
    own = ("--workers", "--only", "--tag")  # set per worker below; every other option passes through
    base: list[str] = []
    args = iter(argv)
    for x in args:
        if x in own:
            next(args, None)  # and its value
        elif not x.startswith(tuple(f"{o}=" for o in own)):
            base.append(x)
    procs = [subprocess.Popen([sys.executable, "-m", "metasd.training.corpus", *base, "--workers", "1",
                               "--only", ",".join(map(str, part)), "--tag", f"{w + 1}/{a.workers}"])
             for w, part in enumerate(parts) if part]
    try:
        return max(p.wait() for p in procs)
    except KeyboardInterrupt:  # a stop ends every worker; each loses at most the shard it was making
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        return 130


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.workers < 1 or a.threads < 1:
        ap.error("--workers and --threads must be at least 1")
    import torch

    from metasd.decoding.loading import load_bundle
    from metasd.models.presets import get_preset

    torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = wanted_shards(a)
    have = set(done_shards(out))
    todo = [i for i in wanted if i not in have]
    who = f"[corpus {a.tag}]" if a.tag else "[corpus]"
    log = lambda m: print(m.replace("[corpus]", who, 1), file=sys.stderr, flush=True)  # noqa: E731
    log(f"[corpus] {out}: {len(have)} shards done, {len(todo)} to make"
        + (f" by {a.workers} workers of {a.threads} thread(s)" if a.workers > 1 and todo else ""))
    if not todo:
        write_manifest(out)
        return 0
    if a.workers > 1:
        return run_workers(a, argv, todo)
    preset = get_preset("offline")
    bundle = load_bundle(dataclasses.replace(preset, drafters=()), progress=log)
    held = HeldOut.default()
    t_start = time.perf_counter()
    made_tok = 0
    for n, i in enumerate(todo):
        if a.hours and time.perf_counter() - t_start > a.hours * 3600:
            log(f"[corpus] {a.hours} h reached; rerun to continue")
            break
        rows, info = make_shard(i, bundle, a, held)
        write_shard(out, i, rows, info)
        man = write_manifest(out)
        made_tok += info["answer_tokens"]
        el = time.perf_counter() - t_start
        rate = made_tok / el
        eta = el / (n + 1) * (len(todo) - n - 1)
        have.add(i)  # of this run's wanted shards (the folder may hold other domains' too: the manifest counts all)
        log(f"[corpus] shard {i} {info['domain']}/{info['split']}: {info['answers']} answers, "
            f"{info['answer_tokens']} tokens in {info['seconds']:.0f} s ({info['answer_tokens_per_s']:.0f} tok/s); "
            f"{len(have & set(wanted))}/{len(wanted)} shards, {man['answer_tokens']:,} tokens in the folder; "
            f"{rate:.0f} tok/s this run, ETA {time.strftime('%H:%M:%S', time.gmtime(eta))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
