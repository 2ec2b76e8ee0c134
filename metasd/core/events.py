"""The immutable events that `generate` yields: one per round, then one summary.

The CLI, the app, the benchmark and the tests all consume this one stream.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class RoundEvent:
    """One round: a drafter proposed `draft`, the target verified it in one call."""

    round: int  # 1-based
    drafter: str  # the arm pulled this round
    draft: tuple[int, ...]  # token ids the drafter proposed
    accepted: int  # how many of them the target kept (a prefix of `draft`)
    emitted: tuple[int, ...]  # ids added to the output: draft[:accepted] + the target's own token
    target_token: int  # the correction after a rejection, or the bonus token
    bonus: bool  # True when every drafted token was accepted
    # Per drafted position: p(x), q(x) and the acceptance probability min(1, p/q) where known.
    p_draft: tuple[float, ...]
    q_draft: tuple[float, ...]
    accept_prob: tuple[float, ...]
    reward: float  # the reward of the pulled arm (the policy's reward kind)
    rewards: dict[str, float | None]  # every arm's reward where known (full information), else None
    probabilities: dict[str, float]  # the policy's distribution this round's arm was drawn from
    regret: float  # cumulative regret in tokens against the best drafter in hindsight
    regret_measured: bool  # True with full-information feedback, False for the estimate
    draft_ms: float
    verify_ms: float
    overhead_ms: float  # policy, rewards, bookkeeping of this round
    new_tokens: int  # total generated so far, after this round
    emitted_text: tuple[str, ...]  # text piece of each emitted id (may be "" mid-character)
    draft_text: tuple[str, ...]  # text piece of each drafted id, for showing rejected tokens
    # Per arm scored on this round's chunk: its acceptance probability at each emitted position (the pulled
    # arm: its drafted positions). Feeds the drafter lanes (metasd/decoding/lanes.py); not in run files' rounds.
    scores: dict[str, tuple[float, ...]] = field(default_factory=dict, compare=False)
    # Token-tree rounds (policy metasd-tree, metasd/decoding/tree.py); a chain round leaves them empty.
    # The fields above then describe the kept path: `drafter` is the arm credited most (its branch
    # holds every accepted node), `draft` its branch.
    ids_verified: int = 0  # ids the target read in this round's pass (the root and every node)
    tree_budget: int = 0  # the most ids the round could verify
    branches: tuple[dict[str, Any], ...] = ()  # the nodes off the kept branch, per drafter (tree.other_branches)
    tree_share: dict[str, float] = field(default_factory=dict)  # each arm's share of the tree's nodes
    credit: dict[str, float] = field(default_factory=dict)  # accepted ids per arm, a shared node split equally
    split_ms: dict[str, float] = field(default_factory=dict)  # the round's time by step
    regret_single: float = 0.0  # tokens: best single arm in hindsight minus the tree's (may be < 0)
    regret_tree_ms: float = 0.0  # ms: time spent beyond the best tree in hindsight (the kept branch alone)
    # The kept branch was one of `drafter`'s other candidates (Drafter.alternatives), not the chain it drafts
    # alone: its lane (what it predicts teacher-forced) need not agree with `draft`.
    draft_extra: bool = False

    def to_json(self) -> dict[str, Any]:
        """The round as in the `--json` contract of docs/DESIGN.md §3, plus extra fields."""
        d = asdict(self)
        d.pop("scores")  # the run file carries the lanes whole, at the top level
        for key in ("draft", "emitted", "p_draft", "q_draft", "accept_prob", "emitted_text", "draft_text", "branches"):
            d[key] = list(d[key])
        return d


@dataclass(frozen=True)
class DrafterStats:
    name: str
    pulls: int
    drafted: int
    accepted: int
    mean_reward: float
    draft_s: float
    verify_s: float

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass(frozen=True)
class Summary:
    """The end of a generation."""

    prompt: str
    text: str
    token_ids: tuple[int, ...]  # generated ids only
    new_tokens: int
    target_calls: int
    mean_accepted: float  # mean accepted draft tokens per target call
    wall_s: float
    tokens_per_s: float
    draft_s: float
    verify_s: float
    overhead_s: float
    prefill_s: float
    stop_reason: str  # "eos", "max_new_tokens", "stopped" or "context"
    regret: float
    regret_measured: bool
    drafters: tuple[DrafterStats, ...] = field(default_factory=tuple)
    config: dict[str, Any] = field(default_factory=dict)
    ids_verified: int = 0  # ids the target read in all verification passes (not the prefill)

    def stats_json(self) -> dict[str, Any]:
        return {
            "ids_verified": self.ids_verified,
            "ids_per_call": self.ids_verified / self.target_calls if self.target_calls else 0.0,
            "new_tokens": self.new_tokens,
            "target_calls": self.target_calls,
            "mean_accepted": self.mean_accepted,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "overhead_s": self.overhead_s,
            "prefill_s": self.prefill_s,
            "stop_reason": self.stop_reason,
            "regret": self.regret,
            "regret_measured": self.regret_measured,
            "drafters": {
                s.name: {
                    "pulls": s.pulls,
                    "drafted": s.drafted,
                    "accepted": s.accepted,
                    "acceptance_rate": s.acceptance_rate,
                    "mean_reward": s.mean_reward,
                    "draft_s": s.draft_s,
                    "verify_s": s.verify_s,
                }
                for s in self.drafters
            },
        }


Event = RoundEvent | Summary
