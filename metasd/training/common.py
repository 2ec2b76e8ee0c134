"""Training pieces shared by the distilled drafters (train.py) and the white-box heads (train_whitebox.py).

The data: the target's greedy answers to templated prompts of a domain, with its top-k next-token
log-probabilities at every answer token (on-policy distillation; metasd/training/train_data.py), cached in
`--data-cache`; the draft vocabulary a head keeps; and the optimiser loop both kinds train with.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedModel

from metasd.training.train_data import domain_prompts, stdlib_chunks


@dataclass
class Example:
    """One training sequence and the target's top-k next-token distributions on part of it.

    Row j of top_ids/top_logp is the target's prediction after ids[start + j], i.e. for the token
    at position start + j + 1.
    """

    ids: list[int]
    start: int
    # None until scored: a white-box head's features pass scores corpus rows in the same target pass.
    top_ids: torch.Tensor | None  # [n, k] int64
    top_logp: torch.Tensor | None  # [n, k] float32: log-probabilities under the full softmax

    @property
    def labels(self) -> int:
        return self.top_ids.shape[0] if self.top_ids is not None else max(0, len(self.ids) - 1 - self.start)


def topk_logp(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(logits.float(), dim=-1)
    v, i = logp.topk(min(k, logp.shape[-1]), dim=-1)
    return i, v


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of different lengths as one batch for `generate`: (ids, attention mask), padded on the left."""
    width = max(len(r) for r in rows)
    inp = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(inp)
    for i, r in enumerate(rows):
        inp[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return inp, mask


def length_batches(seqs: list[list[int]], batch_size: int, desc: str) -> Iterator[tuple[list[int], torch.Tensor]]:
    """Batches of sequences of similar length for a teacher-forced pass, with progress: each batch's indices into
    `seqs` and its ids, right-padded with 0 (causal attention never looks ahead, so a row's real positions see
    no padding). Padded to its longest row, a batch in corpus order costs more: scoring 2,428 math answers on
    one thread took 28 min sorted, against 37 projected unsorted."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    for b0 in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch", dynamic_ncols=True, file=sys.stderr):
        idx = order[b0 : b0 + batch_size]
        inp = torch.zeros((len(idx), max(len(seqs[i]) for i in idx)), dtype=torch.long)
        for r, i in enumerate(idx):
            inp[r, : len(seqs[i])] = torch.tensor(seqs[i])
        yield idx, inp


@torch.inference_mode()
def answer_examples(target: PreTrainedModel, prompts: list[list[int]], max_new_tokens: int, eos_ids: set[int],
                    pad_id: int = 0, batch_size: int = 16, topk: int = 16, desc: str = "target answers") -> list[Example]:
    """The target's greedy answers to `prompts` (ids), with its logits at every answer token.

    Prompts are batched by length and left-padded; the logits that `generate` returns are the ones
    the target used to choose each token, so no second pass is needed.
    """
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[Example | None] = [None] * len(prompts)
    dev = next(target.parameters()).device
    eos = sorted(eos_ids) or None
    bar = tqdm(total=len(prompts), desc=desc, unit="prompt", dynamic_ncols=True, file=sys.stderr)
    for b0 in range(0, len(order), batch_size):
        idx = order[b0 : b0 + batch_size]
        inp, mask = left_pad([prompts[i] for i in idx], pad_id)
        width = inp.shape[1]
        gen = target.generate(inp.to(dev), attention_mask=mask.to(dev), do_sample=False, max_new_tokens=max_new_tokens,
                              eos_token_id=eos, pad_token_id=pad_id, output_logits=True, return_dict_in_generate=True)
        seq = gen.sequences[:, width:].cpu()
        logits = torch.stack(gen.logits, dim=1).cpu()  # [B, T, V]
        for r, i in enumerate(idx):
            ans = seq[r].tolist()
            cut = next((j + 1 for j, t in enumerate(ans) if t in eos_ids), len(ans))
            ans = ans[:cut]
            ti, tv = topk_logp(logits[r, :cut], topk)
            out[i] = Example(list(prompts[i]) + ans, len(prompts[i]) - 1, ti, tv)
        bar.update(len(idx))
        bar.set_postfix(tokens=sum(e.labels for e in out if e is not None))
    bar.close()
    return [e for e in out if e is not None]


@torch.inference_mode()
def teacher_forced(target: PreTrainedModel, rows: list[tuple[list[int], int]], batch_size: int = 8, topk: int = 16,
                   desc: str = "target on text") -> list[Example]:
    """(ids, start) rows scored by one right-padded target pass per batch: an Example each, labelled with the
    target's top-k at every position from `start` to the last but one."""
    dev = next(target.parameters()).device
    out: list[Example | None] = [None] * len(rows)
    for idx, inp in length_batches([s for s, _ in rows], batch_size, desc):
        logits = target(input_ids=inp.to(dev)).logits
        for r, i in enumerate(idx):
            s, start = rows[i]
            ti, tv = topk_logp(logits[r, start : len(s) - 1].cpu(), topk)
            out[i] = Example(list(s), start, ti, tv)
    return out  # type: ignore[return-value]


def text_examples(target: PreTrainedModel, sequences: list[list[int]], batch_size: int = 8, topk: int = 16,
                  desc: str = "target on text") -> list[Example]:
    """Plain text (e.g. standard-library source) scored by one forward pass of the target."""
    return teacher_forced(target, [(list(s), 0) for s in sequences], batch_size, topk, desc)


# The corpus's domains (metasd/training/corpus.py) each drafter learns from: the chat drafter speaks for
# the answers in prose (chat, QA and RAG, summaries, translations); code and math keep their own.
CORPUS_DOMAINS = {"code": ("code",), "math": ("math",), "chat": ("chat", "qa", "summarization", "translation")}


def corpus_examples(target: PreTrainedModel, rows: list[tuple[list[int], list[int]]], batch_size: int = 8,
                    topk: int = 16, max_len: int = 512, desc: str = "target on the corpus",
                    score: bool = True) -> list[Example]:
    """(prompt ids, answer ids) pairs of the corpus as examples: the target's top-k next-token distributions at
    every answer token, teacher-forced (the shards keep ids only). The row after the prompt's last id predicts
    the answer's first. `score=False` leaves them unscored, for a caller whose own target pass scores them
    (`train_whitebox.with_features`: one pass for features and labels instead of two)."""
    kept = [((p + a)[:max_len], len(p) - 1) for p, a in rows if a and len(p) < max_len]
    if not score:
        return [Example(list(s), start, None, None) for s, start in kept]
    return teacher_forced(target, kept, batch_size, topk, desc)


def draft_vocabulary(examples: list[Example], size: int, vocab_size: int) -> torch.Tensor:
    """The `size` ids a drafter's head keeps (DraftHead): the domain's most likely next tokens.

    Ranked by their expected count under the target on the training data (the sum of its top-k
    probabilities over every labelled position), then filled up in id order: a BPE tokenizer
    numbers its merges by frequency in its own training corpus, so low ids are common tokens.
    """
    size = min(size, vocab_size)
    mass = torch.zeros(vocab_size)
    for e in examples:
        mass.index_add_(0, e.top_ids.reshape(-1), e.top_logp.exp().reshape(-1))
    seen = int((mass > 0).sum())
    ranked = mass.argsort(descending=True, stable=True)[: min(seen, size)]
    chosen = torch.zeros(vocab_size, dtype=torch.bool)
    chosen[ranked] = True
    fill = (~chosen).nonzero().view(-1)[: size - ranked.numel()]
    chosen[fill] = True
    return chosen.nonzero().view(-1)


def cpu_has_fast_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AMX tiles or AVX-512 BF16): there autocast training
    runs about twice as fast (docs/BENCHMARKS.md, *Training in bfloat16*); elsewhere bf16 is emulated, slower."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
    flags = {f for line in cpuinfo.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}
    return bool(flags & {"amx_bf16", "avx512_bf16"})


