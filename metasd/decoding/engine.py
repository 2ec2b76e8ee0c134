"""The MetaSD engine: one generator that yields an event per round, then a summary.

A round: the policy picks a drafter (an arm), the drafter proposes up to gamma tokens, the
target verifies them in one forward pass (sampling.verify), the KV caches roll back to what
was kept, the arm gets its reward and the policy learns. Nothing else drives generation: the
CLI, the app, the benchmark and the tests all consume this stream.

Cache invariant: the target's cache always holds ids[:-1]; the last id is fed with the draft.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from transformers import DynamicCache

from metasd.bandits.policies import Choice, make_policy
from metasd.bandits.priors import Priors, load_priors
from metasd.core.costs import (
    EXTRA_ID_PRIOR,
    EXTRA_ID_PRIOR_PACKED,
    Prices,
    VerifyCost,
    best_length,
    cost_entry,
    expected_accepted,
    fixed_prices,
    reward,
)
from metasd.core.events import Event, RoundEvent, Summary
from metasd.core.kvcache import new_cache
from metasd.core.passes import DraftPart, HeadPart, VerifyPart, crop_to, forward_alone, head_alone
from metasd.core.sampling import Sampling, Verdict, verify, warp
from metasd.core.validation import InvalidInput, Settings, clean_prompt, validate_settings
from metasd.decoding import tree_round
from metasd.decoding.ledger import Clock, EventBuilder, Ledger, RequestClock
from metasd.decoding.loading import Bundle
from metasd.decoding.prefix import PrefixStore
from metasd.decoding.prompts import encode_prompt, scaffold_positions
from metasd.drafting.drafters import Draft, Drafter, Verified
from metasd.drafting.registry import kind_by_name
from metasd.models.cpu_linear import is_packed

StopSignal = threading.Event | Callable[[], bool] | None
Inspect = Callable[[DynamicCache, list[int], list[Drafter]], None]


def _stopped(stop: StopSignal) -> bool:
    if stop is None:
        return False
    return stop.is_set() if isinstance(stop, threading.Event) else bool(stop())


def generate(bundle: Bundle, prompt: str | list[int], settings: Settings | None = None, *,
             stop: StopSignal = None, inspect: Inspect | None = None,
             max_new_tokens_limit: int | None = None, **overrides: Any) -> Iterator[Event]:
    """Speculative generation with a bandit over drafters. Yields RoundEvents, then a Summary.

    `settings` carries every option (validation.Settings); keyword `overrides` replace any of its
    fields, so `generate(bundle, "Hi", policy="exp3", max_new_tokens=32)` works without one. With
    neither, the preset's defaults apply. Raises InvalidInput (before yielding anything) for bad
    prompts or settings. `stop` ends the generation at the next round boundary.
    `inspect(cache, ids, drafters)` is called after every round with the live state (tests use it to
    check the KV caches against a fresh prefill).
    """
    return _rounds(prepare(bundle, prompt, settings, max_new_tokens_limit=max_new_tokens_limit, **overrides),
                   stop, inspect)


@dataclass(frozen=True)
class Prepared:
    """A request checked once (`check`): its prompt cleaned (text; "" when given as ids), its prompt ids (chat
    template applied), its settings with every default filled in. Small and picklable: the server checks a page
    run once and sends this to the rounds' processes, which start it without cleaning, encoding or filling again."""

    text: str
    prompt_ids: list[int]
    settings: Settings


def prepare(bundle: Bundle, prompt: str | list[int], settings: Settings | None = None, *,
            max_new_tokens_limit: int | None = None, **overrides: Any) -> Request:
    """A checked Request, nothing run yet (generate's validation; raises InvalidInput). Drive it with
    generate's own loop, or join it to shared rounds: Rounds.submit(req, steps(req, stop))."""
    return Request.of(bundle, check(bundle, prompt, settings, max_new_tokens_limit=max_new_tokens_limit, **overrides))


