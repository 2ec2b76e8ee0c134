"""Policies that pick a drafter each round: bandits over arms with rewards in [0, 1].

Every policy answers `probabilities()`: the chance of each arm being chosen next round
(one-hot for deterministic rules). `update` takes the pulled arm and a reward per arm, None
where unknown: bandit feedback gives one number, full-information feedback gives all of them.

Sleeping arms (Kleinberg et al. 2010): `choose(awake)` and `probabilities(awake)` take a mask of
the arms that can play this round. A model-free drafter with nothing to propose (prompt lookup
without a match) is asleep: pulling it would be a plain target step. Policies choose among the
awake arms only; with no mask, or no arm awake, every arm counts as awake.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

Awake = Sequence[bool] | np.ndarray | None

# plan(arm, alpha) -> (expected tokens per millisecond of the round, draft length): the engine's
# model of a round with that drafter if a drafted position passes with probability alpha.
Plan = Callable[[int, float], tuple[float, int]]


@dataclass(frozen=True)
class Choice:
    """A policy's decision for one round."""

    arm: int
    probabilities: list[float]  # the chance each arm had of being chosen this round
    length: int | None = None  # 0: no drafter pays now, take a plain target step; None: the engine's draft length
    depths: tuple[int, ...] | None = None  # a tree round (metasd-tree): each arm's branch depth (0: not in the tree)


class Policy(ABC):
    name: str
    needs_full_info = False
    tree = False  # True: the engine plays token-tree rounds (metasd/decoding/tree_round.py) and calls decide_tree

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

    def decide(self, awake: Awake = None) -> Choice:
        """The round's decision: the arm, the distribution it was drawn from, a draft length if any."""
        probs = self.probabilities(awake)  # before choose(): EXP3's choose() keeps the distribution it drew from
        return Choice(self.choose(awake), probs)

    @abstractmethod
    def choose(self, awake: Awake = None) -> int: ...

    @abstractmethod
    def probabilities(self, awake: Awake = None) -> list[float]: ...

    def _awake(self, awake: Awake) -> np.ndarray:
        """The mask as a bool array; all arms when none is given or none is awake."""
        if awake is None:
            return np.ones(self.k, dtype=bool)
        m = np.asarray(awake, dtype=bool)
        return m if m.any() else np.ones(self.k, dtype=bool)

    def _masked(self, dist: np.ndarray, awake: Awake) -> np.ndarray:
        """A distribution over arms renormalised over the awake ones."""
        d = np.where(self._awake(awake), dist, 0.0)
        return d / d.sum() if d.sum() > 0 else self._awake(awake) / self._awake(awake).sum()

    def set_prior(self, means: Sequence[float | None], weight: float) -> None:
        """Start from `weight` pseudo-observations at each arm's prior mean (None: no prior for that arm).
        They count in the arms' means and observation counts, not in the rounds played."""
        for i, m in enumerate(means):
            if m is not None and weight > 0:
                self.n[i] += weight
                self.total[i] += weight * float(m)

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

    def choose(self, awake: Awake = None) -> int:
        return self.arm  # a single drafter plays even when asleep (a plain target step)

    def probabilities(self, awake: Awake = None) -> list[float]:
        return self._one_hot(self.arm)


class RoundRobin(Policy):
    name = "round-robin"

    def _next(self, awake: Awake) -> int:
        m = self._awake(awake)
        return next(i % self.k for i in range(self.t, self.t + self.k) if m[i % self.k])

    def choose(self, awake: Awake = None) -> int:
        return self._next(awake)

    def probabilities(self, awake: Awake = None) -> list[float]:
        return self._one_hot(self._next(awake))


class Uniform(Policy):
    name = "uniform"

    def choose(self, awake: Awake = None) -> int:
        return self.rng.choice(np.flatnonzero(self._awake(awake)).tolist())

    def probabilities(self, awake: Awake = None) -> list[float]:
        return self._masked(np.ones(self.k), awake).tolist()


