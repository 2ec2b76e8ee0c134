"""Distilled domain drafters: training runs (tiny model), shipped weights load, share the target's
embedding and head, match their model cards, and draft losslessly."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from metasd import run, target_greedy
from metasd.decoding.loading import DRAFT_VOCAB, Bundle, DraftHead, distilled_path, drafter_config_json, load_distilled
from metasd.models.presets import DrafterSpec, Preset, get_preset
from metasd.training.train import (
    agreement,
    answer_examples,
    draft_vocabulary,
    make_drafter,
    own_parameters,
    save_drafter,
    text_examples,
    train,
)
from metasd.training.train_data import DOMAINS, benchmark_prompts, domain_prompts
from tests.tiny import independent_greedy, tiny_llama

MAX_BYTES = 30 * 1024 * 1024
DISTILLED = [d for d in get_preset("offline").drafters if d.kind == "distilled"]


def _shares(drafter, target) -> bool:
    """The drafter reads the target's embedding table and writes through its head (or the head's
    rows for its draft vocabulary, copied and never trained)."""
    head, full = drafter.get_output_embeddings(), target.get_output_embeddings().weight
    same_head = (torch.equal(head.weight, full[head.ids]) if isinstance(head, DraftHead)
                 else head.weight.data_ptr() == full.data_ptr())
    return drafter.get_input_embeddings().weight.data_ptr() == target.get_input_embeddings().weight.data_ptr() and same_head


# ---------------------------------------------------------------------------------------------
# Training data and the training loop (no real model, seconds)


def test_prompts_reproducible_and_disjoint_from_specbench():
    bench = benchmark_prompts()
    for domain in DOMAINS:
        a, b = domain_prompts(domain, 120, seed=0), domain_prompts(domain, 120, seed=0)
        assert a == b and len(a) == len(set(a)) == 120
        assert not set(a) & bench, f"{domain} prompts overlap Spec-Bench"
        assert domain_prompts(domain, 20, seed=1) != a[:20]


def test_train_few_steps_on_tiny_model(tmp_path):
    torch.manual_seed(0)
    target = tiny_llama(vocab=48, layers=3, hidden=32, seed=3, scale=4.0)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 48, (n,), generator=gen).tolist() for n in (5, 9, 7, 12, 6, 8)]
    ex = answer_examples(target, prompts, max_new_tokens=10, eos_ids=set(), pad_id=0, batch_size=4, topk=8)
    assert len(ex) == len(prompts)
    for e, p in zip(ex, prompts, strict=True):
        assert e.ids[: len(p)] == p and e.labels == 10 and e.start == len(p) - 1
        # Greedy answers: the target's top-1 at every label is the next token of the sequence.
        assert e.top_ids[:, 0].tolist() == e.ids[e.start + 1 : e.start + 1 + e.labels]
    ex += text_examples(target, [torch.randint(1, 48, (16,), generator=gen).tolist() for _ in range(3)], topk=8)

    drafter = make_drafter(target, layers=1, init_layer=1)
    assert _shares(drafter, target) and len(target.model.layers) == 3
    before = agreement(drafter, ex)
    stats = train(drafter, ex, steps=25, batch_size=4, lr=3e-3, warmup=3)
    after = agreement(drafter, ex)
    assert stats["steps"] == 25 and after[0] < before[0], (before, after)
    assert all(not p.requires_grad for p in target.parameters()), "training must leave the target frozen"

    path = tmp_path / "tiny-drafter.safetensors"
    sha = save_drafter(drafter, path, {"domain": "test", **stats})
    assert sha == hashlib.sha256(path.read_bytes()).hexdigest()
    with safe_open(str(path), framework="pt") as f:
        meta, names = f.metadata(), set(f.keys())
    assert names == set(own_parameters(drafter)) and not any("embed" in n or "lm_head" in n for n in names)
    loaded = load_distilled(path, target, torch.device("cpu"), torch.float32)
    assert meta["config"] == drafter_config_json(loaded.config) and loaded.config.num_hidden_layers == 1
    assert _shares(loaded, target)

    # The loaded drafter drafts losslessly through the engine.
    spec = DrafterSpec("tiny-distilled", "distilled", "test")
    bundle = Bundle(Preset("tiny", "t", "tiny", (spec,), gamma=4), target, None, {spec.name: spec},
                    {spec.name: loaded})
    for p in prompts[:3]:
        _, s = run(bundle, p, policy="single:tiny-distilled", max_new_tokens=20)
        assert list(s.token_ids) == target_greedy(bundle, p, 20)


def test_draft_vocabulary_head_trains_saves_and_drafts_losslessly(tmp_path):
    torch.manual_seed(0)
    target = tiny_llama(vocab=48, layers=3, hidden=32, seed=5, scale=4.0)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 48, (n,), generator=gen).tolist() for n in (6, 9, 7, 11)]
    ex = answer_examples(target, prompts, max_new_tokens=12, eos_ids=set(), pad_id=0, batch_size=4, topk=8)

    # Ranked by the target's probability mass on the data, then filled up with the lowest ids.
    vocab = draft_vocabulary(ex, 20, 48)
    assert vocab.tolist() == sorted(set(vocab.tolist())) and len(vocab) == 20
    mass = torch.zeros(48)
    for e in ex:
        mass.index_add_(0, e.top_ids.reshape(-1), e.top_logp.exp().reshape(-1))
    assert set(mass.argsort(descending=True)[:5].tolist()) <= set(vocab.tolist())
    assert draft_vocabulary(ex, 100, 48).tolist() == list(range(48))

    drafter = make_drafter(target, layers=1, init_layer=0, draft_vocab=vocab)
    head = drafter.lm_head
    assert isinstance(head, DraftHead) and torch.equal(head.weight, target.lm_head.weight[vocab])
    before = agreement(drafter, ex)
    train(drafter, ex, steps=20, batch_size=4, lr=3e-3, warmup=3)
    assert agreement(drafter, ex)[0] < before[0]
    assert torch.equal(head.weight, target.lm_head.weight[vocab]), "the head's rows must stay the target's"

    path = tmp_path / "vocab-drafter.safetensors"
    save_drafter(drafter, path, {"domain": "test", "draft_vocab": 20})
    with safe_open(str(path), framework="pt") as f:
        assert torch.equal(f.get_tensor(DRAFT_VOCAB), vocab)
    loaded = load_distilled(path, target, torch.device("cpu"), torch.float32)
    assert torch.equal(loaded.lm_head.ids, vocab)
    with torch.no_grad():
        logits = loaded(torch.tensor([prompts[0]])).logits[0]
    outside = torch.ones(48, dtype=torch.bool)
    outside[vocab] = False
    assert torch.isinf(logits[:, outside]).all() and torch.isfinite(logits[:, vocab]).all()

    spec = DrafterSpec("tiny-distilled", "distilled", "test")
    bundle = Bundle(Preset("tiny", "t", "tiny", (spec,), gamma=4), target, None, {spec.name: spec},
                    {spec.name: loaded})
    for p in prompts:
        rounds, s = run(bundle, p, policy="single:tiny-distilled", max_new_tokens=24)
        assert list(s.token_ids) == target_greedy(bundle, p, 24)
        assert all(t in set(vocab.tolist()) for r in rounds for t in r.draft)
        assert sum(r.accepted for r in rounds) > 0


# ---------------------------------------------------------------------------------------------
# The shipped drafters (real offline model)

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Lucy has 23 marbles and wins 17 more, then loses 9. How many marbles does she have? Think step by step.",
    "Give me three tips for staying focused while studying.",
]


@pytest.mark.offline_model
def test_shipped_drafters_load_and_match_their_cards(offline):
    assert len(DISTILLED) >= 3
    total = 0
    for spec in DISTILLED:
        path = distilled_path(spec)
        assert path.exists(), f"{path} is missing"
        total += path.stat().st_size
        model = offline.models[spec.name]
        assert _shares(model, offline.target)
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata()
        assert meta["config"] == drafter_config_json(model.config)
        card = path.with_suffix(".md").read_text(encoding="utf-8")
        assert hashlib.sha256(path.read_bytes()).hexdigest() in card, f"{spec.name}: card sha256 is stale"
        assert f"{path.stat().st_size:,} bytes" in card
        recorded = json.loads(re.search(r"```json\n(.*?)\n```", card, re.S).group(1))
        assert recorded == json.loads(meta["config"]), f"{spec.name}: card config differs from the file"
    assert total <= MAX_BYTES
    assert len(offline.target.model.layers) == offline.target.config.num_hidden_layers == 30


def test_shipped_resumed_files_record_every_piece():
    """A shipped file trained in pieces (distilled or head) lists them all, their steps summing to the file's,
    and its card has a row for each."""
    from metasd.drafting.files import read_info

    resumed = 0
    for path in sorted(Path("assets/drafters").glob("*.safetensors")):
        _, info = read_info(path)
        pieces = info.get("pieces") or []
        if len(pieces) < 2:
            continue
        resumed += 1
        assert pieces[-1]["steps"] == info["steps"], path
        if "earlier" in info:  # written before the pieces replaced it: the two records agree
            assert sum(p["steps"] for p in pieces) == info["steps"] + info["earlier"]["steps"], path
        card = path.with_suffix(".md").read_text(encoding="utf-8")
        assert f"the last of {len(pieces)} pieces" in card, path
        assert all(f"| {n} |" in card for n in range(1, len(pieces) + 1)), path
    assert resumed >= 3  # code-eagle, math-eagle, math-drafter at least


@pytest.mark.offline_model
@pytest.mark.parametrize("name", [d.name for d in DISTILLED])
def test_shipped_drafter_is_lossless(offline, reference_model, name):
    for prompt in PROMPTS:
        _, ref = independent_greedy(reference_model, offline, prompt, 32)
        _, s = run(offline, prompt, policy=f"single:{name}", max_new_tokens=32)
        assert list(s.token_ids) == ref, f"{name} differs from the target on {prompt[:40]!r}"


def test_training_resumes_a_saved_drafter_in_pieces(tmp_path):
    """`--resume`: a second piece of training starts from the saved file (its weights, its draft vocabulary),
    and its card counts the steps of both pieces."""
    import argparse

    from metasd.drafting.files import read_info
    from metasd.training.train import run_distilled

    torch.manual_seed(0)
    target = tiny_llama(vocab=48, layers=3, hidden=32, seed=5, scale=4.0)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, 48, (n,), generator=gen).tolist() for n in (6, 9, 7, 11, 8, 10)]
    ex = answer_examples(target, prompts, max_new_tokens=12, eos_ids=set(), pad_id=0, batch_size=4, topk=8)
    bundle = Bundle(Preset("tiny", "t", "tiny-target", (), gamma=4), target, None, {}, {})

    def piece(out, resume: str = "", steps: int = 12) -> dict:
        a = argparse.Namespace(domain="code", out=str(out), resume=resume, draft_vocab=24, layers=1, init_layer=0,
                               steps=steps, batch_size=4, lr=3e-3, seed=0, budget_min=0.0, corpus="", prompts=6,
                               max_new_tokens=12, topk=8, eval_dir=None, bf16="auto")
        assert run_distilled(a, bundle, ex[:4], ex[4:], 1.0, 0, 0.0) == 0
        return read_info(out)[1]

    first = piece(tmp_path / "one.safetensors")
    second = piece(tmp_path / "two.safetensors", resume=str(tmp_path / "one.safetensors"), steps=8)
    # It starts where the first piece ended: the held-out agreement before it is the first piece's after.
    assert second["eval_agreement_before"] == first["eval_agreement"]
    assert second["steps"] == 8 and second["draft_vocab"] == 24 and "earlier" not in second  # pieces say it
    one = load_distilled(tmp_path / "one.safetensors", target, torch.device("cpu"), torch.float32)
    two = load_distilled(tmp_path / "two.safetensors", target, torch.device("cpu"), torch.float32)
    assert torch.equal(one.lm_head.ids, two.lm_head.ids)
    # Each piece keeps its own record, and the card has a row for each.
    assert [p["steps"] for p in second["pieces"]] == [12, 8]
    assert second["pieces"][0]["agreement"] == [first["eval_agreement"]]
    assert second["pieces"][1]["agreement_before"] == [first["eval_agreement"]]
    card = (tmp_path / "two.md").read_text()
    assert "the last of 2 pieces (`--resume`), 20 steps in all" in card
    assert len([x for x in card.splitlines() if x.startswith("| 1 |") or x.startswith("| 2 |")]) == 2
    third = piece(tmp_path / "three.safetensors", resume=str(tmp_path / "two.safetensors"), steps=4)
    assert [p["steps"] for p in third["pieces"]] == [12, 8, 4]
    assert "the last of 3 pieces (`--resume`), 24 steps in all" in (tmp_path / "three.md").read_text()


def test_a_file_from_before_pieces_resumes_with_what_it_kept():
    """A file written before `pieces` existed: its last run becomes a piece, the runs before it one summed row."""
    from metasd.training.common import earlier_pieces, pieces_lines

    old = {"steps": 1540, "train_seconds": 2101.3, "batch_size": 6, "lr": 0.0008, "corpus": "data/corpus",
           "eval_before": {"agreement": [0.61, 0.56]}, "eval": {"agreement": [0.76, 0.73]},
           "earlier": {"steps": 3336, "train_seconds": 2701.1}}
    pieces = earlier_pieces(old)
    assert pieces[0] == {"steps": 3336, "summed": True}
    assert pieces[1]["steps"] == 1540 and pieces[1]["agreement"] == [0.76, 0.73]
    assert earlier_pieces({}) == [] and earlier_pieces({"pieces": pieces}) == pieces
    lines = pieces_lines({"pieces": [*pieces, {"steps": 10}]}, "head")
    assert "the last of 3 pieces (`--resume`), 4,886 steps in all" in lines[0]
    assert any("0.610/0.560 -> 0.760/0.730" in x for x in lines)
    # One run, nothing resumed: no pieces lines at all.
    assert pieces_lines({"steps": 5}, "head") == []
