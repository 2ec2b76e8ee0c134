"""Training a white-box head (metasd/drafting/whitebox.py) on the target's own answers and hidden states, on a CPU.

    python -m metasd.training.train --kind white-box --domain code --out assets/drafters/code-eagle.safetensors

The data are the distilled drafters' (metasd/training/train.py: the target's greedy answers to templated prompts of
the domain, with its top-k next-token log-probabilities at every answer token), plus the target's hidden
states at the head's feature layers, from one teacher-forced pass over each sequence.

Loss: soft cross-entropy to the target's top-k (renormalised over the draft vocabulary), summed over
`unroll` steps of training-time test: step 1 reads the target's fused features; step s > 1 reads the head's
own output state from step s - 1 at the previous position, and attends to the true-feature keys up to
t - s + 1 and to its own steps' keys after that, which is exactly what drafting s tokens sees.
Step s weighs 0.8^(s - 1) (EAGLE-3's choice), so the first position, which every round uses, counts most.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from metasd.drafting.files import DraftHead, card_file_lines, parameter_count, read_info, write_card_text
from metasd.drafting.whitebox import HeadConfig, WhiteBoxHead, build_head, load_head, save_head
from metasd.training.common import (
    Example,
    autocast_note,
    corpus_line,
    draft_vocabulary,
    earlier_pieces,
    fit,
    length_batches,
    piece_record,
    pieces_lines,
    reproduce_line,
    topk_logp,
    use_bf16,
)


@dataclass
class Sequence:
    """One training sequence: ids, the target's features at every position, the labelled positions."""

    ids: torch.Tensor  # [T] int64
    feats: torch.Tensor  # [T, len(layers) * d] fp16
    pos: torch.Tensor  # [n] head positions t: the head reads (feature t, token t + 1) and predicts token t + 2
    top_ids: torch.Tensor  # [n, k] the target's top-k for that token
    top_logp: torch.Tensor  # [n, k]


@torch.inference_mode()
def with_features(target, examples: list[Example], layers: tuple[int, ...], max_len: int = 512,
                  batch_size: int = 8, desc: str = "target features", topk: int = 16) -> list[Sequence]:
    """One teacher-forced target pass per sequence (batched, right-padded) for the features at `layers`; an
    example not yet scored (top_ids None) gets its top-k labels from the same pass's logits, in place."""
    dev = next(target.parameters()).device
    out: list[Sequence] = []
    cut = [e.ids[:max_len] for e in examples]
    for idx, inp in length_batches(cut, batch_size, desc):
        batch, seqs = [examples[i] for i in idx], [cut[i] for i in idx]
        res = target(input_ids=inp.to(dev), output_hidden_states=True)
        feats = torch.cat([res.hidden_states[i] for i in layers], dim=-1).to(torch.float16).cpu()
        for r, (e, s) in enumerate(zip(batch, seqs, strict=True)):
            if e.top_ids is None:
                e.top_ids, e.top_logp = topk_logp(res.logits[r, e.start : len(s) - 1].cpu(), topk)
            # Label row j is the target's prediction after ids[start + j]; the head reads it at t = start + j - 1.
            j = torch.arange(e.labels)
            t = e.start + j - 1
            ok = (t >= 0) & (t + 2 < len(s))
            out.append(Sequence(torch.tensor(s), feats[r, : len(s)].clone(), t[ok], e.top_ids[ok], e.top_logp[ok]))
    return out


def ttt_mask(T: int, s: int) -> torch.Tensor:
    """Step s's attention mask over the keys of steps 1..s (each T long): query t sees step 1's keys at
    u <= t - s + 1 and step j's key at t - s + j (j = 2..s). Step 1 is plain causal attention."""
    t = torch.arange(T)[:, None]
    u = torch.arange(T)[None, :]
    parts = [u <= t - s + 1]
    for j in range(2, s + 1):
        parts.append(u == t - s + j)
    return torch.cat(parts, dim=1)


