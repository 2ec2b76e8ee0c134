"""A request's books, kept apart from its generation state (metasd/decoding/engine.py, Request):

- `Ledger`: what it has produced and what each arm did (pulls, drafted, accepted, rewards, the tokens
  used for regret), and the regret itself;
- `RequestClock`: when it started, its prefill, and where its time went (drafting, verifying, overhead),
  charged from each round's `Clock`;
- `EventBuilder`: the text pieces of its ids and the events a consumer sees (the chain's RoundEvent and the
  Summary; a token-tree round's event is built in metasd/decoding/tree_round.py from the same parts).

The chain engine and the token-tree rounds write the same books, so their totals mean the same thing.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from metasd.core.events import DrafterStats, RoundEvent, Summary
from metasd.decoding import lanes

# `req` below is a metasd.decoding.engine.Request and `r` its Round: not imported, the engine imports this module.


class Clock:
    """Named time spans of a round: `lap(name)` charges the time since the last lap to `name`."""

    def __init__(self) -> None:
        self.t = time.perf_counter()
        self.spans: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.spans[name] = self.spans.get(name, 0.0) + now - self.t
        self.t = now

    def skip(self, name: str, seconds: float) -> None:
        """Charge `seconds` to `name` instead of the time since the last lap (which was spent elsewhere)."""
        self.spans[name] = self.spans.get(name, 0.0) + seconds
        self.t = time.perf_counter()

    def __getitem__(self, name: str) -> float:
        return self.spans.get(name, 0.0)


class RequestClock:
    """A request's time: since it started (the wall clock of its summary), its prefill, and the rounds' time
    by kind, summed."""

    def __init__(self) -> None:
        self.t_start = time.perf_counter()
        self.prefill_s = 0.0  # the prompt's pass runs with the first round: in the thread that drives us
        self.draft_s = self.verify_s = self.overhead_s = 0.0

    def charge(self, drafted: float, verify: float, overhead: float) -> None:
        self.draft_s += drafted
        self.verify_s += verify
        self.overhead_s += overhead

    @property
    def wall(self) -> float:
        return time.perf_counter() - self.t_start


class ArmStats:
    """Per-request statistics of one drafter."""

    def __init__(self) -> None:
        self.pulls = self.drafted = self.accepted = 0
        self.reward_sum = 0.0
        self.rewarded = 0  # pulls whose reward the policy saw (a plain step by choice is not one)
        self.tokens_sum = 0.0  # realised tokens per target call, summed over pulls
        self.draft_s = self.verify_s = 0.0
        self.scored_tokens = 0.0  # full information: expected tokens per call, summed over rounds

    def pulled(self, drafted: int, accepted: int, reward: float | None, draft_s: float) -> None:
        """One pull: `accepted` of `drafted` ids kept; `reward` as the policy saw it (None: it saw none)."""
        self.pulls += 1
        self.drafted += drafted
        self.accepted += accepted
        if reward is not None:  # the mean reward is of what the policy saw
            self.reward_sum += reward
            self.rewarded += 1
        self.tokens_sum += accepted + 1
        self.draft_s += draft_s

    def stats(self, name: str) -> DrafterStats:
        mean = self.reward_sum / self.rewarded if self.rewarded else 0.0
        return DrafterStats(name, self.pulls, self.drafted, self.accepted, mean, self.draft_s, self.verify_s)


class Ledger:
    """What a request produced and what each of its arms did; its regret against the best arm in hindsight."""

    def __init__(self, names: list[str]) -> None:
        self.arms = {n: ArmStats() for n in names}
        self.generated: list[int] = []
        self.new_tokens = self.target_calls = self.accepted = self.rounds = 0
        self.ids_fed = 0  # ids read by the target's verification passes
        self.regret = 0.0
        self.chosen_scored = 0.0  # measured regret: expected tokens of what was actually played
        self.tree_single: list[float] | None = None  # token trees: each arm's tokens had it drafted alone
        self.regret_tree_ms = 0.0  # token trees: time spent beyond the best tree in hindsight

    def count(self, emitted: list[int], accepted: int, fed: int) -> None:
        """One verification pass: the ids it emitted, how many drafted ids it accepted, how many ids it read."""
        self.generated.extend(emitted)
        self.new_tokens += len(emitted)
        self.target_calls += 1
        self.accepted += accepted
        self.ids_fed += fed

    def add_estimated_regret(self, name: str) -> None:
        """Estimated pseudo-regret: the gap between the best arm's mean tokens per call and the pulled arm's,
        both as estimated so far (never negative)."""
        a = self.arms[name]
        means = [x.tokens_sum / x.pulls for x in self.arms.values() if x.pulls]
        self.regret += max(means) - a.tokens_sum / a.pulls

    def measure_regret(self) -> None:
        """Measured regret (full information): the best arm in hindsight's expected tokens minus ours."""
        self.regret = max(a.scored_tokens for a in self.arms.values()) - self.chosen_scored

    def drafter_stats(self) -> tuple[DrafterStats, ...]:
        return tuple(a.stats(n) for n, a in self.arms.items())


