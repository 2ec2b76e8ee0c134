"""Distil small domain drafters from the offline target (SmolLM2-135M-Instruct), on a CPU.

    python -m metasd.training.train --domain math --out assets/drafters/math-drafter.safetensors

A drafter is a one-layer Llama decoder of the target's width: it reads the target's frozen
embedding table and writes through the target's frozen LM head restricted to a draft vocabulary
(`--draft-vocab`, the 4096 ids the target uses most on the domain's data: the full head would
cost twice the layer), so only its own layer and final norm are trained and shipped (about 7 MB
in fp16, plus the vocabulary's ids). It starts as a copy of one of the target's layers
(`--init-layer`) and learns the target's next-token distributions on the target's own answers
to templated prompts of its domain (on-policy distillation, metasd/training/train_data.py):

1. data: the target answers the prompts greedily, batched, through the chat template; the logits
   it computed for every answer token are kept as soft labels (top-k log-probabilities);
2. training: soft cross-entropy from those top-k distributions (renormalised over the draft
   vocabulary) to the drafter's softmax over the draft vocabulary, AdamW, cosine schedule;
3. the drafter is scored by top-1 agreement with the target on held-out answers, after a
   round trip through the fp16 file it is saved to.

Every function takes the target model (and ids, not text), so the tests run it on a tiny random
Llama in seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm
from transformers import LlamaForCausalLM, PreTrainedModel

from metasd.models.loading import (
    DISTILLED_FORMAT,
    DRAFT_VOCAB,
    DraftHead,
    build_distilled,
    distilled_config,
    drafter_config_json,
    load_distilled,
)


@dataclass
class Example:
    """One training sequence and the target's top-k next-token distributions on part of it.

    Row j of top_ids/top_logp is the target's prediction after ids[start + j], i.e. for the token
    at position start + j + 1.
    """

    ids: list[int]
    start: int
    top_ids: torch.Tensor  # [n, k] int64
    top_logp: torch.Tensor  # [n, k] float32: log-probabilities under the full softmax

    @property
    def labels(self) -> int:
        return self.top_ids.shape[0]


def _topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(logits.float(), dim=-1)
    v, i = logp.topk(min(k, logp.shape[-1]), dim=-1)
    return i, v


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
        width = max(len(prompts[i]) for i in idx)
        inp = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(inp)
        for r, i in enumerate(idx):
            p = prompts[i]
            inp[r, width - len(p) :] = torch.tensor(p)
            mask[r, width - len(p) :] = 1
        gen = target.generate(inp.to(dev), attention_mask=mask.to(dev), do_sample=False, max_new_tokens=max_new_tokens,
                              eos_token_id=eos, pad_token_id=pad_id, output_logits=True, return_dict_in_generate=True)
        seq = gen.sequences[:, width:].cpu()
        logits = torch.stack(gen.logits, dim=1).cpu()  # [B, T, V]
        for r, i in enumerate(idx):
            ans = seq[r].tolist()
            cut = next((j + 1 for j, t in enumerate(ans) if t in eos_ids), len(ans))
            ans = ans[:cut]
            ti, tv = _topk(logits[r, :cut], topk)
            out[i] = Example(list(prompts[i]) + ans, len(prompts[i]) - 1, ti, tv)
        bar.update(len(idx))
        bar.set_postfix(tokens=sum(e.labels for e in out if e is not None))
    bar.close()
    return [e for e in out if e is not None]


@torch.inference_mode()
def text_examples(target: PreTrainedModel, sequences: list[list[int]], batch_size: int = 8, topk: int = 16,
                  desc: str = "target on text") -> list[Example]:
    """Plain text (e.g. standard-library source) scored by one forward pass of the target."""
    dev = next(target.parameters()).device
    out: list[Example] = []
    for b0 in tqdm(range(0, len(sequences), batch_size), desc=desc, unit="batch", dynamic_ncols=True, file=sys.stderr):
        batch = sequences[b0 : b0 + batch_size]
        width = max(len(s) for s in batch)
        inp = torch.zeros((len(batch), width), dtype=torch.long)
        for r, s in enumerate(batch):
            inp[r, : len(s)] = torch.tensor(s)  # right padding: causal attention never looks ahead
        logits = target(input_ids=inp.to(dev)).logits.cpu()
        for r, s in enumerate(batch):
            ti, tv = _topk(logits[r, : len(s) - 1], topk)
            out.append(Example(list(s), 0, ti, tv))
    return out


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


def make_drafter(target: PreTrainedModel, layers: int = 1, init_layer: int = 0,
                 draft_vocab: torch.Tensor | None = None) -> LlamaForCausalLM:
    """A fresh drafter sharing the target's embedding and head (restricted to `draft_vocab` where
    given), its layers copied from the target's layers init_layer, init_layer + 1, ... and its
    final norm from the target's."""
    drafter = build_distilled(target, distilled_config(target.config, layers), draft_vocab)
    src = target.model.layers
    with torch.no_grad():
        for j, layer in enumerate(drafter.model.layers):
            layer.load_state_dict(src[min(init_layer + j, len(src) - 1)].state_dict())
        drafter.model.norm.load_state_dict(target.model.norm.state_dict())
    return drafter