def batch_tensors(batch: list[Sequence], dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, T + 1] (one pad column: the last position's next token) and features [B, T, F]."""
    T = max(len(x.ids) for x in batch)
    ids = torch.zeros((len(batch), T + 1), dtype=torch.long, device=dev)
    feats = torch.zeros((len(batch), T, batch[0].feats.shape[1]), device=dev)
    for r, x in enumerate(batch):
        ids[r, : len(x.ids)] = x.ids.to(dev)
        feats[r, : len(x.ids)] = x.feats.to(dev, torch.float32)
    return ids, feats


def unrolled_states(head: WhiteBoxHead, ids: torch.Tensor, feats: torch.Tensor, unroll: int) -> list[torch.Tensor]:
    """The head's output states [B, T, d] at every position for steps 1..unroll of training-time test.

    Step 1 reads the target's fused features; step s reads step s - 1's output at the previous position in
    place of the target's feature, and attends as drafting s tokens would (ttt_mask). Row t of step s is
    what the head computes for token t + 2 when its (s - 1) previous drafted tokens were right.
    """
    B, T = feats.shape[:2]
    pos = torch.arange(T, device=feats.device)[None].expand(B, T)
    nxt = ids[:, 1 : T + 1]
    g = head.fuse(feats)
    L = head.layer
    keys: list[torch.Tensor] = []
    vals: list[torch.Tensor] = []
    out: list[torch.Tensor] = []
    for s in range(1, unroll + 1):
        x = head.inputs(g, nxt)
        q, k, v = L.self_attn.project(L.input_layernorm(x), pos)
        keys.append(k)
        vals.append(v)
        h = x + L.self_attn.attend(q, torch.cat(keys, dim=2), torch.cat(vals, dim=2), ttt_mask(T, s).to(x.device))
        a = L.ffn(h)
        out.append(a)
        g = torch.cat((torch.zeros_like(a[:, :1]), a[:, :-1]), dim=1)
    return out


def unrolled_loss(head: WhiteBoxHead, batch: list[Sequence], unroll: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Weighted soft cross-entropy over `unroll` training-time-test steps; and each step's top-1 agreement
    with the target per labelled position."""
    dev = next(head.parameters()).device
    ids, feats = batch_tensors(batch, dev)
    rows = torch.cat([torch.full((len(x.pos),), r) for r, x in enumerate(batch)]).to(dev)
    cols = torch.cat([x.pos for x in batch]).to(dev)
    tids = torch.cat([x.top_ids for x in batch]).to(dev)
    tlps = torch.cat([x.top_logp for x in batch]).to(dev)
    lm = head.lm_head
    assert isinstance(lm, DraftHead), "white-box heads are trained on a draft vocabulary"
    local = lm.local[tids]
    p = torch.softmax(tlps.masked_fill(local < 0, float("-inf")), dim=-1).nan_to_num(0.0)
    total = torch.zeros((), device=dev)
    agree: list[torch.Tensor] = []
    for s, a in enumerate(unrolled_states(head, ids, feats, unroll), start=1):
        valid = cols >= s - 1  # step s at position t needs the head's steps at t - s + 1 .. t - 1
        logq = torch.log_softmax(lm.reduced(head.norm(a[rows, cols])).float(), dim=-1)
        ce = -(p * logq.gather(1, local.clamp(min=0))).sum(-1)
        total = total + (0.8 ** (s - 1)) * (ce * valid).sum() / valid.sum().clamp(min=1)
        agree.append((lm.ids[logq.argmax(-1)] == tids[:, 0])[valid].float())
    return total, agree


@torch.no_grad()
def evaluate(head: WhiteBoxHead, data: list[Sequence], unroll: int, batch_size: int = 8) -> dict:
    """Held-out loss and each step's top-1 agreement with the target (step 1 = first-position acceptance)."""
    was = head.training
    head.eval()
    loss = 0.0
    hits = [0.0] * unroll
    counts = [0] * unroll
    for b0 in range(0, len(data), batch_size):
        part = data[b0 : b0 + batch_size]
        lo, ag = unrolled_loss(head, part, unroll)
        loss += lo.item() * len(part)
        for s, a in enumerate(ag):
            hits[s] += a.sum().item()
            counts[s] += a.numel()
    head.train(was)
    return {"loss": round(loss / max(1, len(data)), 4),
            "agreement": [round(h / max(1, c), 4) for h, c in zip(hits, counts, strict=True)]}


def train_head(head: WhiteBoxHead, data: list[Sequence], steps: int, unroll: int = 3, batch_size: int = 8,
               lr: float = 1e-3, warmup: int = 30, seed: int = 0, budget_s: float = 0.0, desc: str = "white-box",
               bf16: bool = False) -> dict:
    """AdamW on the head's own weights (fuse, fc, layer, norm); stops at `steps` or after `budget_s` seconds.
    The agreement it reports is step 1's (the first draft position)."""
    params = list(head.parameters())  # the shared embedding and LM head are held, not registered
    for p in params:
        p.requires_grad_(True)
    rng = random.Random(seed)
    head.train()

    def batch_loss() -> tuple[torch.Tensor, torch.Tensor]:
        loss, agree = unrolled_loss(head, rng.sample(data, min(batch_size, len(data))), unroll)
        return loss, agree[0]

    stats = fit(params, batch_loss, steps, lr, warmup, budget_s, desc, bf16=bf16)
    head.eval().requires_grad_(False)
    return {**stats, "planned_steps": steps, "unroll": unroll, "batch_size": batch_size, "lr": lr}


def run_white_box(a, bundle, train_ex: list[Example], eval_ex: list[Example], gen_s: float, chunks: int,
                  t_start: float, shards: dict | None = None) -> int:
    """`python -m metasd.training.train --kind white-box`: features, draft vocabulary, training, the fp16 file, its card."""
    target = bundle.target
    c = HeadConfig.from_target(target.config)
    t0 = time.perf_counter()
    train = with_features(target, train_ex, c.feature_layers, desc=f"{a.domain}: target features", topk=a.topk)
    held = with_features(target, eval_ex, c.feature_layers, desc=f"{a.domain}: held-out features", topk=a.topk)
    feat_s = time.perf_counter() - t0
    earlier: dict = {}
    init_layer = target.config.num_hidden_layers - 1
    if a.resume:  # more steps on a shipped head: its weights and draft vocabulary, its record kept in the card
        head = load_head(a.resume, target, target.device, torch.float32)
        rc, earlier = read_info(a.resume)
        if tuple(rc["feature_layers"]) != tuple(c.feature_layers):
            raise SystemExit(f"{a.resume} reads layers {rc['feature_layers']}, this target's heads {list(c.feature_layers)}")
        vocab, init_layer = head.lm_head.ids, earlier.get("init_layer", init_layer)
    else:
        vocab = draft_vocabulary(train_ex, a.draft_vocab or 4096, bundle.target_vocab)
        # The head reads the top of the target: its layer starts as the target's last one.
        head = build_head(target, c, vocab, init_layer=init_layer)
    before = evaluate(head, held, a.unroll)
    stats = train_head(head, train, a.steps, a.unroll, a.batch_size, a.lr, seed=a.seed, budget_s=60 * a.budget_min,
                       desc=f"{a.domain}: white-box", bf16=use_bf16(a.bf16, target.device))
    info = {"kind": "white-box", "domain": a.domain, "target": bundle.preset.target,
            "feature_layers": list(c.feature_layers), "init_layer": init_layer,
            "train_sequences": len(train), "train_labels": sum(len(x.pos) for x in train),
            "prompts": None if a.corpus else a.prompts, "corpus": a.corpus or None,
            "corpus_shards": shards,
            "text_chunks": chunks, "max_new_tokens": a.max_new_tokens, "draft_vocab": int(vocab.numel()),
            "topk": a.topk, "seed": a.seed, "data_seconds": round(gen_s, 1), "feature_seconds": round(feat_s, 1),
            **stats, "eval_sequences": len(held), "eval_before": before}
    save_head(head, a.out, info)
    # Score what ships: the fp16 file loaded back the way the preset loads it.
    loaded = load_head(a.out, target, target.device, torch.float32)
    info |= {"eval": evaluate(loaded, held, a.unroll), "total_seconds": round(time.perf_counter() - t_start, 1)}
    info["pieces"] = earlier_pieces(earlier) + [piece_record(info)]
    save_head(head, a.out, info)
    write_head_card(a.out)
    print(json.dumps({"out": a.out, **info}, indent=1))
    return 0


def write_head_card(path) -> Path:
    """NAME.md beside a head's file, written from the file (size, sha256, config, training record)."""
    path = Path(path)
    config, info = read_info(path)
    lines = [
        f"# {path.stem}", "",
        f"A white-box drafter head (EAGLE family) for the **{info.get('domain')}** domain on "
        f"{info.get('target')} (MetaSD Studio, offline preset). It reads the target's hidden states at layers "
        f"{info.get('feature_layers')} (low, middle, top) and the next token's embedding, runs one decoder layer "
        "with its own KV cache, and predicts through the target's LM head restricted to a draft vocabulary. "
        "The embedding and head are the target's, taken at load time; only the head's own weights are stored.", "",
        "## File", "",
        *card_file_lines(path),
        f"- {parameter_count(path):,} parameters (fuse {len(config['feature_layers'])}d->d, fc 2d->d, one decoder "
        f"layer, norm), fp16 on disk; draft vocabulary {info.get('draft_vocab'):,} ids",
        f"- layer initialised from the target's layer {info.get('init_layer')}", "",
        *_head_data_lines(info), *_head_training_lines(info),
        "## Config", "", "```json", json.dumps(config, sort_keys=True), "```", "",
        reproduce_line(info), "",
    ]
    return write_card_text(path, lines)


def _head_data_lines(info: dict) -> list[str]:
    return [
        "## Data", "",
        corpus_line(info) or (
         f"- {info.get('prompts')} templated {info.get('domain')} prompts (metasd/training/train_data.py, "
         f"seed {info.get('seed')}; "
         "none is a Spec-Bench prompt) answered greedily by the target, at most "
         f"{info.get('max_new_tokens')} new tokens each"
         + (f", plus {info.get('text_chunks')} chunks of Python standard-library source" if info.get("text_chunks") else "")),
        f"- {info.get('train_sequences')} sequences, {info.get('train_labels'):,} labelled positions; soft labels: the "
        f"target's top-{info.get('topk')} log-probabilities; features from one teacher-forced target pass "
        f"({info.get('data_seconds')} s of generation, {info.get('feature_seconds')} s of features)", "",
    ]


def _head_training_lines(info: dict) -> list[str]:
    ev, ev0 = info.get("eval", {}), info.get("eval_before", {})
    steps = ", ".join(f"step {i + 1}: {x:.3f}" for i, x in enumerate(ev.get("agreement", [])))
    return [
        "## Training", "",
        f"- {info.get('steps')} AdamW steps (of {info.get('planned_steps')} planned), batch {info.get('batch_size')}, "
        f"lr {info.get('lr')}, training-time test over {info.get('unroll')} steps, {info.get('train_seconds')} s "
        f"on a 2-core CPU{autocast_note(info)}",
        *pieces_lines(info, "head"),
        f"- loss: first {info.get('first_loss')}, final {info.get('final_loss')} (train step-1 agreement "
        f"{info.get('final_train_agreement')})",
        f"- held-out ({info.get('eval_sequences')} unseen prompts of the domain), top-1 agreement with the target "
        f"per draft position, teacher-forced up to the head's own earlier steps: **{steps}** "
        f"(at initialisation: {ev0.get('agreement')}); loss {ev0.get('loss')} -> {ev.get('loss')}", "",
    ]