class TextPieces:
    """Incremental detokenisation: the text each new id adds (held back mid-character)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix = self.read = 0

    def piece(self, ids: list[int]) -> str:
        if self.tok is None:
            return "".join(f"<{i}>" for i in ids)
        return self.tok.decode(ids, skip_special_tokens=True)

    def push(self, new: list[int]) -> list[str]:
        out = []
        for t in new:
            self.ids.append(t)
            before = self.piece(self.ids[self.prefix : self.read])
            after = self.piece(self.ids[self.prefix :])
            if len(after) > len(before) and not after.endswith("\ufffd"):
                out.append(after[len(before) :])
                self.prefix, self.read = self.read, len(self.ids)
            else:
                out.append("")
        return out


class EventBuilder:
    """The events of one request, from its books: a chain round's RoundEvent and the final Summary."""

    def __init__(self, tokenizer: Any) -> None:
        self.pieces = TextPieces(tokenizer)

    def round_event(self, req: Any, r: Any, clock: Clock) -> RoundEvent:
        """A chain round's event, with its time split: drafting (with the sleeping arms' drafts and the
        scoring of other arms), verifying, and the engine's own bookkeeping."""
        text = self.pieces.push(r.emitted)
        draft_text = [self.pieces.piece([t]) for t in r.tokens]
        clock.lap("emit")
        drafted = clock["wake"] + clock["draft"] + clock["score"]
        overhead = clock["pick"] + clock["accept"] + clock["learn"] + clock["emit"]
        req.clock.charge(drafted, clock["verify"], overhead)
        v, names, led = r.verdict, req.names, req.ledger
        reward_shown = r.rewards[r.arm] if req.st.full_info else r.reward  # what the policy learnt
        return RoundEvent(
            round=led.rounds, drafter=names[r.arm], draft=tuple(r.tokens), accepted=v.accepted,
            emitted=tuple(r.emitted), target_token=v.token, bonus=bool(r.tokens) and v.accepted == len(r.tokens),
            p_draft=tuple(v.p_draft), q_draft=tuple(v.q_draft), accept_prob=tuple(v.accept_prob),
            reward=reward_shown, rewards=dict(zip(names, r.rewards, strict=True)),
            probabilities=dict(zip(names, r.choice.probabilities, strict=True)), regret=max(led.regret, 0.0),
            regret_measured=req.st.full_info, draft_ms=1000 * drafted, verify_ms=1000 * clock["verify"],
            overhead_ms=1000 * overhead, new_tokens=led.new_tokens, emitted_text=tuple(text),
            draft_text=tuple(draft_text), scores=lanes.round_scores(names, r), ids_verified=len(r.inputs),
        )

    def summary(self, req: Any) -> Summary:
        wall, led, c, st = req.clock.wall, req.ledger, req.clock, req.st
        tok = req.bundle.tokenizer
        text = tok.decode(led.generated, skip_special_tokens=True) if tok else " ".join(map(str, led.generated))
        return Summary(
            prompt=req.prompt, text=text, token_ids=tuple(led.generated), new_tokens=led.new_tokens,
            target_calls=led.target_calls, mean_accepted=led.accepted / led.target_calls if led.target_calls else 0.0,
            wall_s=wall, tokens_per_s=led.new_tokens / wall if wall > 0 else 0.0, draft_s=c.draft_s,
            verify_s=c.verify_s, overhead_s=c.overhead_s, prefill_s=c.prefill_s, stop_reason=req.stop_reason,
            regret=max(led.regret, 0.0), regret_measured=st.full_info or req.policy.tree,
            drafters=led.drafter_stats(),
            # The settings as run, plus the older names of two of them and what sleeping came to.
            config={"preset": req.bundle.preset.name, **asdict(st), "drafters": list(st.drafters),
                    "adaptive_gamma": st.adaptive, "sleeping_arms": req.sleeping,
                    "priors_weight": req.priors.weight if req.priors else 0.0,
                    "prices_from": req.prices.source if req.prices is not None else "measured"},
            ids_verified=led.ids_fed,
        )