def own_parameters(drafter: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The drafter's own weights: its decoder layers and final norm (never the shared embedding/head)."""
    return {k: v for k, v in drafter.state_dict().items() if k.startswith(("model.layers.", "model.norm."))}


def _batch(examples: list[Example], max_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, and the flat (row, position) of every label with its top-k targets."""
    seqs = [e.ids[:max_len] for e in examples]
    width = max(len(s) for s in seqs)
    inp = torch.zeros((len(seqs), width), dtype=torch.long)
    rows, cols, tids, tlps = [], [], [], []
    for r, (e, s) in enumerate(zip(examples, seqs, strict=True)):
        inp[r, : len(s)] = torch.tensor(s)
        n = min(e.labels, len(s) - 1 - e.start)  # label j needs ids[start + j] inside the window
        if n <= 0:
            continue
        rows.append(torch.full((n,), r))
        cols.append(torch.arange(e.start, e.start + n))
        tids.append(e.top_ids[:n])
        tlps.append(e.top_logp[:n])
    return inp, torch.stack([torch.cat(rows), torch.cat(cols)]), torch.cat(tids), torch.cat(tlps)


def distill_loss(drafter: PreTrainedModel, examples: list[Example], max_len: int = 512
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft cross-entropy to the target's top-k (renormalised) and the top-1 agreement per label."""
    dev = next(drafter.parameters()).device
    inp, where, tids, tlps = _batch(examples, max_len)
    hidden = drafter.model(input_ids=inp.to(dev)).last_hidden_state
    h = hidden[where[0].to(dev), where[1].to(dev)]  # only labelled positions go through the big head
    tids, tlps = tids.to(dev), tlps.to(dev)
    head = drafter.lm_head
    if isinstance(head, DraftHead):
        # Softmax over the draft vocabulary; labels outside it are dropped (the drafter can never
        # propose them) and the target's remaining top-k is renormalised.
        logq = torch.log_softmax(head.reduced(h).float(), dim=-1)
        local = head.local[tids]
        tlps = tlps.masked_fill(local < 0, float("-inf"))
        guess = head.ids[logq.argmax(-1)]
    else:
        logq = torch.log_softmax(head(h).float(), dim=-1)
        local = tids
        guess = logq.argmax(-1)
    p = torch.softmax(tlps, dim=-1).nan_to_num(0.0)  # a row with no label in the vocabulary weighs 0
    loss = -(p * logq.gather(1, local.clamp(min=0))).sum(-1).mean()
    agree = (guess == tids[:, 0]).float()
    return loss, agree


@torch.no_grad()
def agreement(drafter: PreTrainedModel, examples: list[Example], batch_size: int = 8) -> tuple[float, float]:
    """Mean soft cross-entropy and top-1 agreement with the target over every label of `examples`."""
    was = drafter.training
    drafter.eval()
    tot_loss = tot_agree = n = 0.0
    for b0 in range(0, len(examples), batch_size):
        loss, agree = distill_loss(drafter, examples[b0 : b0 + batch_size], max_len=10**9)
        tot_loss += loss.item() * agree.numel()
        tot_agree += agree.sum().item()
        n += agree.numel()
    drafter.train(was)
    return tot_loss / max(n, 1), tot_agree / max(n, 1)


def fit(params: list[torch.nn.Parameter], batch_loss: Callable[[], tuple[torch.Tensor, torch.Tensor]], steps: int,
        lr: float, warmup: int = 20, budget_s: float = 0.0, desc: str = "train") -> dict:
    """AdamW over `params` for `steps` steps (or until `budget_s` seconds have passed, where given), with a
    linear warm-up then a cosine down to a tenth of `lr`; `batch_loss()` draws a batch and returns its loss
    and per-label top-1 agreement. Returns the run's record (steps done, time, first/final loss, agreement)."""
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)

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
            "final_train_agreement": round(sum(a for _, a in tail) / len(tail), 4) if tail else None}