class MetaSDUCB(Policy):
    """MetaSD-UCB: pull every arm once, then argmax_i mean_i + beta * sqrt(2 ln t / n_i)."""

    name = "metasd-ucb"

    def __init__(self, k: int, seed: int = 0, beta: float = 0.25) -> None:
        super().__init__(k, seed)
        self.beta = beta

    def _next(self, awake: Awake) -> int:
        m = self._awake(awake)
        unseen = np.flatnonzero(m & (self.n == 0))
        if unseen.size:
            return int(unseen[0])
        bonus = self.beta * np.sqrt(2.0 * math.log(max(self.t, 1)) / np.maximum(self.n, 1))
        return int(np.argmax(np.where(m, self.means + bonus, -np.inf)))

    def choose(self, awake: Awake = None) -> int:
        return self._next(awake)

    def probabilities(self, awake: Awake = None) -> list[float]:
        return self._one_hot(self._next(awake))


class CostAwareUCB(MetaSDUCB):
    """MetaSD-UCB whose optimism is spent on speed, not on agreement.

    The UCB index of an arm, min(1, mean + beta * sqrt(2 ln t / n)), is read as an optimistic
    per-position acceptance rate alpha (its reward is bd or be, both estimates of alpha). The
    engine's `plan` turns alpha into expected tokens per millisecond with that drafter's measured
    cost per drafted token and the measured verification cost on this hardware (fixed prices in a sampled run, so
    that its seed repeats; docs/DESIGN.md §1, formula 4 without assuming verification is free), maximised over the
    draft length 0..k. The arm with the fastest optimistic round is pulled, with its best draft length; length 0 is a plain target
    step, chosen when no drafter is even optimistically worth its cost (the arm then learns nothing
    that round and its bonus grows, so it is tried again later). Without a plan it is MetaSD-UCB.
    """

    name = "metasd-ucb-cost"
    # Less optimism than MetaSD-UCB's 0.25: the horizon is one request (50-100 rounds), so a pull of
    # a costly drafter must pay back within it. An arm at alpha 0.2 whose break-even is 0.3 (a
    # distilled drafter on this CPU) stays optimistic for ~2 ln t (beta / 0.1)^2 pulls: ~55 with
    # 0.25, ~9 with 0.1, ~2 with 0.05. Chosen on the Spec-Bench runs (docs/BENCHMARKS.md).
    default_beta = 0.05

    def __init__(self, k: int, seed: int = 0, beta: float | None = None, plan: Plan | None = None) -> None:
        beta = self.default_beta if beta is None else beta
        super().__init__(k, seed, beta)
        self.plan = plan  # the engine's cost model of a round (live: measured costs, fixed ones when sampling)
        self.length: int | None = None  # the draft length chosen with the last arm (None: no plan)

    def decide(self, awake: Awake = None) -> Choice:
        probs = self.probabilities(awake)
        arm = self.choose(awake)
        # Only "no drafter pays" is passed on; otherwise the engine's adaptive length follows the
        # drafter's recent runs (prompt lookup's drafts pass all-or-nothing, which the plan's i.i.d.
        # alpha understates).
        return Choice(arm, probs, 0 if self.length == 0 else None)

    def _next(self, awake: Awake) -> int:
        if self.plan is None:
            return super()._next(awake)
        m = self._awake(awake)
        unseen = np.flatnonzero(m & (self.n == 0))
        if unseen.size:
            self.length = None  # first pull of an arm: full length, to measure it
            return int(unseen[0])
        bonus = self.beta * np.sqrt(2.0 * math.log(max(self.t, 1)) / np.maximum(self.n, 1))
        alpha = np.clip(self.means + bonus, 0.0, 1.0)
        best, arm, length = (-1.0, -1.0), 0, 0
        for i in np.flatnonzero(m):
            v, kk = self.plan(int(i), float(alpha[i]))
            if (v, alpha[i]) > best:  # ties (plain steps all round) go to the most promising arm
                best, arm, length = (v, alpha[i]), int(i), kk
        self.length = length
        return arm


