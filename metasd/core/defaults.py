"""One set of request defaults for the page, its web API (/generate) and the CLI.

A request that leaves a setting out gets the value here, wherever it comes from: the page, /generate,
the CLI and the library's own `generate()` / `run()` (whose `Settings`, metasd/core/validation.py, take
their defaults from here); `describe()` is the line that `python -m metasd generate --help` and
/generate's API description show.
"""

from __future__ import annotations

# The cost-aware MetaSD-UCB: on a CPU, where a rejected draft costs time, it can decide that no drafter
# is worth its cost this round; the paper's metasd-ucb stays one option away.
POLICY = "metasd-ucb-cost"
REWARD = "bd"  # block divergence, MetaSD's reward
GAMMA: int | None = None  # None: the preset's own draft length (Preset.gamma: 4 offline, 5 on the qwen presets)
MAX_NEW_TOKENS = 128
TEMPERATURE = 0.0  # greedy
TOP_P = 1.0  # no nucleus cut
TOP_K = 0  # no top-k cut
SEED = 0
FULL_INFO = False
COLD = False  # start from the preset's informed priors
# Per-arm draft-length caps after a miss: off, since a cap set by the last round's miss cut drafts the target
# would have kept (2-12% more calls on Spec-Bench) while a pass over 1-6 ids costs about one step on the CPU.
ADAPTIVE = False
# What the plans of the cost-aware policies read: "auto" fixed prices when sampling (a seed then repeats under every
# policy) and the clock when greedy (the output is the target's either way), "measured" or "fixed" always.
PRICES = "auto"


def describe() -> str:
    """The defaults in one line, as --help and the API description show them."""
    gamma = "the preset's" if GAMMA is None else str(GAMMA)
    return (f"defaults: policy {POLICY}, reward {REWARD}, gamma {gamma}, max_new_tokens {MAX_NEW_TOKENS}, "
            f"temperature {TEMPERATURE:g} (greedy), top_p {TOP_P:g}, top_k {TOP_K}, seed {SEED}, "
            f"informed priors {'off' if COLD else 'on'}")
