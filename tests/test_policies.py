"""Bandits on synthetic arms: they find the best drafter, regret grows sublinearly, and
`probabilities()` is a distribution that matches how the policy actually chooses."""

from __future__ import annotations

import random

import numpy as np
import pytest

from metasd.bandits.policies import POLICIES, Choice, make_policy

MEANS = [0.35, 0.5, 0.65, 0.45]  # Bernoulli arms; arm 2 is the best
ARMS = [f"d{i}" for i in range(len(MEANS))]


def play(name: str, rounds: int, full_info: bool, seed: int = 0) -> tuple[np.ndarray, list[int]]:
    """Pseudo-regret after each round, and the arms pulled."""
    pol = make_policy(name, ARMS, seed=seed, horizon=rounds)
    rng = random.Random(seed + 100)
    regret, pulled, best = [], [], max(MEANS)
    total = 0.0
    for _ in range(rounds):
        a = pol.choose()
        draws = [1.0 if rng.random() < m else 0.0 for m in MEANS]
        pol.update(a, draws if full_info else [draws[i] if i == a else None for i in range(len(MEANS))])
        total += best - MEANS[a]
        regret.append(total)
        pulled.append(a)
    return np.array(regret), pulled


@pytest.mark.parametrize("name,full_info", [("metasd-ucb", False), ("hedge", True), ("thompson", False),
                                            ("exp3", False), ("metasd-ucb", True)])
def test_concentrates_on_best_arm_with_sublinear_regret(name, full_info):
    regret, pulled = play(name, 8000, full_info)
    late = pulled[4000:]
    share = late.count(2) / len(late)
    assert share > (0.6 if name == "exp3" else 0.85), f"{name} pulled the best arm {share:.0%} of late rounds"
    # Sublinear: quadrupling the horizon must far less than quadruple the regret.
    assert regret[7999] < 2.5 * regret[1999], (regret[1999], regret[7999])


def test_uniform_regret_is_linear():
    # The yardstick the test above can fail against: a policy that never learns.
    regret, _ = play("uniform", 8000, False)
    assert regret[7999] > 3.5 * regret[1999]


@pytest.mark.parametrize("name", [*POLICIES, "single:d1"])
def test_probabilities_form_a_distribution(name):
    pol = make_policy(name, ARMS, seed=3, horizon=200)
    rng = random.Random(0)
    for _ in range(200):
        p = pol.probabilities()
        assert len(p) == len(ARMS) and all(x >= 0 for x in p) and sum(p) == pytest.approx(1.0)
        a = pol.choose()
        r = [rng.random() for _ in ARMS]
        pol.update(a, r if pol.needs_full_info else [r[i] if i == a else None for i in range(len(ARMS))])


@pytest.mark.parametrize("name", ["exp3", "epsilon-greedy", "uniform", "hedge"])
def test_probabilities_match_choice_frequencies(name):
    """For randomised policies, probabilities() is the distribution choose() draws from."""
    pol = make_policy(name, ARMS, seed=5)
    for i in range(50):  # learn a little so the distribution is not uniform
        pol.update(i % 4, [MEANS[j] if pol.needs_full_info or j == i % 4 else None for j in range(4)])
    p = np.array(pol.probabilities())
    counts = np.bincount([pol.choose() for _ in range(6000)], minlength=4) / 6000
    assert np.abs(counts - p).max() < 0.03


def test_single_policy_and_unknown_names():
    assert make_policy("single:d3", ARMS).choose() == 3
    with pytest.raises(ValueError, match="not among"):
        make_policy("single:nope", ARMS)
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("bogus", ARMS)


def test_sequential_halving_commits_to_best():
    _, pulled = play("sequential-halving", 4000, False, seed=1)
    assert pulled[-500:].count(2) == 500


@pytest.mark.parametrize("name", list(POLICIES))
def test_sleeping_arms_are_never_chosen(name):
    """With an awake mask, a policy picks only awake arms and gives asleep ones probability 0."""
    pol = make_policy(name, ARMS, seed=7, horizon=300)
    rng = random.Random(1)
    for t in range(300):
        awake = [rng.random() < 0.5 for _ in ARMS]
        p = pol.probabilities(awake)
        a = pol.choose(awake)
        assert sum(p) == pytest.approx(1.0)
        if any(awake):
            assert awake[a], (t, awake, a)
            assert all(p[i] == 0 for i in range(len(ARMS)) if not awake[i]), (t, awake, p)
        r = [MEANS[i] if awake[i] or i == a else None for i in range(len(ARMS))]
        pol.update(a, r if pol.needs_full_info else [r[i] if i == a else None for i in range(len(ARMS))])


def test_single_drafter_plays_even_when_asleep():
    assert make_policy("single:d1", ARMS).choose([True, False, True, True]) == 1