def check(bundle: Bundle, prompt: str | list[int], settings: Settings | None = None, *,
          max_new_tokens_limit: int | None = None, **overrides: Any) -> Prepared:
    """The one path a prompt takes (raises InvalidInput): settings validated with the preset's defaults (gamma,
    drafters) filled in, the text cleaned (validation.clean_prompt), encoded, checked against the context."""
    given = {f.name: getattr(settings, f.name) for f in fields(Settings)} if settings is not None else {}
    unknown = set(overrides) - {f.name for f in fields(Settings)}
    if unknown:
        raise TypeError(f"generate() got unknown setting(s): {', '.join(sorted(unknown))}")
    opts = {**given, **overrides}
    if opts.get("gamma") is None:  # None (the CLI's default) means the preset's
        opts["gamma"] = bundle.preset.gamma
    st = validate_settings(bundle.drafter_names, max_new_tokens_limit=max_new_tokens_limit,
                           default=bundle.default_drafters, **opts)
    text = clean_prompt(prompt) if isinstance(prompt, str) else ""
    prompt_ids = encode_prompt(bundle, text or prompt, st.chat_template)
    room = bundle.max_context - len(prompt_ids)
    if room < st.max_new_tokens + st.gamma + 1:
        raise InvalidInput(
            f"the prompt is {len(prompt_ids):,} tokens; with max_new_tokens={st.max_new_tokens} and "
            f"gamma={st.gamma} it must be at most {bundle.max_context - st.max_new_tokens - st.gamma - 1:,} "
            f"tokens (the model's context is {bundle.max_context:,})"
        )
    return Prepared(text, list(prompt_ids), st)


@dataclass
class Round:
    """What one round did, step by step."""

    arm: int
    choice: Choice
    k: int  # the draft length asked for
    tokens: list[int] = field(default_factory=list)  # the draft
    q: torch.Tensor | None = None
    start: int = 0  # len(ids) before the round
    inputs: list[int] = field(default_factory=list)  # fed to the target: the last id, then the draft
    logits: torch.Tensor | None = None
    verdict: Verdict | None = None
    emitted: list[int] = field(default_factory=list)
    hit_eos: bool = False
    reward: float = 0.0  # the pulled arm's own reward
    rewards: list[float | None] = field(default_factory=list)  # what the policy learns from, per arm
    scores: dict[int, list[float]] = field(default_factory=dict)  # per-position acceptance, per scored arm (lanes)


