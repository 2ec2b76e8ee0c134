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
import json
import random
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedModel

from metasd.decoding.loading import build_distilled, distilled_config, drafter_config_json, load_bundle, load_distilled
from metasd.drafting.files import (
    DISTILLED_FORMAT,
    DRAFT_VOCAB,
    WHITEBOX_FORMAT,
    DraftHead,
    card_file_lines,
    has_draft_vocab,
    parameter_count,
    read_format,
    read_info,
    save_drafter_file,
    write_card_text,
)
from metasd.training.common import (  # noqa: F401 (answer_examples, encode_chat, text_examples: public here too)
    Example,
    answer_examples,
    autocast_note,
    corpus_line,
    domain_data,
    draft_vocabulary,
    earlier_pieces,
    encode_chat,
    fit,
    piece_record,
    pieces_lines,
    reproduce_line,
    text_examples,
    use_bf16,
)
from metasd.training.corpus import corpus_data
from metasd.training.train_whitebox import run_white_box, write_head_card


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


def train(drafter: PreTrainedModel, examples: list[Example], steps: int, batch_size: int = 8, lr: float = 1e-3,
          warmup: int = 20, max_len: int = 512, seed: int = 0, desc: str = "distil", budget_s: float = 0.0,
          bf16: bool = False) -> dict:
    """AdamW on the drafter's own weights only; the shared embedding and head stay frozen."""
    params = [p for n, p in drafter.named_parameters() if n.startswith(("model.layers.", "model.norm."))]
    # The head (the target's, or a DraftHead's copy of its rows) is never trained.
    shared = {id(drafter.get_input_embeddings().weight), id(drafter.get_output_embeddings().weight)}
    for n, p in drafter.named_parameters():
        p.requires_grad_(id(p) not in shared and n.startswith(("model.layers.", "model.norm.")))
    rng = random.Random(seed)
    drafter.train()
    stats = fit(params, lambda: distill_loss(drafter, rng.sample(examples, min(batch_size, len(examples))), max_len),
                steps, lr, warmup, budget_s, desc=desc, bf16=bf16)
    drafter.eval().requires_grad_(False)
    return {**stats, "batch_size": batch_size, "lr": lr, "max_len": max_len}


def save_drafter(drafter: PreTrainedModel, path: str | Path, info: dict) -> str:
    """Write the drafter's own weights in fp16 with its config and training record as metadata
    (metasd.drafting.files). Returns the file's sha256. The metadata's "config" is exactly what
    load_distilled builds."""
    return save_drafter_file(path, own_parameters(drafter), drafter.lm_head, DISTILLED_FORMAT,
                             drafter_config_json(drafter.config), info)


def write_card(path: str | Path, eval_dir: str | Path | None = None) -> Path:
    """The model card NAME.md beside NAME.safetensors, written from the file itself (its sha256,
    size, config and training record) and, where given, scripts/eval_drafters.py's results."""
    path = Path(path)
    config, info = read_info(path)
    lines = _card_lines(path, info) + (_eval_lines(path.stem, Path(eval_dir)) if eval_dir is not None else [])
    lines += ["## Config (as stored in the file's metadata and built at load time)", "", "```json",
              json.dumps(config, sort_keys=True), "```", "",
              reproduce_line(info), ""]
    return write_card_text(path, lines)


def _card_lines(path: Path, info: dict) -> list[str]:
    """The card's description, file, data and training sections."""
    vocab = (f"- draft vocabulary: {info['draft_vocab']:,} token ids (stored as `{DRAFT_VOCAB}`), the ones the target "
             "used most on the training data; the head is the target's, restricted to those rows"
             if info.get("draft_vocab") and has_draft_vocab(path) else "- head: the target's full LM head")
    return [
        f"# {path.stem}", "",
        f"A one-layer Llama drafter distilled from {info.get('target', 'the offline target')} for the "
        f"**{info.get('domain', '?')}** domain (MetaSD Studio, offline preset). It reads the target's frozen "
        "embedding table and LM head (taken from the target at load time, the head restricted to the draft "
        "vocabulary below); only its decoder layer and final norm, and the vocabulary's ids, are stored here.", "",
        "## File", "",
        *card_file_lines(path),
        f"- {parameter_count(path):,} parameters, stored in fp16, loaded in fp32 on the CPU",
        f"- initialised from the target's layer {info.get('init_layer')}",
        vocab, "",
        "## Data", "",
        corpus_line(info) or (
         f"- {info.get('prompts')} templated {info.get('domain')} prompts (metasd/training/train_data.py, "
         f"seed {info.get('seed')}; "
         "none is a Spec-Bench prompt), answered greedily by the target through its chat template, "
         f"at most {info.get('max_new_tokens')} new tokens each (on-policy distillation)"
         + (f", plus {info.get('text_chunks')} chunks of Python standard-library source" if info.get("text_chunks") else "")),
        f"- {info.get('train_sequences')} sequences, {info.get('train_labels'):,} labelled answer tokens; soft labels: "
        f"the target's top-{info.get('topk')} log-probabilities at each (kept from generation, {info.get('data_seconds')} s)",
        "", "## Training", "",
        f"- {info.get('steps')} AdamW steps, batch {info.get('batch_size')} sequences, lr {info.get('lr')} "
        f"(warm-up, cosine), {info.get('train_seconds')} s on a 2-core CPU"
        f"{autocast_note(info)}",
        *pieces_lines(info, "drafter"),
        f"- soft cross-entropy to the target's renormalised top-k: first {info.get('first_loss')}, "
        f"final {info.get('final_loss')} (train top-1 agreement {info.get('final_train_agreement')})",
        f"- held-out ({info.get('eval_sequences')} unseen prompts of the domain) top-1 agreement with the target: "
        f"{info.get('eval_agreement_before')} at initialisation, **{info.get('eval_agreement')}** after training "
        f"(loss {info.get('eval_loss_before')} -> {info.get('eval_loss')})", "",
    ]