def use_bf16(choice: str, device: torch.device) -> bool:
    """`--bf16 auto|on|off`: auto is on for a GPU and for a CPU with bf16 in hardware."""
    if choice in ("on", "off"):
        return choice == "on"
    return device.type == "cuda" or (device.type == "cpu" and cpu_has_fast_bf16())


def fit(params: list[torch.nn.Parameter], batch_loss: Callable[[], tuple[torch.Tensor, torch.Tensor]], steps: int,
        lr: float, warmup: int = 20, budget_s: float = 0.0, desc: str = "train", bf16: bool = False) -> dict:
    """AdamW over `params` for `steps` steps (or until `budget_s` seconds have passed, where given), with a
    linear warm-up then a cosine down to a tenth of `lr`; `batch_loss()` draws a batch and returns its loss
    and per-label top-1 agreement. With `bf16` the forward pass runs under bfloat16 autocast (the weights,
    their gradients and the optimiser stay float32, so what ships is trained as usual, only its matrix
    products rounded). Returns the run's record (steps done, time, first/final loss, agreement)."""
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    device_type = params[0].device.type if params else "cpu"

    def lr_at(step: int, elapsed: float) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        t = (step - warmup) / max(1, steps - warmup)
        if budget_s:  # a time budget that ends the run early still ends it on the low learning rate
            t = max(t, elapsed / budget_s)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))

    history: list[tuple[float, float]] = []
    t0 = time.perf_counter()
    bar = tqdm(range(steps), desc=desc, unit="step", dynamic_ncols=True, file=sys.stderr)
    for step in bar:
        elapsed = time.perf_counter() - t0
        if budget_s and elapsed > budget_s:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, elapsed)
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
            loss, agree = batch_loss()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        history.append((loss.item(), agree.mean().item() if agree.numel() else 0.0))
        recent = history[-20:]
        bar.set_postfix(loss=f"{sum(x for x, _ in recent) / len(recent):.3f}",
                        agree=f"{sum(a for _, a in recent) / len(recent):.3f}")
    bar.close()
    tail = history[-max(1, min(50, len(history) // 5)) :]
    return {"steps": len(history), "train_seconds": round(time.perf_counter() - t0, 1),
            "first_loss": round(history[0][0], 4) if history else None,
            "final_loss": round(sum(x for x, _ in tail) / len(tail), 4) if tail else None,
            "final_train_agreement": round(sum(a for _, a in tail) / len(tail), 4) if tail else None,
            "bf16_autocast": bf16}


def encode_chat(tokenizer, prompts: list[str]) -> list[list[int]]:
    out = []
    for p in prompts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        out.append(list(ids))
    return out


def build_examples(target, tokenizer, domain: str, prompts: int, max_new_tokens: int, seed: int,
                   text_chunks: int = 0, batch_size: int = 16, topk: int = 16, exclude: int = 0,
                   exclude_seed: int = 0) -> list[Example]:
    """The domain's training data: the target's answers to its prompts (+ stdlib text for code).

    `exclude`: leave out the `exclude` training prompts of `exclude_seed`, for held-out data.
    """
    texts = domain_prompts(domain, prompts + exclude, seed)
    if exclude:
        train_set = set(domain_prompts(domain, exclude, exclude_seed))
        texts = [t for t in texts if t not in train_set][:prompts]
    eos = target.generation_config.eos_token_id
    eos_ids = set(eos) if isinstance(eos, list | tuple) else ({int(eos)} if eos is not None else set())
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ex = answer_examples(target, encode_chat(tokenizer, texts), max_new_tokens, eos_ids, pad, batch_size, topk,
                         desc=f"{domain}: target answers")
    if text_chunks:
        chunks = stdlib_chunks(random.Random(f"text:{seed}"), text_chunks)
        seqs = [tokenizer(c, add_special_tokens=False)["input_ids"][:256] for c in chunks]
        ex += text_examples(target, seqs, topk=topk, desc=f"{domain}: target on stdlib text")
    return ex


def domain_data(a: argparse.Namespace, bundle, chunks: int) -> tuple[list[Example], list[Example], float]:
    """The domain's training and held-out examples, from `--data-cache` where it exists (else generated,
    and saved there). Returns (train, eval, seconds the target took to generate them)."""
    target, tok = bundle.target, bundle.tokenizer
    cache = Path(a.data_cache) if a.data_cache else None
    if cache is not None and cache.exists():
        data = torch.load(cache, weights_only=True)
        train_ex, eval_ex = ([Example(**e) for e in data[k]] for k in ("train", "eval"))
        return train_ex, eval_ex, data["seconds"]
    t0 = time.perf_counter()
    # Held-out prompts come from another seed, so they never appear in training.
    train_ex = build_examples(target, tok, a.domain, a.prompts, a.max_new_tokens, a.seed, chunks, a.gen_batch, a.topk)
    eval_ex = build_examples(target, tok, a.domain, a.eval_prompts, a.max_new_tokens, a.seed + 1000, 0,
                             a.gen_batch, a.topk, exclude=a.prompts, exclude_seed=a.seed)
    gen_s = time.perf_counter() - t0
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"train": [vars(e) for e in train_ex], "eval": [vars(e) for e in eval_ex], "seconds": gen_s}, cache)
    return train_ex, eval_ex, gen_s


def piece_record(info: dict) -> dict:
    """This run's entry in a file's `pieces`: its data, steps, time and held-out agreement at its start and end
    (a list per draft position for a head, one figure for a distilled drafter)."""
    def agreement(key: str, flat: str) -> list[float] | None:
        v = info.get(key, {}).get("agreement") if key in info else info.get(flat)
        return None if v is None else [v] if isinstance(v, float | int) else list(v)
    keys = ("steps", "train_seconds", "batch_size", "lr", "bf16_autocast", "corpus", "corpus_shards", "prompts",
            "text_chunks", "train_sequences", "train_labels", "eval_sequences")
    return {**{k: info.get(k) for k in keys}, "agreement_before": agreement("eval_before", "eval_agreement_before"),
            "agreement": agreement("eval", "eval_agreement"), "finished": time.strftime("%Y-%m-%d", time.gmtime())}


def earlier_pieces(earlier: dict) -> list[dict]:
    """The pieces of a file being resumed. A file written before pieces were recorded gives what it kept: its
    last run, and the steps of the runs before that summed into one entry."""
    if not earlier:
        return []
    if "pieces" in earlier:
        return list(earlier["pieces"])
    before = earlier.get("earlier", {})
    last = {k: v for k, v in piece_record(earlier).items() if k != "finished"}
    return ([{"steps": before["steps"], "summed": True}] if before.get("steps") else []) + [last]


def autocast_note(info: dict) -> str:
    """The card's words for a run whose forward passes ran under bfloat16 autocast ('' otherwise)."""
    return ", forward passes under bfloat16 autocast" if info.get("bf16_autocast") else ""


def reproduce_line(info: dict) -> str:
    """A card's last line: where its commands are, and for a file trained in pieces how they chain."""
    resumed = len(info.get("pieces") or []) > 1 or bool(info.get("earlier"))
    return ("Reproduce: see the commands in assets/drafters/README.md"
            + (" (a resumed file: the first piece, then each `--resume`)." if resumed else "."))


def pieces_lines(info: dict, what: str) -> list[str]:
    """A card's lines on the pieces a resumed file was trained in (none for a file trained in one run)."""
    lines: list[str] = []
    pieces = info.get("pieces") or []
    if len(pieces) > 1:
        total = sum(p.get("steps") or 0 for p in pieces)
        lines.append(f"- the last of {len(pieces)} pieces (`--resume`), {total:,} steps in all; \"at initialisation\" "
                     "below is this piece's start. Each piece's held-out set is its own data's, so its figures "
                     "compare within a row:")
        lines += ["", "| piece | finished | data | steps | batch, lr | seconds | held-out agreement, start -> end |",
                  "|---|---|---|---:|---|---:|---|"]
        for n, p in enumerate(pieces, 1):
            if p.get("summed"):
                lines.append(f"| {n} | | earlier pieces, not recorded one by one | {p['steps']:,} | | | |")
                continue
            data = p.get("note") or (f"corpus `{p['corpus']}`{shards_note(p)}" if p.get("corpus")
                                     else f"{p.get('prompts')} templated prompts" if p.get("prompts") else "")
            if p.get("text_chunks"):
                data += f" and {p['text_chunks']} chunks of source"
            if p.get("train_labels"):
                data += f", {p['train_sequences']} sequences, {p['train_labels']:,} positions"
            agree = " -> ".join("/".join(f"{x:.3f}" for x in a) for a in (p.get("agreement_before"), p.get("agreement")) if a)
            lines.append(f"| {n} | {p.get('finished') or ''} | {data} | {p.get('steps') or 0:,} | {p.get('batch_size')}, "
                         f"{p.get('lr')}{', bf16' if p.get('bf16_autocast') else ''} | {p.get('train_seconds')} | {agree} |")
        lines.append("")
    elif info.get("earlier"):  # a file resumed before pieces were recorded kept only its last run's start
        lines.append(f"- continued (`--resume`) from the same {what} after {info['earlier']['steps']} earlier steps "
                     f"({info['earlier'].get('train_seconds')} s in its last run); \"at initialisation\" below is this "
                     "run's start")
    return lines


def shards_note(info: dict) -> str:
    """' (38 train and 2 eval shards, 2,556 answers; prompts version 2: 37 shards, ...)' from a record's
    `corpus_shards` (metasd.training.corpus.shards_summary); '' where the record predates it."""
    c = info.get("corpus_shards")
    if not c:
        return ""
    versions = ", ".join(f"prompts version {v}: {n} shard{'s' if n != 1 else ''}" for v, n in c["prompts_versions"].items())
    since = f" numbered {c['first_shard']} and up" if c.get("first_shard") else ""
    return (f" ({c['train_shards']} train and {c['eval_shards']} eval shards{since}, {c['answers']:,} answers; "
            f"{versions})")


def corpus_line(info: dict) -> str:
    """A card's data line for a drafter trained on a corpus folder ('' for one trained on generated data)."""
    if not info.get("corpus"):
        return ""
    # The domains whose shards it read where the record says (older records: every domain the drafter reads).
    read = (info.get("corpus_shards") or {}).get("domains") or CORPUS_DOMAINS.get(info.get("domain", ""), ())
    return (f"- the {', '.join(read)} shards of the corpus `{info['corpus']}`"
            f"{shards_note(info)} (metasd/training/corpus.py: templates, man pages and Python's documentation, none a "
            "Spec-Bench prompt or page example; its manifest has the sources and licences), the target's greedy answers")
