"""The MetaSD engine: one generator that yields an event per round, then a summary.

A round: the policy picks a drafter (an arm), the drafter proposes up to gamma tokens, the
target verifies them in one forward pass (sampling.verify), the KV caches roll back to what
was kept, the arm gets its reward and the policy learns. Nothing else drives generation: the
CLI, the app, the benchmark and the tests all consume this stream.

Cache invariant: the target's cache always holds ids[:-1]; the last id is fed with the draft.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

import torch
from transformers import DynamicCache

from metasd.drafters import Draft, Drafter, TokenRecycling, Verified, crop_to
from metasd.events import DrafterStats, Event, RoundEvent, Summary
from metasd.models import Bundle
from metasd.policies import make_policy
from metasd.sampling import Sampling, verify, warp
from metasd.validation import InvalidInput, Settings, clean_prompt, validate_settings

StopSignal = threading.Event | Callable[[], bool] | None
Inspect = Callable[[DynamicCache, list[int], list[Drafter]], None]


def encode_prompt(bundle: Bundle, prompt: str | list[int], chat_template: bool) -> list[int]:
    """Token ids of the prompt: through the chat template (as a user turn) or as plain text."""
    if isinstance(prompt, list):  # ids straight in (tiny test models have no tokenizer)
        if not prompt:
            raise InvalidInput("the prompt is empty")
        return list(prompt)
    tok = bundle.tokenizer
    assert tok is not None
    if chat_template and getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    return tok(prompt, add_special_tokens=True)["input_ids"]


# Prompt positions whose target predictions seed token recycling's successor table at prefill. Each
# costs a row of the LM head (576 x 49152 on the offline preset): 128 rows cost ~70 ms of the first
# token's delay on a 2-core CPU, 32 cost ~20; the table learns from every verification afterwards.
RECYCLING_SEED = 32


def scaffold_positions(bundle: Bundle, prompt: str | list[int], prompt_ids: list[int], chat_template: bool) -> frozenset[int]:
    """Positions of `prompt_ids` the user did not write: the chat template's system turn, role names,
    special tokens and the generation prompt. Found by rendering the template around an empty message:
    what the two renderings share at the start and at the end is scaffolding."""
    tok = bundle.tokenizer
    if tok is None:
        return frozenset()
    special = set(getattr(tok, "all_special_ids", ()) or ())
    marked = {i for i, t in enumerate(prompt_ids) if t in special}
    if isinstance(prompt, str) and prompt and chat_template and getattr(tok, "chat_template", None):
        empty = encode_prompt(bundle, "", True)
        head = 0
        while head < min(len(empty), len(prompt_ids)) and empty[head] == prompt_ids[head]:
            head += 1
        tail = 0
        while tail < min(len(empty), len(prompt_ids)) - head and empty[-1 - tail] == prompt_ids[-1 - tail]:
            tail += 1
        marked |= set(range(head)) | set(range(len(prompt_ids) - tail, len(prompt_ids)))
    return frozenset(marked)


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


def _expected_accepted(g: list[float]) -> float:
    """E[accepted] = sum_i prod_{j<i} g_j: the chance that the first i positions all pass."""
    total, run = 0.0, 1.0
    for x in g:
        run *= x
        total += run
    return total


class VerifyCost:
    """Smoothed time of one verification by the number of ids fed (1 .. gamma + 1).

    On a GPU verifying gamma + 1 ids costs about one step; on a CPU it does not (docs/DESIGN.md §4),
    so the throughput reward charges each round what its verification really costs.
    """

    def __init__(self, gamma: int) -> None:
        self.ms = [0.0] * (gamma + 2)

    def add(self, fed: int, ms: float) -> None:
        old = self.ms[fed]
        self.ms[fed] = ms if old == 0 else 0.8 * old + 0.2 * ms

    def __call__(self, fed: int) -> float:
        if self.ms[fed]:
            return self.ms[fed]
        seen = [(i, m) for i, m in enumerate(self.ms) if m]
        if not seen:
            return 1.0
        lo = [(i, m) for i, m in seen if i < fed]
        hi = [(i, m) for i, m in seen if i > fed]
        if lo and hi:  # between two measured counts: interpolate
            (i0, m0), (i1, m1) = lo[-1], hi[0]
            return m0 + (m1 - m0) * (fed - i0) / (i1 - i0)
        # Outside them: the slope of the two nearest, or a prior of +10% of a step per extra id
        # (this CPU measures ~+10%; a GPU measures ~0 within a few rounds).
        near = (lo[-2:] if lo else hi[:2])
        (i0, m0) = near[-1] if lo else near[0]
        slope = (near[1][1] - near[0][1]) / (near[1][0] - near[0][0]) if len(near) == 2 else 0.1 * m0 / max(i0, 1)
        return max(m0 + max(slope, 0.0) * (fed - i0), 1e-3)


def _reward(kind: str, g: list[float], k: int, gamma: int, drafted_ms: float, fed: int, cost: VerifyCost) -> float:
    """The arm's reward in [0, 1] from per-position acceptance probabilities g (docs/DESIGN.md §1, formula 5).

    k is the draft length asked for this round (gamma, or less where the length adapts).
    bd: block divergence, mean of 1 - TV(p_j, q_j) over the k positions (0 where nothing was drafted).
    be: block efficiency, expected accepted / k.
    throughput: expected tokens per second of the round, relative to the best a round can do
    (gamma + 1 tokens from a free drafter); so a cheap drafter that accepts a little less can
    beat a costly one, and a drafter that proposes nothing is charged one plain step.
    """
    if kind == "bd":
        return sum(g) / max(k, 1)
    e = _expected_accepted(g)
    if kind == "be":
        return e / max(k, 1)
    best = (gamma + 1) / cost(gamma + 1)
    return min(1.0, (1 + e) / (drafted_ms + cost(fed)) / best)


class _Arm:
    """Per-request statistics of one drafter."""

    def __init__(self) -> None:
        self.pulls = self.drafted = self.accepted = 0
        self.reward_sum = 0.0
        self.tokens_sum = 0.0  # realised tokens per target call, summed over pulls
        self.draft_s = self.verify_s = 0.0
        self.scored_tokens = 0.0  # full information: expected tokens per call, summed over rounds


def _stopped(stop: StopSignal) -> bool:
    if stop is None:
        return False
    return stop.is_set() if isinstance(stop, threading.Event) else bool(stop())


def generate(bundle: Bundle, prompt: str | list[int], *, drafters: Any = None, policy: str = "metasd-ucb",
             reward: str = "bd", gamma: int | None = None, max_new_tokens: int = 128,
             temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
             chat_template: bool = True, full_info: bool = False, stop: StopSignal = None,
             max_new_tokens_limit: int | None = None, inspect: Inspect | None = None,
             free_feedback: bool = True, adaptive: bool = True, sleeping: bool = True) -> Iterator[Event]:
    """Speculative generation with a bandit over drafters. Yields RoundEvents, then a Summary.

    Raises InvalidInput (before yielding anything) for bad prompts or settings. `stop` ends the
    generation at the next round boundary. `inspect(cache, ids, drafters)` is called after every
    round with the live state (tests use it to check the KV caches against a fresh prefill).
    `free_feedback` scores the model-free drafters on every verified chunk even when they were not
    pulled (it costs microseconds). `adaptive` lets each drafter's draft length move between 1 and
    gamma with its recent acceptance. `sleeping` lets the model-free drafters draft before the
    policy chooses, and the policy choose only among drafters with something to propose. None of
    the three changes the output, only how fast it comes.
    """
    st = validate_settings(bundle.drafter_names, drafters, policy, reward,
                           bundle.preset.gamma if gamma is None else gamma, max_new_tokens,
                           temperature, top_p, top_k, seed, chat_template, full_info,
                           max_new_tokens_limit, default=bundle.default_drafters)
    text_prompt = prompt if isinstance(prompt, str) else ""
    if isinstance(prompt, str):
        prompt = clean_prompt(prompt)
    prompt_ids = encode_prompt(bundle, prompt, st.chat_template)
    room = bundle.max_context - len(prompt_ids)
    if room < st.max_new_tokens + st.gamma + 1:
        raise InvalidInput(
            f"the prompt is {len(prompt_ids):,} tokens; with max_new_tokens={st.max_new_tokens} and "
            f"gamma={st.gamma} it must be at most {bundle.max_context - st.max_new_tokens - st.gamma - 1:,} "
            f"tokens (the model's context is {bundle.max_context:,})"
        )
    return _rounds(bundle, text_prompt, prompt_ids, st, stop, inspect, bool(free_feedback), bool(adaptive), bool(sleeping))


@torch.inference_mode()
def _rounds(bundle: Bundle, prompt: str, prompt_ids: list[int], st: Settings, stop: StopSignal,
            inspect: Inspect | None, free_feedback: bool, adaptive: bool, sleeping: bool) -> Iterator[Event]:
    t_start = time.perf_counter()
    dev = bundle.device
    s = Sampling(st.temperature, st.top_p, st.top_k)
    names = list(st.drafters)
    arms = bundle.make_drafters(names)
    # Rounds the request will take if each emits ~2 tokens: sequential halving's horizon.
    pol = make_policy(st.policy, names, seed=st.seed, horizon=max(8, st.max_new_tokens // 2))
    sleeping = sleeping and pol.name != "fixed" and any(d.model_free for d in arms)
    g_target = torch.Generator(device=dev).manual_seed(st.seed)
    g_draft = torch.Generator(device=dev).manual_seed(st.seed + 1)
    eos = bundle.eos_ids
    pieces = TextPieces(bundle.tokenizer)
    stats = {n: _Arm() for n in names}

    # Prefill the target with all but the last prompt token (the cache invariant above).
    target = bundle.target
    cache = DynamicCache(config=target.config)
    ids = list(prompt_ids)
    scaffold = scaffold_positions(bundle, prompt, prompt_ids, st.chat_template)
    for d in arms:
        d.reset(prompt_ids)
        d.mark_scaffold(scaffold)
    recyclers = [d for d in arms if isinstance(d, TokenRecycling)]
    if len(ids) > 1:
        keep = min(len(ids) - 1, RECYCLING_SEED) if recyclers else 1
        out = target(input_ids=torch.tensor([ids[:-1]], device=dev), past_key_values=cache,
                     use_cache=True, logits_to_keep=keep)
        # Seed the successor table with what the target predicted after the user's own tokens (after the
        # template's scaffolding it predicts more scaffolding: "<|im_start|>", "assistant", ...).
        first = len(ids) - 1 - keep
        rows = [j for j in range(keep) if first + j not in scaffold]
        for d in recyclers:
            if rows:
                d.learn([ids[first + j] for j in rows], out.logits[0, rows])
    prefill_s = time.perf_counter() - t_start

    new_tokens = target_calls = accepted_total = 0
    draft_s = verify_s = overhead_s = 0.0
    verify_cost = VerifyCost(st.gamma)  # the throughput reward's yardstick
    regret = 0.0
    chosen_scored = 0.0  # full information: expected tokens of the arms actually pulled
    stop_reason = "max_new_tokens"
    generated: list[int] = []
    rnd = 0
    # Per-arm draft length: one more after a fully accepted draft, accepted + 1 after a rejection
    # (on a CPU every extra verified id costs ~15% of a step, so long doomed drafts are expensive).
    caps = [st.gamma] * len(arms)
    budget = st.max_new_tokens - 1
    pre: dict[int, Draft] = {}

    def length(i: int) -> int:
        """Arm i's draft length this round: its adaptive cap, never past the token budget."""
        return min(caps[i] if adaptive else st.gamma, budget)

    def plan(i: int, alpha: float) -> tuple[float, int]:
        """Expected tokens per ms of a round with arm i, if each drafted position passes with
        probability alpha, and the draft length that maximises it (0: a plain target step)."""
        kmax = min(length(i), len(pre[i].tokens)) if i in pre else length(i)
        d_ms = arms[i].ms_per_token
        best_v, best_k = 1.0 / verify_cost(1), 0
        for kk in range(1, kmax + 1):
            v = (1.0 + _expected_accepted([alpha] * kk)) / (kk * d_ms + verify_cost(kk + 1))
            if v > best_v:
                best_v, best_k = v, kk
        return best_v, best_k

    if hasattr(pol, "plan"):
        pol.plan = plan  # the cost-aware policy reads rounds through the engine's cost model (live state)

    while new_tokens < st.max_new_tokens:
        if _stopped(stop):
            stop_reason = "stopped"
            break
        rnd += 1
        # Never draft past the budget: a round emits accepted + 1 tokens.
        budget = st.max_new_tokens - new_tokens - 1
        t_pre = time.perf_counter()
        # Sleeping arms: the model-free drafters draft first (microseconds, deterministic, no
        # random numbers drawn); one with nothing to propose is asleep and the policy chooses
        # among the others, since pulling it would only be a plain target step.
        pre.clear()
        awake: list[bool] | None = None
        if sleeping:
            for i, d in enumerate(arms):
                if d.model_free:
                    ki = length(i)
                    pre[i] = d.propose(ids, ki, s, g_draft) if ki > 0 else Draft([], None)
            awake = [bool(pre[i].tokens) if i in pre else True for i in range(len(arms))]
        t0 = time.perf_counter()
        pre_s = t0 - t_pre
        probs = pol.probabilities(awake)
        arm = pol.choose(awake)
        drafter = arms[arm]
        k = length(arm)
        if getattr(pol, "length", None) == 0:
            # No drafter is worth its cost now: a plain target step. Otherwise the length stays the
            # adaptive cap, which follows the drafter's recent runs (prompt lookup's drafts pass
            # all-or-nothing, which the plan's i.i.d. alpha understates).
            k = 0
        t1 = time.perf_counter()
        if arm in pre:
            draft = pre[arm]
        else:
            if drafter.shared_layers and k > 0:
                drafter.adopt(cache, ids)
            draft = drafter.propose(ids, k, s, g_draft) if k > 0 else None
        tokens = draft.tokens[:k] if draft else []
        q = draft.q[: len(tokens)] if draft is not None and draft.q is not None else None
        t2 = time.perf_counter()

        # Verify: feed the last id and the draft; row j of the logits checks draft[j].
        start = len(ids)
        inputs = [ids[-1]] + tokens
        pos = torch.arange(start - 1, start + len(tokens), device=dev).view(1, -1)
        logits = target(input_ids=torch.tensor([inputs], device=dev), position_ids=pos,
                        past_key_values=cache, use_cache=True).logits[0]
        v = verify(logits, torch.tensor(tokens, dtype=torch.long, device=dev), q, s, g_target)
        # Roll the cache back to ids + accepted draft (the target's own token is fed next round).
        crop_to(cache, start + v.accepted)
        t3 = time.perf_counter()

        emitted = tokens[: v.accepted] + [v.token]
        emitted = emitted[: st.max_new_tokens - new_tokens]
        hit_eos = next((i for i, t in enumerate(emitted) if t in eos), None)
        if hit_eos is not None:
            emitted = emitted[: hit_eos + 1]
        ids.extend(emitted)
        generated.extend(emitted)
        new_tokens += len(emitted)
        target_calls += 1
        accepted_total += v.accepted
        d_ms, v_ms = 1000 * (t2 - t1), 1000 * (t3 - t2)
        drafter.record_time(t2 - t1, len(tokens))
        verify_cost.add(len(inputs), v_ms)

        if len(tokens) == k and v.accepted == k:
            caps[arm] = min(st.gamma, caps[arm] + 1)
        elif v.accepted < len(tokens):
            caps[arm] = max(1, v.accepted + 1)

        def reward_of(g: list[float], kk: int, drafted_ms: float, fed: int) -> float:
            return _reward(st.reward, g, kk, st.gamma, drafted_ms, fed, verify_cost)

        # Block efficiency is the realised accepted share; the others use the per-position betas.
        own = v.accepted / max(k, 1) if st.reward == "be" else reward_of(v.beta, k, d_ms, len(inputs))
        t4 = time.perf_counter()
        rewards: list[float | None] = [None] * len(arms)
        feedback_s = 0.0
        # Full information scores every drafter on the verified chunk, teacher-forced. Without it,
        # model-free drafters are still scored when `free_feedback` is on: for them it costs
        # microseconds, and the policy then learns about them without spending rounds on them.
        if st.full_info:
            scored = list(range(len(arms)))
        elif free_feedback:
            # Only awake arms: a sleeping arm's mean is its reward when it can play.
            scored = [i for i, d in enumerate(arms) if d.model_free and i != arm and (awake is None or awake[i])]
        else:
            scored = []
        if scored:
            m = min(len(emitted), st.gamma)
            p_rows = None if s.greedy else warp(logits[:m], s)
            chunk = torch.tensor(emitted[:m], device=dev)
            for i in scored:
                d = arms[i]
                if i == arm:
                    g = (v.beta + [0.0] * m)[:m]
                else:
                    if d.shared_layers:
                        d.adopt(cache, ids)
                    pred = d.predict(ids, start, m, s).to(dev)
                    if pred.dim() == 1 and s.greedy:
                        g = (pred == chunk).float().tolist()
                    elif pred.dim() == 1:
                        valid = pred >= 0
                        g = torch.where(valid, p_rows[torch.arange(m, device=dev), pred.clamp_min(0)], 0.0).tolist()
                    else:
                        g = torch.minimum(p_rows, pred).sum(-1).tolist()
                # Had it drafted, it would have proposed up to gamma ids: charge that verification.
                rewards[i] = reward_of(g, m, d.ms_per_token * st.gamma, st.gamma + 1)
                tokens_i = 1 + _expected_accepted(g)
                stats[names[i]].scored_tokens += tokens_i
                if i == arm:
                    chosen_scored += tokens_i
            feedback_s = time.perf_counter() - t4
        if st.full_info:
            # Measured regret: the best drafter in hindsight's expected tokens minus ours.
            regret = max(a.scored_tokens for a in stats.values()) - chosen_scored
        elif k > 0:  # a round that drafted nothing by choice says nothing about the drafter
            rewards[arm] = own
        pol.update(arm, rewards)
        for d in arms:
            d.observe(ids, Verified(start, inputs, logits, emitted))
        if inspect is not None:
            inspect(cache, ids, arms)

        a = stats[names[arm]]
        a.pulls += 1
        a.drafted += len(tokens)
        a.accepted += v.accepted
        a.reward_sum += own
        a.tokens_sum += v.accepted + 1
        a.draft_s += t2 - t1
        a.verify_s += t3 - t2
        if not st.full_info:
            # Estimated pseudo-regret: each round adds the gap between the best arm's mean tokens
            # per call and the pulled arm's, both as estimated so far (never negative).
            means = [x.tokens_sum / x.pulls for x in stats.values() if x.pulls]
            regret += max(means) - a.tokens_sum / a.pulls
        text = pieces.push(emitted)
        draft_text = [pieces.piece([t]) for t in tokens]
        t5 = time.perf_counter()
        o_ms = 1000 * ((t1 - t0) + (t5 - t3) - feedback_s)
        draft_s += t2 - t1 + feedback_s + pre_s
        verify_s += t3 - t2
        overhead_s += o_ms / 1000
        yield RoundEvent(
            round=rnd, drafter=names[arm], draft=tuple(tokens), accepted=v.accepted,
            emitted=tuple(emitted), target_token=v.token, bonus=v.accepted == len(tokens),
            p_draft=tuple(v.p_draft), q_draft=tuple(v.q_draft), accept_prob=tuple(v.accept_prob),
            reward=own, rewards=dict(zip(names, rewards, strict=True)),
            probabilities=dict(zip(names, probs, strict=True)), regret=max(regret, 0.0),
            regret_measured=st.full_info, draft_ms=d_ms + 1000 * (feedback_s + pre_s), verify_ms=v_ms, overhead_ms=o_ms,
            new_tokens=new_tokens, emitted_text=tuple(text), draft_text=tuple(draft_text),
        )
        if hit_eos is not None:
            stop_reason = "eos"
            break

    wall = time.perf_counter() - t_start
    text = bundle.tokenizer.decode(generated, skip_special_tokens=True) if bundle.tokenizer else " ".join(map(str, generated))
    yield Summary(
        prompt=prompt, text=text, token_ids=tuple(generated), new_tokens=new_tokens,
        target_calls=target_calls, mean_accepted=accepted_total / target_calls if target_calls else 0.0,
        wall_s=wall, tokens_per_s=new_tokens / wall if wall > 0 else 0.0, draft_s=draft_s,
        verify_s=verify_s, overhead_s=overhead_s, prefill_s=prefill_s, stop_reason=stop_reason,
        regret=max(regret, 0.0), regret_measured=st.full_info,
        drafters=tuple(
            DrafterStats(n, a.pulls, a.drafted, a.accepted, a.reward_sum / a.pulls if a.pulls else 0.0,
                         a.draft_s, a.verify_s)
            for n, a in stats.items()
        ),
        config={"preset": bundle.preset.name, **asdict(st), "drafters": list(st.drafters), "free_feedback": free_feedback,
                "adaptive_gamma": adaptive, "sleeping_arms": sleeping},
    )


def run(bundle: Bundle, prompt: str | list[int], **kwargs: Any) -> tuple[list[RoundEvent], Summary]:
    """Consume a whole generation: its rounds and its summary."""
    rounds: list[RoundEvent] = []
    for ev in generate(bundle, prompt, **kwargs):
        if isinstance(ev, Summary):
            return rounds, ev
        rounds.append(ev)
    raise RuntimeError("generation ended without a summary")


def target_greedy(bundle: Bundle, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """The target's own greedy decoding through transformers `generate`: the reference."""
    inp = torch.tensor([prompt_ids], device=bundle.device)
    out = bundle.target.generate(inp, attention_mask=torch.ones_like(inp), do_sample=False,
                                 max_new_tokens=max_new_tokens, eos_token_id=sorted(bundle.eos_ids) or None,
                                 pad_token_id=sorted(bundle.eos_ids)[0] if bundle.eos_ids else 0)
    return out[0, len(prompt_ids):].tolist()

