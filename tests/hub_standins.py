"""Tiny stand-ins for the hub presets' checkpoints, in a Hugging Face cache laid out as the hub lays it out.

Every repository a hub preset names (its target and its model drafters) gets a 2-layer Qwen2 with the real
repository's id, tying and relative vocabulary size, written as `models--<org>--<name>/snapshots/<commit>/`
with `refs/main` and content-addressed `blobs/`, so `metasd.decoding.loading.load_bundle` runs its real code path
(`from_pretrained(<hub id>)`, safetensors only) with `HF_HUB_OFFLINE=1` and `HF_HUB_CACHE` pointing here.

What is kept from the real checkpoints, scaled down:

- embedding rows: 151936 for every repository but Qwen2.5-7B-Instruct's 152064, i.e. 128 more; here
  1024 and 1152, with one shared tokenizer of fewer ids than either (as Qwen's 151665);
- tied input/output embeddings for the small models, a separate head for the 7B;
- the generation_config.json of an instruct checkpoint, sampling defaults and repetition penalty
  included, so a reference that trusted those defaults would not be greedy;
- a real byte-level BPE tokenizer with a ChatML chat template, so prompts go through the template.

The drafters are noisy copies of one base model and the targets that base itself (the 7B with its head
padded), so drafts are sometimes accepted and sometimes not, as with real drafters.

    python -m tests.hub_standins DIR     # write the stand-ins into the cache DIR (used by gpu_bench.sh --dry-run)
    HF_HUB_CACHE=DIR HF_HUB_OFFLINE=1 python -m tests.hub_standins --check   # load and run them (JSON out)
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from metasd.models.presets import PRESETS

ROOT = Path(__file__).resolve().parent.parent

# Embedding rows of the real checkpoints (config.json vocab_size): all 151936 but the 7B's.
REAL_ROWS = {"Qwen/Qwen2.5-7B-Instruct": 152064}
REAL_ROWS_DEFAULT = 151936
STANDIN_ROWS = 1024  # what 151936 becomes here; 152064 becomes STANDIN_ROWS + 128
UNTIED = {"Qwen/Qwen2.5-7B-Instruct"}  # the small Qwen2.5 checkpoints tie their head to the embedding
HIDDEN, LAYERS, HEADS, KV_HEADS = 64, 2, 4, 2
TOKENIZER_IDS = 1000  # fewer than any embedding table, as Qwen's tokenizer has fewer ids than its rows
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# A ChatML template (the format Qwen2.5 uses), with a default system turn.
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if loop.first and m['role'] != 'system' -%}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{%- endif -%}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)
NOISE = 0.1  # drafters: the base model's weights plus this much Gaussian noise (relative to each tensor's std)


def hub_repos() -> list[str]:
    """Every repository a hub preset loads: targets, then model drafters, each once."""
    repos: list[str] = []
    for p in PRESETS.values():
        if "hub" not in p.tags:
            continue
        for r in [p.target, *(d.model_id for d in p.drafters if d.kind == "model")]:
            if r and r not in repos:
                repos.append(r)
    return repos


def standin_rows(repo: str) -> int:
    return STANDIN_ROWS + REAL_ROWS.get(repo, REAL_ROWS_DEFAULT) - REAL_ROWS_DEFAULT


def is_target(repo: str) -> bool:
    return any(p.target == repo for p in PRESETS.values() if "hub" in p.tags)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE of TOKENIZER_IDS ids trained on the page's examples, with a ChatML chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    examples = json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))
    corpus = [e["turns"][0] for e in examples]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_IDS, special_tokens=list(SPECIAL), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _config(rows: int, tied: bool, tok: PreTrainedTokenizerFast) -> Qwen2Config:
    return Qwen2Config(vocab_size=rows, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
                       num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=32768,
                       tie_word_embeddings=tied, initializer_range=0.5,
                       bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
                       eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), architectures=["Qwen2ForCausalLM"])


def _generation_config(tok: PreTrainedTokenizerFast) -> GenerationConfig:
    """An instruct checkpoint's shipped defaults: sampling on, and a repetition penalty."""
    end, im_end = tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")
    return GenerationConfig(bos_token_id=end, pad_token_id=end, eos_token_id=[im_end, end], do_sample=True,
                            temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)


def build_models(tok: PreTrainedTokenizerFast) -> dict[str, Qwen2ForCausalLM]:
    """repo id -> stand-in model. Ids the tokenizer lacks get zero rows in every head (never the argmax of a
    random model whose other logits spread both ways) so outputs stay decodable."""
    torch.manual_seed(0)
    n_tok = len(tok)
    base = Qwen2ForCausalLM(_config(STANDIN_ROWS, True, tok)).eval()
    out: dict[str, Qwen2ForCausalLM] = {}
    for i, repo in enumerate(hub_repos()):
        rows, tied = standin_rows(repo), repo not in UNTIED
        model = Qwen2ForCausalLM(_config(rows, tied, tok)).eval()
        g = torch.Generator().manual_seed(1000 + i)
        with torch.no_grad():
            for name, p in model.named_parameters():
                src = base.get_parameter(name.replace("lm_head.", "model.embed_tokens."))
                n = min(p.shape[0], src.shape[0])
                p.zero_()
                p[:n] = src[:n]
                if not is_target(repo):  # a drafter: close to the targets, not equal
                    p[:n] += NOISE * src[:n].std() * torch.randn(src[:n].shape, generator=g)
            for emb in {id(m): m for m in (model.get_input_embeddings(), model.get_output_embeddings())}.values():
                emb.weight[n_tok:] = 0.0
        model.generation_config = _generation_config(tok)
        out[repo] = model
    return out


