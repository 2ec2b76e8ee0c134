"""Bandit playground: the drafter-selection problem with synthetic drafters, for teaching.

A synthetic drafter has a per-token acceptance rate alpha and a cost c (one drafter step over
one target step). One round drafts gamma tokens; position j passes with probability beta_j,
drawn around alpha (contexts differ, so some rounds are easy and some hard); the round keeps
the passing prefix and the target adds one token. So, per round (docs/DESIGN.md §1, formulas 3-4):

    E[tokens]  = (1 - alpha^(gamma+1)) / (1 - alpha)
    time       = gamma * c + 1            (in target steps; verifying gamma+1 tokens costs one)
    value      = E[tokens] / time         (tokens per target step: the speed-up)

Rewards the policy sees, all in [0, 1], as in the engine:
    bd          mean_j beta_j                               (block divergence: every position)
    be          accepted / gamma                            (block efficiency: the realised prefix)
    throughput  (accepted + 1) / ((gamma + 1) * time)       (tokens per unit time, cost-aware)

Regret is pseudo-regret against the drafter with the best value: in the time the chosen
drafter used, the best one would have produced value* x time tokens in expectation; the loss
is that minus the chosen drafter's expected tokens. With free drafters (c = 0) it is the usual
sum of E[tokens*] - E[tokens of the chosen arm].

Everything here is pure: numbers in, numpy arrays out, policies straight from metasd.bandits.policies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from metasd.bandits.policies import POLICIES, make_policy

REWARDS = ("bd", "be", "throughput")


@dataclass(frozen=True)
class SynthDrafter:
    name: str
    acceptance: float  # alpha: mean per-token acceptance probability, in [0, 1]
    cost: float = 0.0  # c: one drafter step / one target step, >= 0


@dataclass(frozen=True)
class SimResult:
    policy: str
    names: tuple[str, ...]
    probabilities: np.ndarray  # (rounds, arms): the policy's distribution before each round
    arms: np.ndarray  # (rounds,): the arm pulled
    tokens: np.ndarray  # (rounds,): tokens emitted (accepted + 1)
    time: np.ndarray  # (rounds,): the round's time in target steps
    regret: np.ndarray  # (rounds,): cumulative pseudo-regret in tokens
    values: np.ndarray  # (arms,): expected tokens per target step of each drafter
    best: int  # the drafter with the best value


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens per target call with i.i.d. acceptance alpha: (1 - alpha^(gamma+1)) / (1 - alpha)."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, gamma: int, cost: float) -> float:
    """Wall-clock speed-up over the target alone: E[tokens] / (gamma * c + 1)."""
    return expected_tokens(alpha, gamma) / (gamma * cost + 1.0)


def check_drafters(drafters: Sequence[SynthDrafter]) -> None:
    if not drafters:
        raise ValueError("the playground needs at least one drafter")
    for d in drafters:
        if not 0.0 <= d.acceptance <= 1.0:
            raise ValueError(f"{d.name}: acceptance must be between 0 and 1, got {d.acceptance}")
        if d.cost < 0:
            raise ValueError(f"{d.name}: cost must be >= 0, got {d.cost}")


def simulate(policy: str, drafters: Sequence[SynthDrafter], *, gamma: int = 4, rounds: int = 2000,
             reward: str = "bd", full_info: bool = False, spread: float = 8.0, seed: int = 0) -> SimResult:
    """Run `policy` for `rounds` rounds over synthetic drafters.

    `spread` is the concentration of beta_j ~ Beta(alpha*spread, (1-alpha)*spread) around alpha:
    small means contexts vary a lot. `full_info` scores every drafter every round (Hedge needs it).
    """
    check_drafters(drafters)
    if reward not in REWARDS:
        raise ValueError(f"unknown reward {reward!r}; choose one of {', '.join(REWARDS)}")
    if gamma < 1 or rounds < 1:
        raise ValueError("gamma and rounds must be at least 1")
    names = [d.name for d in drafters]
    k = len(drafters)
    full = full_info or POLICIES.get(policy) is not None and POLICIES[policy].needs_full_info
    pol = make_policy(policy, names, seed=seed, horizon=rounds)
    rng = np.random.default_rng(seed)

    alpha = np.array([d.acceptance for d in drafters], dtype=float)
    cost = np.array([d.cost for d in drafters], dtype=float)
    # Every drafter's per-position acceptance probabilities and coin flips, drawn up front.
    a = np.clip(alpha, 1e-6, 1 - 1e-6)[None, :, None] * spread
    b = np.clip(1 - alpha, 1e-6, 1 - 1e-6)[None, :, None] * spread
    beta = rng.beta(np.broadcast_to(a, (rounds, k, gamma)), np.broadcast_to(b, (rounds, k, gamma)))
    passed = rng.random((rounds, k, gamma)) < beta
    accepted = np.cumprod(passed, axis=2).sum(axis=2)  # (rounds, k): the passing prefix
    time_k = gamma * cost + 1.0
    if hasattr(pol, "plan"):
        # The cost-aware policy's round model here: a fixed draft length, verification costs one step.
        pol.plan = lambda i, a: (expected_tokens(a, gamma) / time_k[i], gamma)
    if reward == "bd":
        rew = beta.mean(axis=2)
    elif reward == "be":
        rew = accepted / gamma
    else:
        rew = (accepted + 1) / ((gamma + 1) * time_k[None, :])

    values = np.array([expected_tokens(x, gamma) for x in alpha]) / time_k
    e_tokens = values * time_k
    best = int(np.argmax(values))
    probs = np.zeros((rounds, k))
    arms = np.zeros(rounds, dtype=int)
    for t in range(rounds):
        probs[t] = pol.probabilities()
        i = pol.choose()
        arms[t] = i
        row = rew[t]
        pol.update(i, [float(x) for x in row] if full else [float(row[j]) if j == i else None for j in range(k)])
    tokens = accepted[np.arange(rounds), arms] + 1.0
    time = time_k[arms]
    regret = np.cumsum(values[best] * time - e_tokens[arms])
    return SimResult(policy, tuple(names), probs, arms, tokens, time, regret, values, best)


def compare(policies: Sequence[str], drafters: Sequence[SynthDrafter], **kwargs) -> list[SimResult]:
    """The same drafters (and the same random draws, by seed) under each policy."""
    return [simulate(p, drafters, **kwargs) for p in policies]
