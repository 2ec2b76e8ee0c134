"""KV caches stay exactly what a fresh prefill of the accepted text would give, after any
sequence of accepts, rejects and drafter switches (target and every model drafter)."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache

from metasd import run, target_greedy
from metasd.drafting.drafters import ModelDrafter
from tests.tiny import tiny_bundle


def fresh_kv(model, ids: list[int], offset: int = 0) -> DynamicCache:
    """A prefill of `ids` at positions offset, offset + 1, ... (a windowed drafter's view)."""
    cache = DynamicCache(config=model.config)
    pos = torch.arange(offset, offset + len(ids)).view(1, -1)
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids]), position_ids=pos, past_key_values=cache, use_cache=True)
    return cache


def assert_same_kv(live: DynamicCache, fresh: DynamicCache, what: str) -> None:
    assert live.get_seq_length() == fresh.get_seq_length(), what
    for i, (a, b) in enumerate(zip(live.layers, fresh.layers, strict=True)):
        if not b.is_initialized:  # layers a layer-skip drafter does not run
            assert not a.is_initialized or a.keys.numel() == 0, what
            continue
        torch.testing.assert_close(a.keys, b.keys, atol=1e-4, rtol=1e-4, msg=f"{what}: keys of layer {i}")
        torch.testing.assert_close(a.values, b.values, atol=1e-4, rtol=1e-4, msg=f"{what}: values of layer {i}")


@pytest.mark.parametrize("seed", range(6))
def test_caches_match_fresh_prefill_every_round(seed):
    rng = random.Random(seed)
    # Odd seeds give the model drafter a 6-token window: it restarts on the last 6 ids whenever
    # more than that is missing, so its cache is a prefill of a suffix at its true positions.
    bundle = tiny_bundle(vocab=20, seed=seed, noise=rng.choice([0.1, 0.5]), layers=3, window=6 * (seed % 2))
    windowed = set()
    prompt = [rng.randrange(20) for _ in range(10)] * 2
    checks = {"rounds": 0, "accepts": 0, "rejects": 0}

    def inspect(cache, ids, drafters):
        checks["rounds"] += 1
        # Target invariant: the cache holds every id but the last one.
        assert_same_kv(cache, fresh_kv(bundle.target, ids[:-1]), f"target after round {checks['rounds']}")
        for d in drafters:
            if isinstance(d, ModelDrafter) and d.cached:
                assert_same_kv(d.cache, fresh_kv(d.model, d.cached, d.offset), f"{d.name} after round {checks['rounds']}")
                if d.offset:
                    windowed.add(d.name)

    for policy in ("uniform", "round-robin"):
        rounds, s = run(bundle, prompt, policy=policy, max_new_tokens=40, gamma=rng.randrange(2, 6),
                        temperature=rng.choice([0.0, 1.0]), seed=seed, inspect=inspect, full_info=rng.random() < 0.5)
        checks["accepts"] += sum(r.accepted for r in rounds)
        checks["rejects"] += sum(r.accepted < len(r.draft) for r in rounds)
    assert checks["rounds"] > 10 and checks["accepts"] > 0 and checks["rejects"] > 0, checks
    assert bool(windowed) == bool(seed % 2), windowed


def test_windowed_drafter_reads_at_most_its_window_and_stays_lossless(monkeypatch):
    bundle = tiny_bundle(vocab=20, seed=4, noise=0.2, window=5)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]
    fed: list[int] = []
    offsets: list[int] = []
    original = ModelDrafter._part

    def counting(self, tokens, keep=1):
        fed.append(len(tokens))
        return original(self, tokens, keep)

    def inspect(cache, ids, drafters):
        offsets.append(next(d for d in drafters if d.name == "tiny-lm").offset)

    monkeypatch.setattr(ModelDrafter, "_part", counting)
    # round-robin: the drafter sits idle between its turns, so it must catch up every time.
    rounds, s = run(bundle, prompt, policy="round-robin", max_new_tokens=40, inspect=inspect, sleeping=False)
    assert fed and max(fed) <= 5, fed
    assert offsets[-1] > 0
    assert list(s.token_ids) == target_greedy(bundle, prompt, 40)
    assert sum(r.accepted for r in rounds if r.drafter == "tiny-lm") > 0