class MetaSDTree(MetaSDUCB):
    """MetaSD-Tree: each round a token tree of several arms' drafts, verified in one target pass.

    Per arm and depth j it keeps S_i(j), the chance that the first j ids of its branch all pass
    (greedy: all match argmax p; sampled: the product of per-position acceptance probabilities), from
    every round the arm was in the tree: each branch is verified whole, so the round is full
    information for every arm in it. Prompt lookup's all-or-nothing copies and a model drafter's
    decaying runs are both read as they are, not as an i.i.d. alpha. With UCB optimism on S (unseen:
    1), the expected accepted ids of a tree, arms taken as independent, is
    sum_j [1 - prod_i (1 - S_i(j) [j <= k_i])]; with the engine's measured costs (drafting ms per id,
    verification ms by ids fed, docs/DESIGN.md §4) the tree's value is expected tokens per ms. Depths
    grow greedily, one id or one arm's whole remaining draft at a time, while the value rises and the
    ids fit the budget; an arm never yet in a tree starts at its full length (UCB's first pull: two
    unseen arms would otherwise look like one, both optimistically perfect). Outside the engine's tree
    rounds (the playground) it is MetaSD-UCB.
    """

    name = "metasd-tree"
    tree = True
    depth_cap = 16

    def __init__(self, k: int, seed: int = 0, beta: float = 0.05) -> None:
        super().__init__(k, seed, beta)
        self.pass_sum = np.zeros((k, self.depth_cap + 1))  # sum over rounds of prod g[:j], per depth j
        self.pass_n = np.zeros((k, self.depth_cap + 1))  # rounds whose branch reached depth j
        self.extra_said = np.zeros(k)  # per arm: the chances its extra candidates claimed, summed
        self.extra_right = np.zeros(k)  # and what the target made of them (tree_round.calibrate_extras)

    def observe_tree(self, g: dict[int, list[float]]) -> None:
        """Per-position acceptance probabilities of every arm in the round's tree along its own branch."""
        for i, gi in g.items():
            run = 1.0
            for j, x in enumerate(gi[: self.depth_cap], start=1):
                run *= x
                self.pass_sum[i, j] += run
                self.pass_n[i, j] += 1

    def observe_extras(self, said: dict[int, float], right: dict[int, float]) -> None:
        for i, v in said.items():
            self.extra_said[i] += v
            self.extra_right[i] += right.get(i, 0.0)

    def extra_scale(self, i: int) -> float:
        """How far to trust arm i's stated chances for extra candidates: realised over claimed, shrunk
        towards 1 by one pseudo-node (a drafter's first claims are taken at their word)."""
        return float((self.extra_right[i] + 1.0) / (self.extra_said[i] + 1.0))

    def survival(self, i: int, kmax: int) -> list[float]:
        """Optimistic S_i(1..kmax): the chance the branch's first j ids pass, never rising with j."""
        out, prev = [], 1.0
        log_t = math.log(max(self.t, 2))
        for j in range(1, min(kmax, self.depth_cap) + 1):
            n = self.pass_n[i, j]
            est = 1.0 if n == 0 else self.pass_sum[i, j] / n + self.beta * math.sqrt(2.0 * log_t / n)
            prev = min(prev, est)
            out.append(prev)
        return out

    @staticmethod
    def value(depths: Sequence[int], surv: Sequence[Sequence[float]], ms: Sequence[float],
              cost: Callable[[int], float]) -> float:
        """Expected tokens per ms of a tree with these branch depths."""
        deepest = max(depths, default=0)
        expected = sum(1.0 - math.prod(1.0 - surv[i][j - 1] for i, k in enumerate(depths) if k >= j)
                       for j in range(1, deepest + 1))
        spent = sum(k * ms[i] for i, k in enumerate(depths)) + cost(1 + sum(depths))
        return (1.0 + expected) / max(spent, 1e-6)

    def decide_tree(self, awake: Awake, kmax: Sequence[int], ms: Sequence[float], cost: Callable[[int], float],
                    budget: int) -> Choice:
        """Each arm's depth (0: left out) within `budget` ids verified (the root counts), and each arm's
        share of the tree as the round's probabilities."""
        m = self._awake(awake)
        surv = [self.survival(i, kmax[i]) if m[i] else [] for i in range(self.k)]
        depths = [0] * self.k
        for i in range(self.k):  # an arm never in a tree joins at its full length once (UCB's first pull)
            if surv[i] and self.pass_n[i, 1] == 0:
                depths[i] = min(len(surv[i]), budget - 1 - sum(depths))
        best = self.value(depths, surv, ms, cost)
        while True:
            room = budget - 1 - sum(depths)
            moves = [(i, step) for i in range(self.k) for step in {1, len(surv[i]) - depths[i]}
                     if 0 < step <= room and depths[i] + step <= len(surv[i])]
            scored = [(self.value([d + (step if j == i else 0) for j, d in enumerate(depths)], surv, ms, cost), i, step)
                      for i, step in moves]
            if not scored or max(scored)[0] <= best:
                break
            best, i, step = max(scored)
            depths[i] += step
        total = sum(depths)
        lead = int(np.argmax(depths)) if total else self._next(awake)
        probs = [d / total for d in depths] if total else self._one_hot(lead)
        return Choice(lead, probs, length=depths[lead], depths=tuple(depths))