class Request:
    """One generation's state: ids and caches, per-arm draft-length caps, the token budget, the random
    generators; its methods are the round's steps. Its books are kept apart (metasd/decoding/ledger.py): what it
    produced and each arm's statistics (`ledger`), where its time went (`clock`), its events (`events`)."""

    def __init__(self, bundle: Bundle, prompt: str, prompt_ids: list[int], st: Settings) -> None:
        self.clock = RequestClock()
        self.bundle, self.prompt, self.st = bundle, prompt, st
        self.dev = bundle.device
        self.s = Sampling(st.temperature, st.top_p, st.top_k)
        self.names = list(st.drafters)
        self.arms = bundle.make_drafters(self.names)
        # White-box arms read the target's hidden states: only then does every target pass return them.
        self.readers = [d for d in self.arms if d.feature_layers]
        self.features = tuple(sorted({i for d in self.readers for i in d.feature_layers}))  # what a shared pass keeps
        # The throughput reward's and the plan's yardstick.
        self.verify_cost = VerifyCost(st.gamma, EXTRA_ID_PRIOR_PACKED if is_packed(bundle.target) else EXTRA_ID_PRIOR)
        # Fixed prices (costs.Prices): set at start for a sampled run (defaults.PRICES), None while plans read the clock.
        self.prices: Prices | None = None
        self.fixed_ms: list[float] = []  # per arm, with fixed prices
        self.threads: int | None = None  # torch threads of its rounds, set by a driver that sets them (fix_prices)
        # Rounds the request will take if each emits ~2 tokens: sequential halving's horizon.
        self.policy = make_policy(st.policy, self.names, seed=st.seed, horizon=max(8, st.max_new_tokens // 2),
                                  plan=self.plan)
        self.sleeping = st.sleeping and self.policy.name != "fixed" and any(d.model_free for d in self.arms)
        # Per arm, the drafted positions that passed and the drafts that stopped at a rejection (expected counts
        # when sampling): the per-position acceptance that predicts a round's tokens (plan). Block divergence,
        # the bandit's reward, averages every drafted position, those after a rejection too, so a greedy copy
        # drafter whose 4-id draft fails at its first id and matches after it scores 0.75.
        self.passed = [0.0] * len(self.arms)
        self.stopped = [0.0] * len(self.arms)
        self.priors = self.start_from_priors() if st.priors else None
        self.g_target = torch.Generator(device=self.dev).manual_seed(st.seed)
        self.g_draft = torch.Generator(device=self.dev).manual_seed(st.seed + 1)
        self.ledger = Ledger(self.names)
        self.events = EventBuilder(bundle.tokenizer)
        self.ids = list(prompt_ids)
        # Room for the longest context this request can reach: its cache never moves (metasd/core/kvcache.py).
        self.cache = new_cache(bundle.target.config, len(prompt_ids) + st.max_new_tokens + st.gamma + 1)
        # Kept prompt passes, lent by a server's shared rounds: this request keeps its own pass there, and takes a
        # kept one only with `prefix_reuse` (in company: a run alone is timed as it runs, for a fair speed-up).
        self.prefixes: PrefixStore | None = None
        self.prefix_reuse = False
        self.timed = False  # a run timed against the target alone (Compare): it always reads its own prompt
        self.prefill_reused = False  # whether the prompt's pass was a kept one
        # Per-arm draft length: one more after a fully accepted draft, accepted + 1 after a rejection
        # (every extra verified id costs something: ~4% of a step on this CPU, ~15% unpacked).
        self.caps = [st.gamma] * len(self.arms)
        self.budget = st.max_new_tokens - 1  # the most a round may draft: it emits accepted + 1 tokens
        self.pre: dict[int, Draft] = {}  # this round's drafts of the model-free arms (sleeping arms)
        self.stop_reason = "max_new_tokens"
        self.round: Round | None = None  # the round in progress

    @classmethod
    def of(cls, bundle: Bundle, p: Prepared) -> Request:
        """A request from a checked one (check): nothing is cleaned, encoded or validated again."""
        return cls(bundle, p.text, p.prompt_ids, p.settings)

    def start(self) -> None:
        """The prompt's prefill. Deferred from the constructor so that it runs in the thread that consumes
        the events (the page's engine worker, with its torch threads), not in the one that validated."""
        if self.st.prices == "fixed" or self.st.prices == "auto" and not self.s.greedy:
            self.fix_prices()
        else:  # the pass's cost by ids fed, probed once per model (before the clock: not this request's time)
            self.verify_cost.profile = self.bundle.verify_profile()
        t = time.perf_counter()
        self.prefill(list(self.ids))  # a copy: drafters may keep it, self.ids grows
        self.clock.prefill_s = time.perf_counter() - t

    def fix_prices(self) -> None:
        """Plans read the preset's stored prices (or nominal ones), never the clock: a sampled run's seed repeats."""
        # The torch threads its rounds run with, where its driver said (the prompt's pass may run with more, a class's
        # crowd with fewer: neither may change a seed's text), else torch's count now.
        stored = cost_entry(self.bundle.preset.name, self.threads or torch.get_num_threads())
        self.prices = fixed_prices(stored, self.verify_cost.extra_id, self.dev.type)
        self.verify_cost.profile, self.verify_cost.fixed = self.prices.verify, True
        self.fixed_ms = [self.prices.drafter(n, kind_by_name(n) or "model") for n in self.names]

    def price(self, i: int) -> float:
        """Arm i's ms per drafted token as plans read it: fixed, or as measured so far."""
        return self.arms[i].ms_per_token if self.prices is None else self.fixed_ms[i]

    def drafted_ms(self, i: int, tokens: int, seconds: float) -> float:
        """What drafting `tokens` ids cost arm i as rewards read it: fixed, or the `seconds` it took."""
        return self.price(i) * tokens if self.prices is not None else 1000 * seconds

    def start_from_priors(self) -> Priors | None:
        """Seed the policy with the preset's informed priors for this reward. None when there are none to
        use. (Drafting costs are not seeded: they depend on the machine and are measured on the first pull.)"""
        pri = load_priors(self.bundle.preset.name)
        means = pri.arm_means(self.st.reward, self.names) if pri else []
        if pri is None or self.policy.name == "fixed" or all(m is None for m in means):
            return None
        self.policy.set_prior(means, pri.weight)
        for i, m in enumerate(means):  # the plan's counts too: `weight` positions at the prior mean
            if m is not None:
                self.passed[i], self.stopped[i] = pri.weight * m, pri.weight * (1.0 - m)
        return pri

    @property
    def done(self) -> bool:
        return self.ledger.new_tokens >= self.st.max_new_tokens

    def prefill(self, prompt_ids: list[int]) -> None:
        """Feed the target all but the last prompt token (the cache invariant above), and give the
        drafters that ask for them the target's predictions after the user's own last tokens (after the
        template's scaffolding it predicts more scaffolding: "<|im_start|>", "assistant", ...)."""
        ids = self.ids
        scaffold = scaffold_positions(self.bundle, self.prompt, prompt_ids, self.st.chat_template)
        for d in self.arms:
            d.reset(prompt_ids)
            d.mark_scaffold(scaffold)
        if len(ids) < 2:
            return
        want = max((d.seed_rows for d in self.arms), default=0)
        keep = min(len(ids) - 1, want) if want else 1
        # A server's kept prompt passes (metasd.decoding.prefix), where it lends them; with the hidden states
        # white-box readers take.
        store = self.prefixes if self.prefixes is not None and self.prefixes.fits(self.cache) else None
        got = store.take(ids[:-1], keep, self.cache, self.features) if store is not None and self.prefix_reuse else None
        if got is None:
            out = self.bundle.target(input_ids=torch.tensor([ids[:-1]], device=self.dev), past_key_values=self.cache,
                                     use_cache=True, logits_to_keep=keep, output_hidden_states=bool(self.readers))
            logits, states = out.logits[0], {i: out.hidden_states[i] for i in self.features}
            if store is not None:
                store.keep(ids[:-1], keep, self.cache, logits, states)
        else:
            (logits, states), self.prefill_reused = got, True
        for d in self.readers:
            d.take_features(0, states, len(ids) - 1)
        first = len(ids) - 1 - keep
        rows = [j for j in range(keep) if first + j not in scaffold]
        for d in self.arms:
            mine = rows[-d.seed_rows:] if d.seed_rows else []
            if mine:
                d.seed([ids[first + j] for j in mine], logits[mine])

    def length(self, i: int) -> int:
        """Arm i's draft length this round: its adaptive cap, never past the token budget."""
        return min(self.caps[i] if self.st.adaptive else self.st.gamma, self.budget)

    def plan(self, i: int, alpha: float) -> tuple[float, int]:
        """The cost model the cost-aware policy reads: expected tokens per ms of a round with arm i if
        each drafted position passes with probability alpha, and the best draft length (0: a plain step)."""
        kmax = min(self.length(i), len(self.pre[i].tokens)) if i in self.pre else self.length(i)
        return best_length(self.acceptance(i, alpha), kmax, self.price(i), self.verify_cost)

    def acceptance(self, i: int, alpha: float) -> float:
        """Arm i's per-position acceptance for the plan: passed / (passed + stopped) over its drafts so far, with
        the policy's optimism (alpha less the arm's mean reward) on top; alpha itself before any draft."""
        seen = self.passed[i] + self.stopped[i]
        if seen <= 0:
            return alpha
        bonus = max(0.0, alpha - float(self.policy.means[i]))
        return min(1.0, self.passed[i] / seen + bonus)

    # ---- the round's steps, in order --------------------------------------------------------

    def wake(self) -> list[bool] | None:
        """Sleeping arms: the model-free drafters draft first (microseconds, deterministic, no random
        numbers drawn); one with nothing to propose is asleep, since pulling it would only be a plain
        target step. Returns the mask of awake arms (None: every arm plays)."""
        self.budget = self.st.max_new_tokens - self.ledger.new_tokens - 1
        self.pre.clear()
        if not self.sleeping:
            return None
        for i, d in enumerate(self.arms):
            if d.model_free:
                ki = self.length(i)
                self.pre[i] = d.propose(self.ids, ki, self.s, self.g_draft) if ki > 0 else Draft([], None)
        return [bool(self.pre[i].tokens) if i in self.pre else True for i in range(len(self.arms))]

    def pick(self, awake: list[bool] | None) -> Round:
        choice = self.policy.decide(awake)
        k = self.length(choice.arm) if choice.length is None else min(choice.length, self.length(choice.arm))
        return Round(choice.arm, choice, k)

    def draft(self, r: Round) -> Generator[DraftPart, torch.Tensor, None]:
        """The chosen arm drafts; a model drafter asks the driver for each forward (see Drafter.propose_steps)."""
        drafter = self.arms[r.arm]
        if r.arm in self.pre:
            d: Draft | None = self.pre[r.arm]
        elif r.k > 0:
            drafter.attach(self.cache, self.ids)
            d = yield from drafter.propose_steps(self.ids, r.k, self.s, self.g_draft)
        else:
            d = None
        r.tokens = d.tokens[: r.k] if d else []
        r.q = d.q[: len(r.tokens)] if d is not None and d.q is not None else None

    def verify(self, r: Round) -> None:
        """One target pass over the last id and the draft (row j of the logits checks draft[j]); then the
        cache rolls back to ids + the accepted draft (the target's own token is fed next round)."""
        self.take_verdict(r, *self.pass_alone(self.verify_part(r)))

    def verify_part(self, r: Round) -> VerifyPart:
        """What this round's verification feeds the target: the last id, then the draft, from its position."""
        r.start = len(self.ids)
        r.inputs = [self.ids[-1]] + r.tokens
        return VerifyPart(r.inputs, r.start - 1, self.cache, features=self.features)

    def pass_alone(self, part: VerifyPart) -> tuple[torch.Tensor, Any]:
        """The verification pass a round asked for (a chain's or a token tree's), on this request alone: its
        logits and (white-box readers) hidden states."""
        out = self.bundle.target(input_ids=torch.tensor([part.ids], device=self.dev),
                                 position_ids=part.position_ids(self.dev), attention_mask=part.mask,
                                 past_key_values=self.cache, use_cache=True, output_hidden_states=bool(self.readers))
        return out.logits[0], out.hidden_states

    def take_verdict(self, r: Round, logits: torch.Tensor, hidden_states: Any = None) -> None:
        """The verdict on the draft from the pass's logits; the cache rolls back to ids + the accepted draft."""
        r.logits = logits
        r.verdict = verify(r.logits, torch.tensor(r.tokens, dtype=torch.long, device=self.dev), r.q, self.s,
                           self.g_target)
        crop_to(self.cache, r.start + r.verdict.accepted)
        for d in self.readers:  # the kept positions: the last id and the accepted draft
            d.take_features(r.start - 1, hidden_states, r.verdict.accepted + 1)

    def accept(self, r: Round, clock: Clock) -> None:
        """Append what was kept (the accepted draft and the target's token, up to an end-of-sequence
        id; the budget already keeps it within max_new_tokens), adapt the arm's draft length and
        measure its own reward."""
        v = r.verdict
        emitted = r.tokens[: v.accepted] + [v.token]
        eos = next((i for i, t in enumerate(emitted) if t in self.bundle.eos_ids), None)
        r.emitted, r.hit_eos = (emitted[: eos + 1], True) if eos is not None else (emitted, False)
        self.ids.extend(r.emitted)
        self.ledger.count(r.emitted, v.accepted, len(r.inputs))
        self.arms[r.arm].record_time(clock["draft"], len(r.tokens))
        self.verify_cost.add(len(r.inputs), 1000 * clock["verify"])
        if r.tokens and len(r.tokens) == r.k and v.accepted == r.k:  # a plain step says nothing of the arm
            self.caps[r.arm] = min(self.st.gamma, self.caps[r.arm] + 1)
        elif v.accepted < len(r.tokens):
            self.caps[r.arm] = max(1, v.accepted + 1)
        # Block efficiency is the realised accepted share; the others use the per-position betas.
        r.reward = (v.accepted / max(r.k, 1) if self.st.reward == "be"
                    else self._reward(v.beta, r.k, self.drafted_ms(r.arm, len(r.tokens), clock["draft"]), len(r.inputs)))

    def _reward(self, g: list[float], k: int, drafted_ms: float, fed: int) -> float:
        return reward(self.st.reward, g, k, self.st.gamma, drafted_ms, fed, self.verify_cost)

    def scored_arms(self, r: Round, awake: list[bool] | None) -> list[int]:
        """Full information scores every drafter on the verified chunk, teacher-forced. Without it,
        model-free drafters are still scored when `free_feedback` is on: for them it costs microseconds,
        and the policy then learns about them without spending rounds on them (awake ones only: a
        sleeping arm's mean is its reward when it can play)."""
        if self.st.full_info:
            return list(range(len(self.arms)))
        if self.st.free_feedback:
            return [i for i, d in enumerate(self.arms) if d.model_free and i != r.arm and (awake is None or awake[i])]
        return []

    def score(self, r: Round, awake: list[bool] | None) -> None:
        """Rewards for the policy: the pulled arm's own, and those of the arms scored on the chunk."""
        r.rewards = [None] * len(self.arms)
        scored = self.scored_arms(r, awake)
        m = min(len(r.emitted), self.st.gamma)
        p_rows = None if self.s.greedy or not scored else warp(r.logits[:m], self.s)
        for i in scored:
            g = (r.verdict.beta + [0.0] * m)[:m] if i == r.arm else self._teacher_forced(i, r, m, p_rows)
            r.scores[i] = g
            # Had it drafted, it would have proposed up to gamma ids: charge that verification.
            r.rewards[i] = self._reward(g, m, self.price(i) * self.st.gamma, self.st.gamma + 1)
            if i != r.arm:  # had it drafted: its run over the chunk (all m passing says nothing of a rejection)
                self._count(i, g)
            tokens_i = 1 + expected_accepted(g)
            self.ledger.arms[self.names[i]].scored_tokens += tokens_i
            if i == r.arm:
                self.ledger.chosen_scored += tokens_i
        if self.st.full_info:
            self.ledger.measure_regret()
        elif r.k > 0:  # a round that drafted nothing by choice says nothing about the drafter
            r.rewards[r.arm] = r.reward
        if r.tokens:
            self._count(r.arm, r.verdict.beta[:len(r.tokens)])

    def _count(self, i: int, g: list[float]) -> None:
        """Arm i's expected passing run over positions with acceptance g, and the chance it ends in a rejection."""
        if not g:
            return
        self.passed[i] += expected_accepted(g)
        self.stopped[i] += 1.0 - math.prod(g)

    def _teacher_forced(self, i: int, r: Round, m: int, p_rows: torch.Tensor | None) -> list[float]:
        """Per-position acceptance probabilities of arm i on the verified chunk, had it drafted it."""
        d = self.arms[i]
        d.attach(self.cache, self.ids)
        pred = d.predict(self.ids, r.start, m, self.s).to(self.dev)
        if pred.dim() == 1 and self.s.greedy:
            return (pred == torch.tensor(r.emitted[:m], device=self.dev)).float().tolist()
        if pred.dim() == 1:
            valid = pred >= 0
            return torch.where(valid, p_rows[torch.arange(m, device=self.dev), pred.clamp_min(0)], 0.0).tolist()
        return torch.minimum(p_rows, pred).sum(-1).tolist()

    def learn(self, r: Round, clock: Clock) -> None:
        """The policy and every drafter learn from the round; the arm's statistics and the regret grow."""
        self.policy.update(r.arm, r.rewards)
        verified = Verified(r.start, r.inputs, r.logits, r.emitted)
        for d in self.arms:
            d.observe(self.ids, verified)
        name = self.names[r.arm]
        a = self.ledger.arms[name]
        a.pulled(len(r.tokens), r.verdict.accepted, r.rewards[r.arm], clock["draft"])
        a.verify_s += clock["verify"]
        if not self.st.full_info:
            self.ledger.add_estimated_regret(name)

    def emit(self, r: Round, clock: Clock) -> RoundEvent:
        return self.events.round_event(self, r, clock)

    def summary(self) -> Summary:
        return self.events.summary(self)


@torch.inference_mode()
def drive(req: Request, stop: StopSignal = None, inspect: Inspect | None = None) -> Iterator[Event]:
    """A prepared request's events, every verification on a pass of its own (as generate)."""
    return _rounds(req, stop, inspect)


def _rounds(req: Request, stop: StopSignal, inspect: Inspect | None) -> Iterator[Event]:
    """The prefill, then the round loop, each verification on this request's own pass (see steps)."""
    it = steps(req, stop, inspect)
    x = next(it, None)
    while x is not None:
        if isinstance(x, VerifyPart):
            x = it.send(req.pass_alone(x))
        elif isinstance(x, DraftPart):
            x = it.send(forward_alone(x))
        elif isinstance(x, HeadPart):
            x = it.send(head_alone(x))
        else:
            yield x
            x = next(it, None)


def steps(req: Request, stop: StopSignal, inspect: Inspect | None = None
          ) -> Generator[Event | VerifyPart | DraftPart, Any, None]:
    """The prefill, then the round loop: pick an arm, draft, verify, keep what passed, score, learn, emit.
    Verification is asked of the driver: the generator yields the round's VerifyPart and receives the
    pass's (logits, hidden states) back, from a pass of its own (_rounds) or one shared with other
    requests (metasd.serving.batch.Rounds); a model drafter's forwards likewise (DraftPart, answered with its
    logits). Everything else is this request's own."""
    req.start()
    while not req.done:
        if _stopped(stop):
            req.stop_reason = "stopped"
            break
        req.ledger.rounds += 1
        clock = Clock()
        awake = req.wake()
        clock.lap("wake")
        if req.policy.tree:  # a token tree of several arms' drafts, verified in one pass (metasd/decoding/tree_round.py)
            ev, eos = yield from tree_round.play_round(req, awake, clock, inspect)
            yield ev
            if eos:
                req.stop_reason = "eos"
                break
            continue
        r = req.round = req.pick(awake)
        clock.lap("pick")
        yield from _own_time(req.draft(r), clock, "draft")
        clock.lap("draft")
        logits, hidden = yield req.verify_part(r)
        req.take_verdict(r, logits, hidden)
        clock.lap("verify")
        req.accept(r, clock)
        clock.lap("accept")
        req.score(r, awake)
        clock.lap("score")
        req.learn(r, clock)
        if inspect is not None:
            inspect(req.cache, req.ids, req.arms)
        clock.lap("learn")
        yield req.emit(r, clock)
        if r.hit_eos:
            req.stop_reason = "eos"
            break
    yield req.summary()


def _own_time(parts: Generator[DraftPart, torch.Tensor, Any], clock: Clock, name: str
              ) -> Generator[DraftPart, torch.Tensor, Any]:
    """yield from `parts`, charging `name` with the time they ran and each part's share of the pass that ran
    it (DraftPart.spent_s), not the time this request waited while other requests' parts ran."""
    try:
        x = next(parts)
        while True:
            clock.lap(name)
            logits = yield x
            clock.skip(name, x.spent_s)
            x = parts.send(logits)
    except StopIteration as end:
        return end.value


def run(bundle: Bundle, prompt: str | list[int], **kwargs: Any) -> tuple[list[RoundEvent], Summary]:
    """Consume a whole generation: its rounds and its summary."""
    return collect(generate(bundle, prompt, **kwargs))


def collect(events: Iterator[Event]) -> tuple[list[RoundEvent], Summary]:
    """A generation's events, consumed: its rounds and its summary."""
    rounds: list[RoundEvent] = []
    for ev in events:
        if isinstance(ev, Summary):
            return rounds, ev
        rounds.append(ev)
    raise RuntimeError("generation ended without a summary")


def target_greedy(bundle: Bundle, prompt_ids: list[int], max_new_tokens: int, **hf_options: Any) -> list[int]:
    """The target's own greedy decoding through transformers `generate`: the reference. `hf_options`
    reach `generate` (the benchmark's transformers methods: prompt lookup, assisted generation) with
    the same stopping rule. Its KV cache is the engine's own kind (metasd/core/kvcache.py): a speed-up compares
    drafting, not two ways of keeping a cache."""
    inp = torch.tensor([prompt_ids], device=bundle.device)
    if getattr(bundle.target.generation_config, "cache_implementation", None) is None:  # else generate makes its own
        hf_options.setdefault("past_key_values", new_cache(bundle.target.config, len(prompt_ids) + max_new_tokens + 1))
    eos = sorted(bundle.eos_ids)
    out = bundle.target.generate(inp, attention_mask=torch.ones_like(inp), do_sample=False,
                                 max_new_tokens=max_new_tokens, eos_token_id=eos or None,
                                 pad_token_id=eos[0] if eos else 0, **hf_options)
    return out[0, len(prompt_ids):].tolist()