def test_idle_drafter_catches_up_lazily():
    """A model drafter idle for several rounds feeds only what it missed, then drafts like a fresh one."""
    bundle = tiny_bundle(vocab=20, seed=2, noise=0.2)
    prompt = list(range(12))
    pattern = ["tiny-lm"] * 2 + ["prompt-lookup"] * 4 + ["tiny-lm"] * 2
    names = bundle.drafter_names
    seen = []

    def inspect(cache, ids, drafters):
        d = drafters[names.index("tiny-lm")]
        seen.append((len(ids), len(d.cached)))

    # round-robin over a drafter list built to follow `pattern`
    from metasd.bandits import policies

    class Scripted(policies.Policy):
        name = "scripted"

        def choose(self, awake=None):
            return names.index(pattern[min(self.t, len(pattern) - 1)])

        def probabilities(self, awake=None):
            return self._one_hot(self.choose())

    policies.POLICIES["scripted"] = Scripted
    try:
        run(bundle, prompt, policy="scripted", max_new_tokens=30, inspect=inspect, sleeping=False)
    finally:
        del policies.POLICIES["scripted"]
    # While idle (rounds 3-6) the drafter's cache does not move; it catches up when chosen again.
    idle = [c for _, c in seen[2:6]]
    assert len(set(idle)) == 1
    assert seen[6][1] > idle[0] and seen[6][1] >= seen[6][0] - 1 - 4


def test_verify_cost_interpolates_and_extrapolates():
    from metasd.core.costs import EXTRA_ID_PRIOR, EXTRA_ID_PRIOR_PACKED, VerifyCost

    c = VerifyCost(4)
    assert c(3) == 1.0  # nothing measured yet
    c.add(1, 50.0)
    # This CPU's measured cost of one more verified id (docs/DESIGN.md §4): default kernels, packed.
    assert (EXTRA_ID_PRIOR, EXTRA_ID_PRIOR_PACKED) == (0.15, 0.04)
    assert VerifyCost(4, EXTRA_ID_PRIOR_PACKED).extra_id == 0.04
    assert c(1) == 50.0 and c(2) == pytest.approx(57.5)  # the prior: +15% of a step per id
    c.add(5, 70.0)
    assert c(3) == pytest.approx(60.0)  # between two measurements: linear
    c.add(4, 66.0)
    assert c(3) == pytest.approx(50.0 + 16.0 * 2 / 3)


def test_verify_cost_takes_the_probed_shape_for_counts_not_fed():
    from metasd.core.costs import VerifyCost, best_length, profiled

    # This CPU's shape (docs/DESIGN.md §4): one id 66.8 ms, two 71.6, then ~3 ms an id.
    profile = ((1, 66.8), (2, 71.6), (3, 72.0), (6, 80.0))
    assert profiled(profile, 4) == pytest.approx(72.0 + 8.0 / 3) and profiled(profile, 8) == pytest.approx(80.0 + 16 / 3)
    c = VerifyCost(5, profile=profile)
    assert c(1) == 66.8 and c(6) == 80.0  # before any pass: the probe's own ms
    c.add(6, 100.0)  # a longer context: every count 25% dearer than probed
    c.add(2, 89.5)
    assert c(1) == pytest.approx(89.5 * 66.8 / 71.6)  # scaled from the nearest fed count, not flat
    assert c(3) == pytest.approx(89.5 * 72.0 / 71.6) and c(5) == pytest.approx(100.0 * profiled(profile, 5) / 80.0)
    # Without the shape a plain step looked as dear as two ids, so a draft that one time in twenty
    # passes (a 0.1 ms copy drafter) beat it; with it the plain step wins.
    flat = VerifyCost(5)
    flat.add(2, 71.6)
    flat.add(3, 72.0)
    assert best_length(0.05, 5, 0.1, flat)[1] > 0
    assert best_length(0.05, 5, 0.1, VerifyCost(5, profile=profile))[1] == 0


def test_verify_cost_keeps_the_probed_shape_and_follows_the_request_in_scale():
    from metasd.core.costs import VerifyCost

    profile = ((1, 40.0), (3, 40.0), (6, 46.0))
    c = VerifyCost(5, profile=profile)
    c.add(1, 44.0)  # this context: 10% dearer than probed, every count alike
    assert c(3) == pytest.approx(44.0) and c(6) == pytest.approx(46.0 * 1.1)
    c.add(3, 66.0)  # one slow pass: every count a little dearer, three ids no dearer than one
    assert c(3) == c(1) and 44.0 < c(3) < 50.0
    for _ in range(20):
        c.add(1, 44.0)  # the moment passed: so did its reading, though three ids were not fed again
    assert c(3) == pytest.approx(44.0, rel=0.01)