def _eval_lines(name: str, eval_dir: Path) -> list[str]:
    """The card's cost and Spec-Bench sections, from scripts/eval_drafters.py's output where there is one."""
    if not (eval_dir / "results.jsonl").exists():
        return []
    rows = [json.loads(x) for x in (eval_dir / "results.jsonl").read_text().splitlines() if x.strip()]
    mine = [r for r in rows if r["drafter"] == name]
    costs = json.loads((eval_dir / "costs.json").read_text()) if (eval_dir / "costs.json").exists() else {}
    lines: list[str] = []
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
    return lines


def build_parser() -> argparse.ArgumentParser:
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
    ap.add_argument("--corpus", default="",
                    help="train on this corpus folder (python -m metasd.training.corpus) instead of generating data")
    ap.add_argument("--shards-from", type=int, default=0,
                    help="with --corpus: read only shards numbered this or more (a piece on the shards added since "
                    "the piece before; held-out shards too)")
    ap.add_argument("--unroll", type=int, default=3, help="white-box: training-time-test steps per position")
    ap.add_argument("--resume", default="",
                    help="continue training this drafter or head file (its draft vocabulary and layers) instead of a fresh one")
    ap.add_argument("--budget-min", type=float, default=0.0,
                    help="stop training after this many minutes (0: run every step)")
    ap.add_argument("--bf16", choices=["auto", "on", "off"], default="auto",
                    help="bfloat16 autocast for the training passes (auto: on a GPU, or a CPU with AMX or "
                    "AVX-512 BF16, where it is about twice as fast)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.card:
        print(write_head_card(a.card) if read_format(a.card) == WHITEBOX_FORMAT else write_card(a.card, a.eval_dir))
        return 0
    if not a.domain or not a.out:
        ap.error("--domain and --out are required to train")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    t_start = time.perf_counter()
    bundle = load_bundle("offline", progress=lambda m: print(m, file=sys.stderr))
    chunks = a.text_chunks if a.text_chunks >= 0 else (64 if a.domain == "code" else 0)
    shards = None
    if a.corpus:
        train_ex, eval_ex, gen_s, shards = corpus_data(a, bundle.target)
    else:
        train_ex, eval_ex, gen_s = domain_data(a, bundle, chunks)
    print(f"[train] {len(train_ex)} training sequences, {sum(e.labels for e in train_ex)} labelled tokens "
          f"({gen_s:.0f} s of target time)", file=sys.stderr)
    run = run_white_box if a.kind == "white-box" else run_distilled
    return run(a, bundle, train_ex, eval_ex, gen_s, chunks, t_start, shards=shards)


def run_distilled(a: argparse.Namespace, bundle, train_ex: list[Example], eval_ex: list[Example], gen_s: float,
                  chunks: int, t_start: float, shards: dict | None = None) -> int:
    """`python -m metasd.training.train` (distilled): draft vocabulary, training, the fp16 file, its card."""
    target = bundle.target
    earlier: dict = {}
    init_layer = a.init_layer
    if a.resume:  # more steps on a shipped drafter: its weights and draft vocabulary, its record kept in the card
        drafter = load_distilled(a.resume, target, target.device, torch.float32)
        _, earlier = read_info(a.resume)
        head = drafter.get_output_embeddings()
        vocab = head.ids if isinstance(head, DraftHead) else None
        init_layer = earlier.get("init_layer", init_layer)
    else:
        vocab = draft_vocabulary(train_ex, a.draft_vocab, bundle.target_vocab) if a.draft_vocab > 0 else None
        drafter = make_drafter(target, a.layers, a.init_layer, vocab)
    before = agreement(drafter, eval_ex)
    stats = train(drafter, train_ex, a.steps, a.batch_size, a.lr, seed=a.seed, desc=f"{a.domain}: distil",
                  budget_s=60 * a.budget_min, bf16=use_bf16(a.bf16, target.device))
    info = {"domain": a.domain, "target": bundle.preset.target, "init_layer": init_layer,
            "train_sequences": len(train_ex), "train_labels": sum(e.labels for e in train_ex),
            "prompts": None if a.corpus else a.prompts, "corpus": a.corpus or None,
            "corpus_shards": shards,
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
    info["pieces"] = earlier_pieces(earlier) + [piece_record(info)]
    sha = save_drafter(drafter, a.out, info)
    write_card(a.out, a.eval_dir)
    print(json.dumps({"out": a.out, "sha256": sha, **info}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