def commit_of(repo: str) -> str:
    """The (made-up, stable) commit a stand-in repository's refs/main names."""
    return hashlib.sha1(f"metasd-standin:{repo}".encode()).hexdigest()


def write_repo(cache: Path, repo: str, files: Path) -> Path:
    """Lay `files` out as the hub cache does: blobs/<sha256>, snapshots/<commit>/<name> -> ../../blobs/<sha256>,
    refs/main = <commit>. Returns the snapshot folder."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    commit = commit_of(repo)
    snap = folder / "snapshots" / commit
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    (folder / "refs").mkdir(exist_ok=True)
    for f in sorted(files.iterdir()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        blob = folder / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(f, blob)
        link = snap / f.name
        link.unlink(missing_ok=True)
        link.symlink_to(Path("..") / ".." / "blobs" / digest)
    (folder / "refs" / "main").write_text(commit)
    return snap


def build_cache(cache: Path) -> dict[str, Path]:
    """Write every hub preset's stand-in into the cache folder `cache`; repo id -> snapshot folder."""
    cache.mkdir(parents=True, exist_ok=True)
    tok = tiny_tokenizer()
    snaps: dict[str, Path] = {}
    for repo, model in build_models(tok).items():
        with tempfile.TemporaryDirectory(prefix="standin-") as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)  # every real repository ships the same tokenizer files
            snaps[repo] = write_repo(cache, repo, Path(tmp))
    return snaps


def hub_env(cache: Path) -> dict[str, str]:
    """Environment for a process that must find the stand-ins and nothing else: the cache, offline."""
    return {"HF_HUB_CACHE": str(cache), "HF_HOME": str(cache.parent / "hf-home"), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


PROMPTS = (
    "Repeat after me: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat.",
    "Write a Python function that returns the sum of a list of numbers.",
)


def check(max_new_tokens: int = 24) -> dict:
    """Load every hub preset as the app does (the environment must point at the stand-ins, offline) and run
    every policy and every single drafter on PROMPTS, next to `target_greedy`. Returns what the test asserts."""
    from metasd.bandits.policies import POLICIES
    from metasd.decoding.engine import encode_prompt, run, target_greedy
    from metasd.decoding.loading import load_bundle

    report: dict = {}
    for name, preset in PRESETS.items():
        if "hub" not in preset.tags:
            continue
        b = load_bundle(name, device="cpu", progress=lambda m: None)  # dtype: the preset's own ("auto")
        gc = b.target.generation_config
        entry: dict = {
            "dtype": str(b.target.dtype), "target_rows": b.target_vocab, "tokenizer_ids": b.tokenizer_vocab,
            "drafter_rows": {n: m.get_output_embeddings().weight.shape[0] for n, m in b.models.items()},
            "target_tied": b.target.get_input_embeddings().weight is b.target.get_output_embeddings().weight,
            "target_source": b.target.name_or_path,
            "generation_config": {k: getattr(gc, k, None) for k in ("do_sample", "repetition_penalty", "temperature")},
            "chat_prefix": b.tokenizer.convert_ids_to_tokens(encode_prompt(b, "hi", True)[:1]),
            "runs": [],
        }
        policies = [*POLICIES, *(f"single:{d}" for d in b.drafter_names)]
        settings = [{"policy": p} for p in policies]
        settings += [{"policy": "metasd-ucb", "full_info": True, "reward": r} for r in ("bd", "be", "throughput")]
        for prompt in PROMPTS:
            ref = target_greedy(b, encode_prompt(b, prompt, True), max_new_tokens)
            for st in settings:
                rounds, summary = run(b, prompt, max_new_tokens=max_new_tokens, **st)
                accepted: dict[str, int] = {}
                for r in rounds:
                    accepted[r.drafter] = accepted.get(r.drafter, 0) + r.accepted
                entry["runs"].append({**st, "prompt": prompt, "ours": list(summary.token_ids), "reference": ref,
                                      "accepted": accepted, "text": summary.text})
        entry["shared"] = shared_rounds(b)
        report[name] = entry
    return report


def shared_rounds(b, max_new_tokens: int = 16, block: int = 16) -> dict:
    """The preset's target in shared rounds as a GPU server runs them (metasd.serving.batch.Rounds, row-wise layers
    in calls of `block` rows): three requests at once, against each one's solo run through the engine."""
    from metasd.decoding.engine import collect, generate, prepare, steps
    from metasd.serving.batch import Rounds, row_invariant

    prompts = [*PROMPTS, "Name three colours of the rainbow."]
    kw = {"max_new_tokens": max_new_tokens, "policy": "metasd-ucb"}
    solo = [[t for r in collect(generate(b, p, **kw))[0] for t in r.emitted] for p in prompts]
    rounds = Rounds(b.target, max_batch=len(prompts), idle_s=1.0, block=block)
    reqs = [prepare(b, p, **kw) for p in prompts]
    streams = [rounds.submit(req, steps(req, None)) for req in reqs]
    together = [[t for r in collect(s)[0] for t in r.emitted] for s in streams]
    return {"invariant": row_invariant(b.target, block=block), "share": rounds.share, "most": rounds.most,
            "solo": solo, "together": together}


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--check":
        print(json.dumps(check()))
    elif len(sys.argv) == 2:
        for repo, snap in build_cache(Path(sys.argv[1])).items():
            print(f"{repo}: {snap}", file=sys.stderr)
    else:
        sys.exit("usage: python -m tests.hub_standins CACHE_DIR | --check (with HF_HUB_CACHE set to such a folder)")
