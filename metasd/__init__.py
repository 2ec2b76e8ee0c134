"""MetaSD: lossless multi-drafter speculative decoding with a bandit choosing the drafter each round."""

from metasd.drafters import Draft, Drafter, Verified
from metasd.engine import generate, run, target_greedy
from metasd.events import RoundEvent, Summary
from metasd.models import Bundle, load_bundle
from metasd.presets import DEFAULT_PRESET, PRESETS
from metasd.registry import load_plugins, register_drafter
from metasd.validation import InvalidInput

__all__ = ["generate", "run", "target_greedy", "RoundEvent", "Summary", "Bundle", "load_bundle",
           "DEFAULT_PRESET", "PRESETS", "InvalidInput", "Drafter", "Draft", "Verified", "register_drafter",
           "load_plugins"]
