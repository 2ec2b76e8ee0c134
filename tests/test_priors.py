"""Informed priors: a request starts from the preset's measured arm means, and never changes the output."""

from __future__ import annotations

import json

import pytest

from metasd import run, target_greedy
from metasd.bandits import priors as priors_mod
from metasd.bandits.policies import make_policy
from metasd.benchmark.bench import parse_methods
from metasd.core.validation import InvalidInput
from tests.tiny import tiny_bundle

ARMS = ["prompt-lookup", "token-recycling", "layer-skip", "tiny-lm"]


@pytest.fixture()
def tiny_priors(tmp_path, monkeypatch):
    """A priors file for the tiny preset that makes the layer-skip drafter the clear favourite."""
    doc = {"format": priors_mod.PRIORS_FORMAT, "preset": "tiny", "weight": 3.0,
           "means": {"bd": {"prompt-lookup": 0.1, "token-recycling": 0.1, "layer-skip": 0.9, "tiny-lm": 0.2}}, "meta": {}}
    (tmp_path / "tiny.json").write_text(json.dumps(doc))
    monkeypatch.setattr(priors_mod, "PRIORS_DIR", tmp_path)
    return doc


def test_a_prior_replaces_the_first_pull_of_every_arm():
    cold = make_policy("metasd-ucb", ARMS)
    warm = make_policy("metasd-ucb", ARMS)
    warm.set_prior([0.1, 0.1, 0.9, None], weight=3)
    assert cold.decide().arm == 0  # cold: each arm once, in order
    assert warm.decide().arm == 3  # an arm without a prior is still unseen: it is tried first
    warm.update(3, [None, None, None, 0.0])
    assert warm.decide().arm == 2  # then the prior's favourite, not prompt lookup
    assert list(warm.n) == [3, 3, 3, 1] and warm.t == 1  # pseudo-observations are not rounds played


def test_the_engine_starts_from_the_priors_and_the_output_is_unchanged(tiny_priors):
    b = tiny_bundle()
    prompt = [3, 5, 7, 3, 5, 7, 9, 11, 3, 5]
    ref = target_greedy(b, prompt, 20)
    warm_rounds, warm = run(b, prompt, policy="metasd-ucb", drafters=ARMS, max_new_tokens=20, sleeping=False)
    cold_rounds, cold = run(b, prompt, policy="metasd-ucb", drafters=ARMS, max_new_tokens=20, sleeping=False,
                            priors=False)
    assert list(warm.token_ids) == list(cold.token_ids) == ref
    assert warm_rounds[0].drafter == "layer-skip" and cold_rounds[0].drafter == "prompt-lookup"
    assert warm.config["priors"] is True and warm.config["priors_weight"] == 3.0
    assert cold.config["priors"] is False and cold.config["priors_weight"] == 0.0
    # The first round's arm probabilities already show the prior (one-hot on its favourite).
    assert warm_rounds[0].probabilities["layer-skip"] == 1.0


def test_a_reward_without_priors_starts_cold(tiny_priors):
    b = tiny_bundle()
    rounds, s = run(b, [3, 5, 7, 3, 5], policy="metasd-ucb", reward="be", drafters=ARMS, max_new_tokens=8,
                    sleeping=False)
    assert rounds[0].drafter == "prompt-lookup" and s.config["priors_weight"] == 0.0


def test_bench_runs_methods_with_and_without_priors_side_by_side():
    ms = parse_methods("metasd-ucb,metasd-ucb@cold,metasd-ucb/be@cold", ARMS, ["tiny-lm"])
    assert [(m.name, m.policy, m.reward, m.cold) for m in ms[1:]] == [
        ("metasd-ucb", "metasd-ucb", "bd", False), ("metasd-ucb@cold", "metasd-ucb", "bd", True),
        ("metasd-ucb/be@cold", "metasd-ucb", "be", True)]
    with pytest.raises(InvalidInput, match="@cold"):
        parse_methods("metasd-ucb@warm", ARMS, [])


def test_the_shipped_priors_cover_the_offline_arms():
    from metasd.models.presets import PRESETS

    pri = priors_mod.load_priors("offline")
    assert pri is not None, "assets/priors/offline.json is missing: python -m metasd priors --prompts ..."
    arms = list(PRESETS["offline"].bandit_drafters)
    for reward in priors_mod.PRIOR_REWARDS:
        means = pri.arm_means(reward, arms)
        assert all(m is not None and 0.0 <= m <= 1.0 for m in means), (reward, means)
    assert pri.weight > 0 and "command" in pri.meta