class EpsilonGreedy(Policy):
    name = "epsilon-greedy"

    def __init__(self, k: int, seed: int = 0, epsilon: float = 0.1) -> None:
        super().__init__(k, seed)
        self.epsilon = epsilon

    def _best(self, awake: Awake) -> int:
        m = self._awake(awake)
        unseen = np.flatnonzero(m & (self.n == 0))
        return int(unseen[0]) if unseen.size else int(np.argmax(np.where(m, self.means, -np.inf)))

    def choose(self, awake: Awake = None) -> int:
        if self.rng.random() < self.epsilon:
            return self.rng.choice(np.flatnonzero(self._awake(awake)).tolist())
        return self._best(awake)

    def probabilities(self, awake: Awake = None) -> list[float]:
        p = self.epsilon * self._masked(np.ones(self.k), awake)
        p[self._best(awake)] += 1.0 - self.epsilon
        return p.tolist()


class Exp3(Policy):
    """EXP3 (Auer et al. 2002) with importance-weighted reward estimates."""

    name = "exp3"

    def __init__(self, k: int, seed: int = 0, gamma: float = 0.1) -> None:
        super().__init__(k, seed)
        self.gamma = gamma
        self.log_w = np.zeros(k)

    def _dist(self, awake: Awake = None) -> np.ndarray:
        m = self._awake(awake)
        w = np.where(m, np.exp(self.log_w - self.log_w[m].max()), 0.0)
        return (1.0 - self.gamma) * w / w.sum() + self.gamma * m / m.sum()

    def choose(self, awake: Awake = None) -> int:
        self._last = self._dist(awake)  # the distribution the pull is drawn from: update's weights
        return self.rng.choices(range(self.k), weights=self._last.tolist())[0]

    def probabilities(self, awake: Awake = None) -> list[float]:
        return self._dist(awake).tolist()

    def update(self, arm: int, rewards: list[float | None]) -> None:
        dist = getattr(self, "_last", None)
        if dist is None:
            dist = self._dist()
        self._last = None
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

    def choose(self, awake: Awake = None) -> int:
        a, b = self._ab()
        m = self._awake(awake)
        draws = [self.rng.betavariate(a[i], b[i]) if m[i] else -1.0 for i in range(self.k)]
        return int(np.argmax(draws))

    def probabilities(self, awake: Awake = None) -> list[float]:
        # P(arm's sample is the highest), estimated with a generator of its own so that asking
        # does not change which arms are chosen.
        a, b = self._ab()
        g = np.random.default_rng(self.t)
        draws = np.where(self._awake(awake), g.beta(a, b, size=(self.samples, self.k)), -1.0)
        wins = np.bincount(draws.argmax(1), minlength=self.k)
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

    def _dist(self, awake: Awake = None) -> np.ndarray:
        eta = self.scale * math.sqrt(8.0 * math.log(max(self.k, 2)) / max(self.t, 1))
        z = eta * self.total
        return self._masked(np.exp(z - z.max()), awake)

    def choose(self, awake: Awake = None) -> int:
        return self.rng.choices(range(self.k), weights=self._dist(awake).tolist())[0]

    def probabilities(self, awake: Awake = None) -> list[float]:
        return self._dist(awake).tolist()


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

    def _next(self, awake: Awake) -> int:
        # The phase's arm in turn; if it is asleep, the next surviving arm that is awake; if every
        # survivor sleeps, the awake arm with the best mean so far.
        m = self._awake(awake)
        n = len(self.alive)
        order = [self.alive[(self.phase_t + j) % n] for j in range(n)]
        return next((i for i in order if m[i]), int(np.argmax(np.where(m, self.means, -np.inf))))

    def choose(self, awake: Awake = None) -> int:
        return self._next(awake)

    def probabilities(self, awake: Awake = None) -> list[float]:
        return self._one_hot(self._next(awake))

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
    for cls in (MetaSDUCB, CostAwareUCB, MetaSDTree, Exp3, Thompson, EpsilonGreedy, SequentialHalving, Hedge, RoundRobin, Uniform)
}
POLICY_HELP = {
    "metasd-ucb": "MetaSD-UCB (the paper's): optimism in the face of uncertainty",
    "metasd-ucb-cost": "MetaSD-UCB with a cost-aware index: the fastest optimistic round, plain steps when nothing pays",
    "metasd-tree": "several drafters at once: a token tree the bandit shapes, verified in one target pass",
    "exp3": "EXP3: adversarial bandit, exponential weights on importance-weighted rewards",
    "thompson": "Thompson sampling with Beta posteriors",
    "epsilon-greedy": "best mean so far, a random arm with probability epsilon",
    "sequential-halving": "explore evenly, halve the arms each phase, then commit",
    "hedge": "Hedge with full-information feedback (HedgeSpec)",
    "round-robin": "each drafter in turn",
    "uniform": "a drafter uniformly at random",
    "single:<drafter>": "one fixed drafter (plain speculative decoding)",
}


