"""MetaSD: lossless multi-drafter speculative decoding with a bandit choosing the drafter each round."""

from metasd.core.engine import generate, run, target_greedy
from metasd.core.events import RoundEvent, Summary
from metasd.core.validation import InvalidInput
from metasd.drafting.drafters import Draft, Drafter, Verified
from metasd.drafting.registry import load_plugins, register_drafter
from metasd.models.loading import Bundle, load_bundle
from metasd.models.presets import DEFAULT_PRESET, PRESETS

__all__ = ["generate", "run", "target_greedy", "RoundEvent", "Summary", "Bundle", "load_bundle",
           "DEFAULT_PRESET", "PRESETS", "InvalidInput", "Drafter", "Draft", "Verified", "register_drafter",
           "load_plugins"]
