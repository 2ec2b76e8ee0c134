"""Policies that pick a drafter each round: bandits over arms with rewards in [0, 1].

Every policy answers `probabilities()`: the chance of each arm being chosen next round
(one-hot for deterministic rules). `update` takes the pulled arm and a reward per arm, None
where unknown: bandit feedback gives one number, full-information feedback gives all of them.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod

import numpy as np


class Policy(ABC):
    name: str
    needs_full_info = False

    def __init__(self, k: int, seed: int = 0) -> None:
        if k < 1:
            raise ValueError("a policy needs at least one arm")
        self.k = k
        self.rng = random.Random(seed)
        self.t = 0  # rounds played
        self.n = np.zeros(k)  # observations per arm
        self.total = np.zeros(k)  # reward sums per arm

    @property
    def means(self) -> np.ndarray:
        return np.divide(self.total, self.n, out=np.zeros(self.k), where=self.n > 0)

    @abstractmethod
    def choose(self) -> int: ...

    @abstractmethod
    def probabilities(self) -> list[float]: ...

    def update(self, arm: int, rewards: list[float | None]) -> None:
        self.t += 1
        for i, r in enumerate(rewards):
            if r is not None:
                self.n[i] += 1
                self.total[i] += r

    def _one_hot(self, i: int) -> list[float]:
        p = [0.0] * self.k
        p[i] = 1.0
        return p


class Fixed(Policy):
    """Always the same drafter: speculative decoding with a single drafter."""

    name = "fixed"

    def __init__(self, k: int, seed: int = 0, arm: int = 0) -> None:
        super().__init__(k, seed)
        self.arm = arm

    def choose(self) -> int:
        return self.arm

    def probabilities(self) -> list[float]:
        return self._one_hot(self.arm)


class RoundRobin(Policy):
    name = "round-robin"

    def choose(self) -> int:
        return self.t % self.k

    def probabilities(self) -> list[float]:
        return self._one_hot(self.t % self.k)


class Uniform(Policy):
    name = "uniform"

    def choose(self) -> int:
        return self.rng.randrange(self.k)

    def probabilities(self) -> list[float]:
        return [1.0 / self.k] * self.k


class MetaSDUCB(Policy):
    """MetaSD-UCB: pull every arm once, then argmax_i mean_i + beta * sqrt(2 ln t / n_i)."""

    name = "metasd-ucb"

    def __init__(self, k: int, seed: int = 0, beta: float = 0.25) -> None:
        super().__init__(k, seed)
        self.beta = beta

    def _next(self) -> int:
        unseen = np.flatnonzero(self.n == 0)
        if unseen.size:
            return int(unseen[0])
        bonus = self.beta * np.sqrt(2.0 * math.log(max(self.t, 1)) / self.n)
        return int(np.argmax(self.means + bonus))

    def choose(self) -> int:
        return self._next()

    def probabilities(self) -> list[float]:
        return self._one_hot(self._next())


class EpsilonGreedy(Policy):
    name = "epsilon-greedy"

    def __init__(self, k: int, seed: int = 0, epsilon: float = 0.1) -> None:
        super().__init__(k, seed)
        self.epsilon = epsilon

    def _best(self) -> int:
        unseen = np.flatnonzero(self.n == 0)
        return int(unseen[0]) if unseen.size else int(np.argmax(self.means))

    def choose(self) -> int:
        if self.rng.random() < self.epsilon:
            return self.rng.randrange(self.k)
        return self._best()

    def probabilities(self) -> list[float]:
        p = [self.epsilon / self.k] * self.k
        p[self._best()] += 1.0 - self.epsilon
        return p


class Exp3(Policy):
    """EXP3 (Auer et al. 2002) with importance-weighted reward estimates."""

    name = "exp3"

    def __init__(self, k: int, seed: int = 0, gamma: float = 0.1) -> None:
        super().__init__(k, seed)
        self.gamma = gamma
        self.log_w = np.zeros(k)

    def _dist(self) -> np.ndarray:
        w = np.exp(self.log_w - self.log_w.max())
        return (1.0 - self.gamma) * w / w.sum() + self.gamma / self.k

    def choose(self) -> int:
        return self.rng.choices(range(self.k), weights=self._dist().tolist())[0]

    def probabilities(self) -> list[float]:
        return self._dist().tolist()

    def update(self, arm: int, rewards: list[float | None]) -> None:
        dist = self._dist()
        super().update(arm, rewards)
        r = rewards[arm]
        if r is not None:
            self.log_w[arm] += self.gamma * (r / dist[arm]) / self.k


class Thompson(Policy):
    """Thompson sampling with Beta posteriors; a reward in [0, 1] counts as a fractional success."""

    name = "thompson"
    samples = 256  # Monte-Carlo draws for probabilities()

    def _ab(self) -> tuple[np.ndarray, np.ndarray]:
        return 1.0 + self.total, 1.0 + self.n - self.total

    def choose(self) -> int:
        a, b = self._ab()
        draws = [self.rng.betavariate(a[i], b[i]) for i in range(self.k)]
        return int(np.argmax(draws))

    def probabilities(self) -> list[float]:
        # P(arm's sample is the highest), estimated with a generator of its own so that asking
        # does not change which arms are chosen.
        a, b = self._ab()
        g = np.random.default_rng(self.t)
        wins = np.bincount(g.beta(a, b, size=(self.samples, self.k)).argmax(1), minlength=self.k)
        return (wins / self.samples).tolist()


class Hedge(Policy):
    """Hedge / exponential weights on full-information feedback (HedgeSpec).

    Every arm is scored on every verified chunk, so regret grows with log(number of arms).
    The learning rate follows the anytime rate sqrt(8 ln K / t).
    """

    name = "hedge"
    needs_full_info = True

    def __init__(self, k: int, seed: int = 0, scale: float = 1.0) -> None:
        super().__init__(k, seed)
        self.scale = scale

    def _dist(self) -> np.ndarray:
        eta = self.scale * math.sqrt(8.0 * math.log(max(self.k, 2)) / max(self.t, 1))
        z = eta * self.total
        w = np.exp(z - z.max())
        return w / w.sum()

    def choose(self) -> int:
        return self.rng.choices(range(self.k), weights=self._dist().tolist())[0]

    def probabilities(self) -> list[float]:
        return self._dist().tolist()


class SequentialHalving(Policy):
    """Sequential halving (Karnin et al. 2013) over an assumed horizon, then commit.

    Each phase splits its share of the budget evenly (round-robin) among the surviving arms and
    keeps the better half; after the last phase the survivor is played until the end.
    """

    name = "sequential-halving"

    def __init__(self, k: int, seed: int = 0, horizon: int = 64) -> None:
        super().__init__(k, seed)
        self.alive = list(range(k))
        phases = max(1, math.ceil(math.log2(k))) if k > 1 else 1
        self.per_phase = max(len(self.alive), horizon // (2 * phases))
        self.phase_t = 0
        self.phase_n = np.zeros(k)
        self.phase_total = np.zeros(k)

    def _next(self) -> int:
        return self.alive[self.phase_t % len(self.alive)]

    def choose(self) -> int:
        return self._next()

    def probabilities(self) -> list[float]:
        return self._one_hot(self._next())

    def update(self, arm: int, rewards: list[float | None]) -> None:
        super().update(arm, rewards)
        for i, r in enumerate(rewards):
            if r is not None:
                self.phase_n[i] += 1
                self.phase_total[i] += r
        self.phase_t += 1
        if len(self.alive) > 1 and self.phase_t >= self.per_phase:
            mean = {i: self.phase_total[i] / max(self.phase_n[i], 1) for i in self.alive}
            self.alive = sorted(self.alive, key=lambda i: -mean[i])[: math.ceil(len(self.alive) / 2)]
            self.alive.sort()
            self.phase_t = 0
            self.phase_n[:] = 0
            self.phase_total[:] = 0


POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (MetaSDUCB, Exp3, Thompson, EpsilonGreedy, SequentialHalving, Hedge, RoundRobin, Uniform)
}
POLICY_HELP = {
    "metasd-ucb": "MetaSD-UCB (the paper's): optimism in the face of uncertainty",
    "exp3": "EXP3: adversarial bandit, exponential weights on importance-weighted rewards",
    "thompson": "Thompson sampling with Beta posteriors",
    "epsilon-greedy": "best mean so far, a random arm with probability epsilon",
    "sequential-halving": "explore evenly, halve the arms each phase, then commit",
    "hedge": "Hedge with full-information feedback (HedgeSpec)",
    "round-robin": "each drafter in turn",
    "uniform": "a drafter uniformly at random",
    "single:<drafter>": "one fixed drafter (plain speculative decoding)",
}


def make_policy(name: str, arms: list[str], seed: int = 0, horizon: int = 64) -> Policy:
    """A policy by name; `single:<drafter>` fixes one drafter."""
    if name.startswith("single:") or name.startswith("fixed:"):
        arm = name.split(":", 1)[1]
        if arm not in arms:
            raise ValueError(f"policy {name!r}: drafter {arm!r} is not among {arms}")
        return Fixed(len(arms), seed, arm=arms.index(arm))
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_HELP)}")
    if name == "sequential-halving":
        return SequentialHalving(len(arms), seed, horizon=horizon)
    return POLICIES[name](len(arms), seed)