SINGLE_PREFIXES = ("single:", "fixed:")  # "fixed:" is the older spelling, still accepted


def single_drafter(name: object) -> str | None:
    """The drafter of a `single:<drafter>` method name, or None for any other name.

    The one place that parses the prefix: the engine, validation, the benchmark, the plots and the
    page all ask here.
    """
    if isinstance(name, str):
        for prefix in SINGLE_PREFIXES:
            if name.startswith(prefix):
                return name[len(prefix):]
    return None


def single_method(drafter: str) -> str:
    """The method name that runs one drafter alone."""
    return f"single:{drafter}"


def make_policy(name: str, arms: list[str], seed: int = 0, horizon: int = 64, plan: Plan | None = None) -> Policy:
    """A policy by name; `single:<drafter>` fixes one drafter. `horizon` is the expected number of
    rounds (sequential halving's budget); `plan` the engine's cost model (the cost-aware policy's)."""
    arm = single_drafter(name)
    if arm is not None:
        if arm not in arms:
            raise ValueError(f"policy {name!r}: drafter {arm!r} is not among {arms}")
        return Fixed(len(arms), seed, arm=arms.index(arm))
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_HELP)}")
    if name == "sequential-halving":
        return SequentialHalving(len(arms), seed, horizon=horizon)
    if name == CostAwareUCB.name:
        return CostAwareUCB(len(arms), seed, plan=plan)
    return POLICIES[name](len(arms), seed)