def speed_plan(cost_ms: list[float], verify_ms: list[float]):
    """The engine's round model: tokens per ms of drafting k tokens at cost_ms each, verified in verify_ms[k + 1]."""
    def plan(i: int, alpha: float) -> tuple[float, int]:
        best = (1.0 / verify_ms[1], 0)
        e = run = 1.0
        for k in range(1, len(verify_ms) - 1):
            run *= alpha
            e += run
            best = max(best, (e / (k * cost_ms[i] + verify_ms[k + 1]), k))
        return best
    return plan


def test_cost_aware_ucb_prefers_the_faster_round():
    pol = make_policy("metasd-ucb-cost", ["costly", "free"])
    for _ in range(200):  # the costly drafter agrees more often, the free one a little less
        pol.update(0, [0.7, 0.6])
    # Without a cost model it is MetaSD-UCB: the higher mean wins.
    assert pol.decide() == Choice(0, [1.0, 0.0], None)
    plan = speed_plan([40.0, 0.0], [0, 50, 55, 60, 65, 70])
    pol = make_policy("metasd-ucb-cost", ["costly", "free"], plan=plan)
    for _ in range(200):
        pol.update(0, [0.7, 0.6])
    alpha = 0.6 + pol.beta * np.sqrt(2 * np.log(pol.t) / pol.n[1])  # its optimistic acceptance
    c = pol.decide()
    assert c.arm == 1 and c.length is None and pol.length == plan(1, alpha)[1] >= 2
    # A drafter that passes rarely and costs a lot is not worth a round: a plain step (length 0).
    pol = make_policy("metasd-ucb-cost", ["costly"], plan=speed_plan([40.0], [0, 50, 55, 60, 65, 70]))
    for _ in range(200):
        pol.update(0, [0.05])
    assert pol.decide() == Choice(0, [1.0], 0)
    # ... but a free one that passes as rarely still is (verifying one more id costs 2% here).
    pol.plan = speed_plan([0.0], [0, 50, 51, 52, 53, 54])
    assert pol.decide().length is None and pol.length >= 1


def test_cost_aware_ucb_explores_an_unseen_arm_first():
    pol = make_policy("metasd-ucb-cost", ["a", "b"], plan=speed_plan([0.0, 0.0], [0, 50, 55, 60]))
    assert pol.decide().arm == 0 and pol.length is None
    pol.update(0, [1.0, None])
    assert pol.decide().arm == 1 and pol.length is None


def test_every_policy_decides_what_it_would_choose():
    """decide() reports the arm choose() would pick and the distribution probabilities() gives."""
    for name in POLICIES:
        a, b = make_policy(name, ["x", "y", "z"], seed=5), make_policy(name, ["x", "y", "z"], seed=5)
        for t in range(30):
            awake = [True, t % 3 != 0, True]
            c = a.decide(awake)
            probs = b.probabilities(awake)
            assert c.arm == b.choose(awake) and c.probabilities == probs
            rewards = [0.2, 0.5, 0.8]
            a.update(c.arm, [r if i == c.arm or a.needs_full_info else None for i, r in enumerate(rewards)])
            b.update(c.arm, [r if i == c.arm or b.needs_full_info else None for i, r in enumerate(rewards)])


def test_the_cost_plan_reads_the_accepted_run_not_block_divergence():
    """The cost-aware plan turns an arm's per-position acceptance into tokens a round: it counts the drafted ids
    that passed before the first rejection and the drafts that ended in one. Block divergence (the bandit's
    reward) averages every drafted position: a 4-id draft that fails at its first id and matches after it
    scores 0.75 there and adds 0 passed, 1 stopped here."""
    from metasd.decoding.engine import Request, check
    from tests.tiny import tiny_bundle

    b = tiny_bundle()
    req = Request.of(b, check(b, [1, 2, 3, 4], policy="metasd-ucb-cost", drafters=["prompt-lookup", "tiny-lm"]))
    assert req.acceptance(1, 0.42) == 0.42  # nothing drafted yet: the policy's own estimate
    req._count(0, [0.0, 1.0, 1.0, 1.0])
    assert (req.passed[0], req.stopped[0]) == (0.0, 1.0)
    req._count(0, [1.0, 1.0, 1.0, 1.0])  # every id passed: no rejection seen
    req._count(0, [1.0, 0.5])  # sampled: 1.5 expected ids pass, one time in two the draft ends in a rejection
    assert req.passed[0] == pytest.approx(5.5) and req.stopped[0] == pytest.approx(1.5)
    mean = float(req.policy.means[0])
    assert req.acceptance(0, mean) == pytest.approx(5.5 / 7.0)
    assert req.acceptance(0, mean + 0.1) == pytest.approx(5.5 / 7.0 + 0.1)  # the policy's optimism on top
