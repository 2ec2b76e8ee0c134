"""Speculative decoding itself: a preset's models loaded into a Bundle, the round loop (engine.py) and token-tree
rounds, their ledger, the drafter lanes, prompts, kept prompt passes and the drafter catalog."""