def train(drafter: PreTrainedModel, examples: list[Example], steps: int, batch_size: int = 8, lr: float = 1e-3,
          warmup: int = 20, max_len: int = 512, seed: int = 0, desc: str = "distil") -> dict:
    """AdamW on the drafter's own weights only; the shared embedding and head stay frozen."""
    params = [p for n, p in drafter.named_parameters() if n.startswith(("model.layers.", "model.norm."))]
    # The head (the target's, or a DraftHead's copy of its rows) is never trained.
    shared = {id(drafter.get_input_embeddings().weight), id(drafter.get_output_embeddings().weight)}
    for n, p in drafter.named_parameters():
        p.requires_grad_(id(p) not in shared and n.startswith(("model.layers.", "model.norm.")))
    rng = random.Random(seed)
    drafter.train()
    stats = fit(params, lambda: distill_loss(drafter, rng.sample(examples, min(batch_size, len(examples))), max_len),
                steps, lr, warmup, desc=desc)
    drafter.eval().requires_grad_(False)
    return {**stats, "batch_size": batch_size, "lr": lr, "max_len": max_len}


def save_drafter(drafter: PreTrainedModel, path: str | Path, info: dict) -> str:
    """Write the drafter's own weights in fp16 with its config and training record as metadata.

    Returns the file's sha256. The metadata's "config" is exactly what load_distilled builds.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in own_parameters(drafter).items()}
    if isinstance(drafter.lm_head, DraftHead):
        tensors[DRAFT_VOCAB] = drafter.lm_head.ids.detach().cpu().to(torch.int64).contiguous()
    meta = {"format": DISTILLED_FORMAT, "config": drafter_config_json(drafter.config),
            "info": json.dumps(info, sort_keys=True)}
    save_file(tensors, str(path), metadata=meta)
    return hashlib.sha256(path.read_bytes()).hexdigest()


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
    from metasd.training.train_data import domain_prompts, stdlib_chunks

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


def read_drafter_file(path: str | Path) -> tuple[dict, dict]:
    """(config, training record) stored in a drafter file's metadata."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    return json.loads(meta["config"]), json.loads(meta.get("info", "{}"))


