"""Tiny randomly initialised models, built from a config, for fast tests on the CPU."""

from __future__ import annotations

import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from metasd.decoding.loading import Bundle, build_drafter_models
from metasd.models.presets import PROMPT_LOOKUP, TOKEN_RECYCLING, DrafterSpec, Preset


def tiny_llama(vocab: int = 32, layers: int = 2, hidden: int = 32, seed: int = 0, max_pos: int = 512,
               scale: float = 1.0) -> LlamaForCausalLM:
    """A random Llama. `scale` multiplies the output head: large makes p peaked, small makes it flat."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_pos,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval().requires_grad_(False)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def perturbed(model: LlamaForCausalLM, noise: float, seed: int = 1, vocab: int | None = None) -> LlamaForCausalLM:
    """A drafter close to `model`: same weights plus Gaussian noise, optionally another vocab size."""
    torch.manual_seed(seed)
    d = copy.deepcopy(model)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(noise * p.std() * torch.randn_like(p))
    if vocab is not None and vocab != model.config.vocab_size:
        d.resize_token_embeddings(vocab)
        with torch.no_grad():
            d.lm_head.weight[model.config.vocab_size :] = torch.randn_like(d.lm_head.weight[model.config.vocab_size :])
    return d.eval().requires_grad_(False)


def tiny_bundle(vocab: int = 32, seed: int = 0, noise: float = 0.3, drafter_vocab: int | None = None,
                tokenizer_vocab: int | None = None, scale: float = 1.0, tokenizer=None, layers: int = 2,
                hidden: int = 32, draft_vocab: tuple[int, ...] | None = None, window: int = 0,
                white_box: tuple[int, ...] | bool = False, head_window: int = 0) -> Bundle:
    """A bundle with every drafter kind: prompt lookup, token recycling, layer skip and a model drafter.

    With `draft_vocab`, also "tiny-distilled": a one-layer drafter on the target's embedding and
    head restricted to those ids (a DraftHead, as the offline preset's distilled drafters have).
    With `white_box`, also "tiny-eagle": an untrained white-box head (metasd/drafting/whitebox.py) on the target's
    hidden states, its layer copied from the target's last one; a tuple of ids restricts its head to them.
    """
    target = tiny_llama(vocab, layers=layers, hidden=hidden, seed=seed, scale=scale)
    specs = [
        PROMPT_LOOKUP,
        TOKEN_RECYCLING,
        DrafterSpec("layer-skip", "layer-skip", "the target's first layer", layers=(0,)),
        DrafterSpec("tiny-lm", "model", "a perturbed copy of the target", window=window),
    ]
    models = build_drafter_models(target, specs[:3], torch.device("cpu"), torch.float32, progress=lambda m: None)
    models["tiny-lm"] = perturbed(target, noise, seed=seed + 1, vocab=drafter_vocab)
    if draft_vocab is not None:
        from metasd.training.train import make_drafter

        specs.append(DrafterSpec("tiny-distilled", "distilled", "the target's first layer on a draft vocabulary"))
        models["tiny-distilled"] = make_drafter(target, 1, 0, torch.tensor(draft_vocab)).eval()
    if white_box is not False:
        from metasd.drafting.whitebox import HeadConfig, build_head

        ids = torch.tensor(white_box) if isinstance(white_box, tuple) else None
        specs.append(DrafterSpec("tiny-eagle", "white-box", "a white-box head on the target's features",
                                 window=head_window))
        models["tiny-eagle"] = build_head(target, HeadConfig.from_target(target.config), ids, init_layer=layers - 1).eval()
    preset = Preset("tiny", "tiny random models (tests)", "tiny", tuple(specs), gamma=4)
    return Bundle(preset, target, tokenizer, {s.name: s for s in specs}, models,
                  tokenizer_vocab=tokenizer_vocab or 0)


def independent_greedy(reference_model, bundle: Bundle, prompt: str, max_new_tokens: int) -> tuple[list[int], list[int]]:
    """(prompt ids, the target's own greedy continuation) from an independent copy of the target (the
    `reference_model` fixture), through the same chat template the engine uses."""
    from metasd.decoding.engine import encode_prompt

    ids = encode_prompt(bundle, prompt, True)
    inp = torch.tensor([ids])
    eos = sorted(bundle.eos_ids)
    out = reference_model.generate(inp, attention_mask=torch.ones_like(inp), do_sample=False,
                                   max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos[0])
    return ids, out[0, len(ids):].tolist()