def test_in_a_shared_pass_a_request_prices_its_ids_by_its_share_of_the_pass():
    """Alone, the first 6-8 ids cost one step; in a class's pass each id adds its share to everyone's wait. A request
    in company prices a plan at an equal part of a pass's fixed cost plus what its own ids add, so the chain's
    length and the tree's size shrink there (the class's tokens per second), and stay the solo ones alone."""
    from metasd.core.costs import VerifyCost, best_length, profiled, tree_budget

    # One thread of this CPU (AVX-512, the offline model): flat to 8 ids, then ~1.7 ms an id (157.5 ms at 48).
    profile = ((1, 76.2), (2, 81.4), (6, 82.8), (8, 85.0), (16, 103.5), (32, 129.4), (48, 157.5), (64, 177.7))
    alone, crowd = VerifyCost(5, profile=profile), VerifyCost(5, profile=profile)
    crowd.company = (8, 42)  # seven others feeding six ids each
    assert alone(6) == 82.8 and tree_budget(alone, 5) == 12
    share = crowd(1)
    assert share == pytest.approx(76.2 / 8 + profiled(profile, 43) - profiled(profile, 42))
    assert crowd(6) == pytest.approx(76.2 / 8 + 157.5 - profiled(profile, 42))
    assert crowd(12) / crowd(6) > 1.3 > 1.15 > alone(12) / alone(6)  # one more id is no longer free
    assert tree_budget(crowd, 5) == 8  # two ids past a full chain, against six alone
    assert best_length(0.5, 5, 0.5, crowd)[1] < best_length(0.5, 5, 0.5, alone)[1]
    # The request waited for the whole pass: the scale reads it against the pass's every id, not its own six.
    crowd.add(6, 2 * 157.5)
    assert crowd.scale == pytest.approx(2.0) and crowd(6) == pytest.approx(2 * (76.2 / 8 + 157.5 - profiled(profile, 42)))
    crowd.company = (1, 0)  # alone again (the driver sets None; one request is the same)
    assert crowd(6) == pytest.approx(2 * 82.8)


def test_probe_measures_every_count_non_decreasing():
    from metasd.decoding.probe import verify_profile

    b = tiny_bundle()
    prof = verify_profile(b.target, (1, 2, 4), repeats=1)
    assert [n for n, _ in prof] == [1, 2, 4] and all(ms > 0 for _, ms in prof)
    assert all(a[1] <= b_[1] for a, b_ in zip(prof, prof[1:], strict=False))
    assert b.verify_profile() is b.verify_profile()  # probed once per model


def _sweep(one: float, per_id: float, noise: tuple[float, ...] = ()) -> dict[int, float]:
    return {n: (one + per_id * (n - 1)) * (noise[i] if i < len(noise) else 1.0) for i, n in enumerate((1, 2, 5, 8))}


def test_the_probe_reads_the_curve_s_shape_sweep_by_sweep():
    """Each count against the same sweep's one-id pass, the median over sweeps: a slow sweep cancels, and one lucky
    fast one-id pass no longer makes every count look dearer (the fastest pass per count read 2 ids at 1.3 here)."""
    from metasd.decoding import probe

    alike = [_sweep(50, 2), _sweep(55, 2.2), _sweep(60, 2.4)]  # one sweep slower throughout: the same shape
    assert probe.spread(alike) == pytest.approx(1.0)
    assert [n for n, _ in probe.profile_of(alike)] == [1, 2, 5, 8]
    assert [ms for _, ms in probe.profile_of(alike)] == pytest.approx([55.0, 57.2, 63.8, 70.4])
    lucky = [_sweep(50, 2), {**_sweep(50, 2), 1: 40.0}, _sweep(50, 2)]
    assert [ms for _, ms in probe.profile_of(lucky)] == pytest.approx([50.0, 52.0, 58.0, 64.0])
    assert probe.profile_of([{1: 50.0, 2: 49.0}]) == ((1, 50.0), (2, 50.0))  # never cheaper for more ids


def test_a_disturbed_probe_is_taken_again_and_the_calmest_kept(monkeypatch, capsys):
    """A probe whose sweeps disagree on the shape (another process busy beside it) is taken again: its steep or
    flat curve would stand for every request of the process. A calm probe passes at once."""
    from metasd.decoding import probe

    calm = [_sweep(50, 2), _sweep(51, 2), _sweep(50.5, 2.1)]
    busy = [_sweep(50, 2, (1.0, 1.5, 1.6, 1.5)), _sweep(80, 2, (1.0, 0.9, 1.0, 1.2)), _sweep(75, 3)]
    worse = [_sweep(50, 2, (1.0, 2.0, 2.0, 2.0)), _sweep(90, 2, (1.0, 0.8, 0.8, 0.9)), _sweep(60, 2)]
    assert probe.spread(calm) < probe.CALM_SPREAD < probe.spread(busy) < probe.spread(worse)

    tries = iter([busy, calm, busy])
    calls = []
    monkeypatch.setattr(probe, "_sweeps", lambda *a: calls.append(a) or next(tries))
    assert probe.verify_profile(object()) == probe.profile_of(calm) and len(calls) == 2
    assert "disturbed" not in capsys.readouterr().err

    tries, calls[:] = iter([worse, busy, worse]), []
    assert probe.verify_profile(object()) == probe.profile_of(busy) and len(calls) == probe.ATTEMPTS
    assert "disturbed in all 3 tries" in capsys.readouterr().err