def write_card(path: str | Path, eval_dir: str | Path | None = None) -> Path:
    """The model card NAME.md beside NAME.safetensors, written from the file itself (its sha256,
    size, config and training record) and, where given, scripts/eval_drafters.py's results."""
    path = Path(path)
    name = path.stem
    config, info = read_drafter_file(path)
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        names = set(f.keys())  # noqa: SIM118
        params = sum(math.prod(f.get_slice(k).get_shape()) for k in names if k != DRAFT_VOCAB)
    lines = [
        f"# {name}", "",
        f"A one-layer Llama drafter distilled from {info.get('target', 'the offline target')} for the "
        f"**{info.get('domain', '?')}** domain (MetaSD Studio, offline preset). It reads the target's frozen "
        "embedding table and LM head (taken from the target at load time, the head restricted to the draft "
        "vocabulary below); only its decoder layer and final norm, and the vocabulary's ids, are stored here.", "",
        "## File", "",
        f"- `{path.name}`: {len(data):,} bytes, sha256 `{sha}`",
        f"- {params:,} parameters, stored in fp16, loaded in fp32 on the CPU",
        f"- initialised from the target's layer {info.get('init_layer')}",
        (f"- draft vocabulary: {info['draft_vocab']:,} token ids (stored as `{DRAFT_VOCAB}`), the ones the target "
         "used most on the training data; the head is the target's, restricted to those rows"
         if info.get("draft_vocab") and DRAFT_VOCAB in names else "- head: the target's full LM head"), "",
        "## Data", "",
        f"- {info.get('prompts')} templated {info.get('domain')} prompts (metasd/training/train_data.py, "
        f"seed {info.get('seed')}; "
        "none is a Spec-Bench prompt), answered greedily by the target through its chat template, "
        f"at most {info.get('max_new_tokens')} new tokens each (on-policy distillation)"
        + (f", plus {info.get('text_chunks')} chunks of Python standard-library source" if info.get("text_chunks") else ""),
        f"- {info.get('train_sequences')} sequences, {info.get('train_labels'):,} labelled answer tokens; soft labels: "
        f"the target's top-{info.get('topk')} log-probabilities at each (kept from generation, {info.get('data_seconds')} s)",
        "", "## Training", "",
        f"- {info.get('steps')} AdamW steps, batch {info.get('batch_size')} sequences, lr {info.get('lr')} "
        f"(warm-up, cosine), {info.get('train_seconds')} s on a 2-core CPU",
        f"- soft cross-entropy to the target's renormalised top-k: first {info.get('first_loss')}, "
        f"final {info.get('final_loss')} (train top-1 agreement {info.get('final_train_agreement')})",
        f"- held-out ({info.get('eval_sequences')} unseen prompts of the domain) top-1 agreement with the target: "
        f"{info.get('eval_agreement_before')} at initialisation, **{info.get('eval_agreement')}** after training "
        f"(loss {info.get('eval_loss_before')} -> {info.get('eval_loss')})", "",
    ]
    if eval_dir is not None and (Path(eval_dir) / "results.jsonl").exists():
        rows = [json.loads(x) for x in (Path(eval_dir) / "results.jsonl").read_text().splitlines() if x.strip()]
        mine = [r for r in rows if r["drafter"] == name]
        costs = json.loads((Path(eval_dir) / "costs.json").read_text()) if (Path(eval_dir) / "costs.json").exists() else {}
        if name in costs:
            lines += ["## Cost", "",
                      f"- c = drafter step / target step = **{costs[name]:.3f}** ({costs.get(f'_{name}_ms', 0):.1f} ms vs "
                      f"{costs.get('_target_ms', 0):.1f} ms at 200 tokens of context, interleaved)", ""]
        if mine:
            n_cat = max(sum(1 for r in mine if r["category"] == c) for c in {r["category"] for r in mine})
            lines += ["## Spec-Bench, this drafter alone (greedy, single:" + name + ")", "",
                      f"{n_cat} prompt(s) per category, {max(r['new_tokens'] for r in mine)} new tokens at most, gamma = "
                      "the preset's. Acceptance = mean accepted draft tokens per target call.", "",
                      "| category | accepted / call | tokens/s |", "|---|---|---|"]
            for cat in sorted({r["category"] for r in mine}):
                rs = [r for r in mine if r["category"] == cat]
                acc = sum(r["accepted"] for r in rs) / max(1, sum(r["target_calls"] for r in rs))
                tps = sum(r["new_tokens"] for r in rs) / sum(r["wall_s"] for r in rs)
                lines.append(f"| {cat} | {acc:.2f} | {tps:.1f} |")
            lines.append("")
    lines += ["## Config (as stored in the file's metadata and built at load time)", "", "```json",
              json.dumps(config, sort_keys=True), "```", "",
              "Reproduce: see the command in assets/drafters/README.md.", ""]
    card = path.with_suffix(".md")
    card.write_text("\n".join(lines), encoding="utf-8")
    return card


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m metasd.training.train", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=["distilled", "white-box"], default="distilled",
                    help="distilled: a one-layer model on token ids; white-box: an EAGLE-style head on the "
                         "target's hidden states (metasd/drafting/whitebox.py)")
    ap.add_argument("--domain", choices=["code", "math", "chat"])
    ap.add_argument("--out", help="where to write NAME.safetensors (its model card NAME.md goes beside it)")
    ap.add_argument("--card", help="only (re)write the model card of this drafter file")
    ap.add_argument("--eval-dir", help="scripts/eval_drafters.py output to include in the card")
    ap.add_argument("--prompts", type=int, default=512, help="training prompts the target answers")
    ap.add_argument("--eval-prompts", type=int, default=32, help="held-out prompts for the agreement score")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--text-chunks", type=int, default=-1, help="stdlib source chunks (default: 64 for code, else 0)")
    ap.add_argument("--gen-batch", type=int, default=16)
    ap.add_argument("--topk", type=int, default=16)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--draft-vocab", type=int, default=4096,
                    help="ids the drafter's head keeps, ranked by the target's use of them on the data (0: all)")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--init-layer", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data-cache", default="", help="save/reuse the generated examples here (a .pt file)")
    ap.add_argument("--unroll", type=int, default=3, help="white-box: training-time-test steps per position")
    ap.add_argument("--resume", default="",
                    help="white-box: continue training this head file (its draft vocabulary and layers) instead of a fresh one")
    ap.add_argument("--budget-min", type=float, default=0.0,
                    help="white-box: stop training after this many minutes (0: run every step)")
    a = ap.parse_args(argv)
    if a.card:
        from safetensors import safe_open

        from metasd.drafting.whitebox import WHITEBOX_FORMAT
        from metasd.training.train_whitebox import write_head_card

        with safe_open(a.card, framework="pt") as f:
            head = (f.metadata() or {}).get("format") == WHITEBOX_FORMAT
        print(write_head_card(a.card) if head else write_card(a.card, a.eval_dir))
        return 0
    if not a.domain or not a.out:
        ap.error("--domain and --out are required to train")

    from metasd.models.loading import load_bundle

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    t_start = time.perf_counter()
    bundle = load_bundle("offline", progress=lambda m: print(m, file=sys.stderr))
    target = bundle.target
    chunks = a.text_chunks if a.text_chunks >= 0 else (64 if a.domain == "code" else 0)
    train_ex, eval_ex, gen_s = domain_data(a, bundle, chunks)
    labels = sum(e.labels for e in train_ex)
    print(f"[train] {len(train_ex)} training sequences, {labels} labelled tokens ({gen_s:.0f} s of target time)",
          file=sys.stderr)
    if a.kind == "white-box":
        from metasd.training.train_whitebox import run_white_box

        return run_white_box(a, bundle, train_ex, eval_ex, gen_s, chunks, t_start)

    vocab = draft_vocabulary(train_ex, a.draft_vocab, bundle.target_vocab) if a.draft_vocab > 0 else None
    drafter = make_drafter(target, a.layers, a.init_layer, vocab)
    before = agreement(drafter, eval_ex)
    stats = train(drafter, train_ex, a.steps, a.batch_size, a.lr, seed=a.seed, desc=f"{a.domain}: distil")
    info = {"domain": a.domain, "target": bundle.preset.target, "init_layer": a.init_layer,
            "train_sequences": len(train_ex), "train_labels": labels, "prompts": a.prompts,
            "text_chunks": chunks, "max_new_tokens": a.max_new_tokens,
            "draft_vocab": int(vocab.numel()) if vocab is not None else bundle.target_vocab, "topk": a.topk, "seed": a.seed,
            "data_seconds": round(gen_s, 1), **stats,
            "eval_sequences": len(eval_ex), "eval_loss_before": round(before[0], 4),
            "eval_agreement_before": round(before[1], 4)}
    sha = save_drafter(drafter, a.out, info)
    # Score what ships: the fp16 file loaded back the way the preset loads it.
    loaded = load_distilled(a.out, target, target.device, torch.float32)
    after = agreement(loaded, eval_ex)
    info |= {"eval_loss": round(after[0], 4), "eval_agreement": round(after[1], 4),
             "total_seconds": round(time.perf_counter() - t_start, 1)}
    sha = save_drafter(drafter, a.out, info)
    write_card(a.out, a.eval_dir)
    print(json.dumps({"out": a.out, "sha256": sha, **info}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
