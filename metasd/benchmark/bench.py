"""The benchmark: every method on the same prompts, side by side in one process (docs/DESIGN.md §3, §6).

Methods (the names of `--methods`):

- `baseline`: the target alone through transformers `generate`, greedy: the yardstick;
- `baseline:default-kernels`: the same with torch's default linear kernels where the CPU target's layers are
  packed (metasd/models/cpu_linear.py): packing makes several ids cost about one step but can make one id
  dearer, so this is the target alone at its fastest, the fair second yardstick (same model, same tokens);
- `hf-pld` / `hf-pld:N`: transformers' prompt lookup (`prompt_lookup_num_tokens`, 10 by default);
- `hf-assisted:<drafter>`: transformers' assisted generation with one of the preset's model drafters;
- `single:<drafter>`: our engine with that drafter alone;
- `<policy>` / `<policy>/<reward>`: our engine with a bandit over every drafter of the preset;
- `oracle`: per prompt, the fastest `single:<drafter>` run of that prompt, chosen in hindsight.

Runs are interleaved: for each prompt every method runs once, in an order rotated by one per
prompt, so that drift of a shared machine (other jobs, thermal state) hits all methods alike.
With `--repeats N` each prompt's round of methods runs N times (rotated again each time) and
every method keeps its fastest run: on a shared machine noise only ever adds time.
Speed-up is the ratio of wall times measured in this run; absolute times mean little.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import transformers
from tqdm.auto import tqdm

from metasd import paths
from metasd.bandits.policies import POLICIES, single_drafter
from metasd.bandits.priors import DEFAULT_WEIGHT, PRIOR_REWARDS, PRIORS_DIR, PRIORS_FORMAT
from metasd.benchmark.args import DEFAULT_KERNELS, default_methods, method_help
from metasd.benchmark.tables import BenchResult, summarize, summary_markdown
from metasd.core.events import RoundEvent
from metasd.core.validation import REWARDS, InvalidInput, clean_prompt, first_per_category, parse_prompt_set
from metasd.decoding.engine import encode_prompt, run, target_greedy
from metasd.decoding.loading import Bundle, default_drafters, load_bundle, present_specs
from metasd.drafting.registry import registered
from metasd.models.cpu_linear import default_kernels, packed_count
from metasd.models.presets import get_preset

EXAMPLES_FILE = paths.EXAMPLES_FILE
BENCH_FILE_MAX_BYTES = 200_000_000  # a local prompts file (Spec-Bench's is 0.7 MB)
DEFAULT_PLD_TOKENS = 10  # transformers' prompt lookup as docs/DESIGN.md §6 reports it
RESULT_COLUMNS = [
    "method", "question_id", "category", "new_tokens", "wall_s", "target_calls", "mean_accepted",
    "identical_to_baseline", "first_mismatch", "tokens_per_s", "cpu_s", "prompt_tokens", "prefill_s", "draft_s",
    "verify_s", "overhead_s", "stop_reason", "oracle_choice", "drafter_pulls",
]
ROUND_COLUMNS = ["method", "question_id", "category", "round", "drafter", "drafted", "accepted", "emitted",
                 "draft_ms", "verify_ms", "overhead_ms", "ids_verified"]


# ---------------------------------------------------------------------------------------------
# Methods


@dataclass(frozen=True)
class Method:
    """One way of generating, named as on the command line."""

    name: str
    kind: str  # "baseline" | "default-kernels" | "hf-pld" | "hf-assisted" | "engine" | "oracle"
    policy: str = ""  # engine: a policy name or single:<drafter>
    reward: str = ""  # engine: bd, be or throughput
    drafter: str = ""  # hf-assisted and single: the drafter
    lookup: int = DEFAULT_PLD_TOKENS  # hf-pld: prompt_lookup_num_tokens
    cold: bool = False  # engine: start the bandit without the preset's informed priors (`<method>@cold`)
    extra: tuple[str, ...] = ()  # engine: arms played besides the preset's default ones (`<policy>+<drafter>...`)
    dropped: tuple[str, ...] = ()  # engine: default arms left out (`<policy>~<drafter>...`)

    def arms(self, defaults: Sequence[str]) -> list[str] | None:
        """The bandit's arms: the preset's defaults with `extra` added and `dropped` taken out (None: the defaults)."""
        if not (self.extra or self.dropped):
            return None
        return [d for d in dict.fromkeys([*defaults, *self.extra]) if d not in self.dropped]

    @property
    def ours(self) -> bool:
        """True for our engine's methods (they report a time split per round)."""
        return self.kind == "engine"

    @property
    def single(self) -> bool:
        return self.kind == "engine" and single_drafter(self.policy) is not None


def parse_methods(spec: str | Sequence[str] | None, drafter_names: Sequence[str], model_drafters: Sequence[str],
                  reward: str = "bd", default_arms: Sequence[str] | None = None) -> list[Method]:
    """Methods from their names. Adds `baseline` first when missing: every ratio needs it. With the preset's
    `default_arms`, a bandit's `~<drafter>` must name one of them and leave at least one arm."""
    if reward not in REWARDS:
        raise InvalidInput(f"unknown reward {reward!r}; choose one of {', '.join(REWARDS)}")
    if spec is None or spec == "" or spec == []:
        names = default_methods(drafter_names)
    elif isinstance(spec, str):
        names = [m.strip() for m in spec.split(",") if m.strip()]
    else:
        names = list(spec)
    out: list[Method] = []
    for name in dict.fromkeys(names):
        out.append(_parse_method(name, list(drafter_names), list(model_drafters), reward))
    if not any(m.kind == "baseline" for m in out):
        out.insert(0, Method("baseline", "baseline"))
    for m in out if default_arms is not None else ():
        stray = [d for d in m.dropped if d not in default_arms]
        if stray:
            raise InvalidInput(f"method {m.name!r}: {stray[0]!r} is not a default arm ({', '.join(default_arms)})")
        if m.arms(default_arms) == []:
            raise InvalidInput(f"method {m.name!r} leaves the bandit no arm")
    if any(m.kind == "oracle" for m in out) and not any(m.single for m in out):
        raise InvalidInput("method 'oracle' picks the fastest single:<drafter> run per prompt: add at least one")
    return out


def _parse_method(name: str, drafters: list[str], models: list[str], default_reward: str) -> Method:
    if name in ("baseline", "oracle"):
        return Method(name, name)
    if name == DEFAULT_KERNELS:
        return Method(name, "default-kernels")
    if name == "hf-pld" or name.startswith("hf-pld:"):
        n = name.split(":", 1)[1] if ":" in name else str(DEFAULT_PLD_TOKENS)
        if not n.isdigit() or not 1 <= int(n) <= 64:
            raise InvalidInput(f"method {name!r}: hf-pld:N needs a number of lookup tokens N between 1 and 64")
        return Method(name, "hf-pld", lookup=int(n))
    if name.startswith("hf-assisted:"):
        d = name.split(":", 1)[1]
        if d not in models:
            raise InvalidInput(f"method {name!r}: transformers' assisted generation needs a model drafter; "
                               f"this preset has {', '.join(models) or 'none'}")
        return Method(name, "hf-assisted", drafter=d)
    base, _, flag = name.partition("@")
    if flag not in ("", "cold"):
        raise InvalidInput(f"method {name!r}: the only suffix is @cold")
    # <policy>+a~b: arm a added to the preset's default arms, default arm b left out.
    base, *marked = re.split(r"([+~])", base)
    extra = [x for sign, x in zip(marked[::2], marked[1::2], strict=True) if sign == "+"]
    dropped = [x for sign, x in zip(marked[::2], marked[1::2], strict=True) if sign == "~"]
    for x in (*extra, *dropped):
        if x not in drafters:
            raise InvalidInput(f"method {name!r}: unknown drafter {x!r}; this preset has {', '.join(drafters)}")
    if set(extra) & set(dropped):
        raise InvalidInput(f"method {name!r}: a drafter is both added (+) and left out (~)")
    policy, _, reward = base.partition("/")
    reward = reward or default_reward
    if reward not in REWARDS:
        raise InvalidInput(f"method {name!r}: unknown reward {reward!r}; choose one of {', '.join(REWARDS)}")
    d = single_drafter(policy)
    if d is not None:
        if extra or dropped:
            raise InvalidInput(f"method {name!r}: a single drafter plays alone; +<drafter> and ~<drafter> are for bandits")
        if d not in drafters:
            raise InvalidInput(f"method {name!r}: unknown drafter {d!r}; this preset has {', '.join(drafters)}")
        return Method(name, "engine", policy=policy, reward=reward, drafter=d)
    if policy in POLICIES:
        return Method(name, "engine", policy=policy, reward=reward, cold=bool(flag), extra=tuple(extra),
                      dropped=tuple(dropped))
    raise InvalidInput(f"unknown method {name!r}; {method_help()}")


# ---------------------------------------------------------------------------------------------
# Prompts


@dataclass(frozen=True)
class Prompt:
    question_id: Any
    category: str
    text: str


# Spec-Bench reports its MT-Bench part (eight sub-categories of ten prompts) as one task,
# "multi-turn conversation"; --spec-bench-tasks groups them so the file reads as its six tasks.
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def load_prompts(path: str | Path, categories: str | Sequence[str] | None = None,
                 per_category: int | None = None, spec_bench_tasks: bool = False) -> list[Prompt]:
    """Spec-Bench's format: one JSON object per line with question_id, category and turns; `path`
    "examples" reads the page's own examples (assets/examples.json).

    The first turn is the prompt. Keeps the file's order; `per_category` takes the first N of each.
    With `spec_bench_tasks`, MT-Bench's sub-categories become one category "mt_bench", whose
    first N prompts are taken one from each sub-category in turn.
    """
    if str(path) == "examples":  # the page's own examples (a JSON list of the same objects)
        p = EXAMPLES_FILE
        data = "\n".join(json.dumps(e) for e in json.loads(p.read_text(encoding="utf-8"))).encode("utf-8")
    else:
        p = Path(path)
        if not p.is_file():
            raise InvalidInput(f"no prompts file at {p}")
        data = p.read_bytes()
    try:
        items = parse_prompt_set(data, max_bytes=BENCH_FILE_MAX_BYTES, max_lines=10**6, int_ids=True)
    except InvalidInput as e:
        raise InvalidInput(f"{p}: {e}") from None
    rows = [Prompt(it["question_id"], it["category"], it["prompt"]) for it in items]
    if spec_bench_tasks:
        mt = [r for r in rows if r.category in MT_BENCH]
        by_sub = {c: [r for r in mt if r.category == c] for c in MT_BENCH}
        mixed = [r for i in range(max(map(len, by_sub.values()), default=0))
                 for c in MT_BENCH if i < len(by_sub[c]) for r in [by_sub[c][i]]]
        rest = [r for r in rows if r.category not in MT_BENCH]
        rows = [Prompt(r.question_id, "mt_bench", r.text) for r in mixed] + rest
    present = list(dict.fromkeys(r.category for r in rows))
    if categories:
        wanted = [c.strip() for c in categories.split(",")] if isinstance(categories, str) else list(categories)
        wanted = [c for c in wanted if c]
        unknown = [c for c in wanted if c not in present]
        if unknown:
            raise InvalidInput(f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(map(repr, unknown))}; "
                               f"{p.name} has {', '.join(present)}")
        rows = [r for r in rows if r.category in wanted]
    if per_category:
        rows = first_per_category(rows, per_category, category=lambda r: r.category)
    if not rows:
        raise InvalidInput(f"no prompts selected from {p}")
    return rows


def prompt_ids(bundle: Bundle, text: str, chat_template: bool) -> list[int]:
    """The token ids every method gets for one prompt (the same list for all of them)."""
    text = clean_prompt(text)
    if bundle.tokenizer is None:  # tiny test models: bytes folded into the vocabulary
        return [b % bundle.target_vocab for b in text.encode("utf-8")]
    return encode_prompt(bundle, text, chat_template)


# ---------------------------------------------------------------------------------------------
# Running one method on one prompt


@dataclass
class Outcome:
    """What one method produced on one prompt, timed from outside."""

    token_ids: list[int]
    wall_s: float
    target_calls: int
    mean_accepted: float
    cpu_s: float = math.nan  # CPU time of this process during the run (all its threads)
    prefill_s: float = math.nan
    draft_s: float = math.nan
    verify_s: float = math.nan
    overhead_s: float = math.nan
    stop_reason: str = ""
    pulls: dict[str, int] = field(default_factory=dict)
    rounds: list[RoundEvent] = field(default_factory=list)


class _CallCounter:
    """Counts the target's own forward calls (not a layer-skip view's, which shares its hooks dict), and times
    the first call after `arm()`: in transformers' `generate` that one reads the prompt."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.calls = model, 0
        self.first_s: float | None = None
        self._t0: float | None = None
        self.cuda = next(model.parameters()).device.type == "cuda"
        self.handles = [model.register_forward_pre_hook(self._start), model.register_forward_hook(self._hook)]

    def arm(self) -> None:
        self.first_s = self._t0 = None

    def _start(self, module: torch.nn.Module, args: Any) -> None:
        if module is self.model and self._t0 is None:
            self._t0 = time.perf_counter()

    def _hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if module is self.model:
            self.calls += 1
            if self.first_s is None and self._t0 is not None:
                if self.cuda:
                    torch.cuda.synchronize()
                self.first_s = time.perf_counter() - self._t0

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_method(bundle: Bundle, method: Method, ids: list[int], max_new_tokens: int, *, gamma: int | None = None,
               seed: int = 0, counter: _CallCounter | None = None, cold: bool = False) -> Outcome:
    """Run one method on one prompt's ids and time it (host-synchronised on a GPU)."""
    if method.kind == "oracle":
        raise ValueError("the oracle is computed from the single:<drafter> runs, not run")
    dev = bundle.device
    if method.ours:
        drafters = [method.drafter] if method.single else method.arms(bundle.default_drafters)
        _sync(dev)
        t0, c0 = time.perf_counter(), time.process_time()
        rounds, s = run(bundle, ids, drafters=drafters, policy=method.policy, reward=method.reward, gamma=gamma,
                        max_new_tokens=max_new_tokens, seed=seed, priors=not (method.cold or cold))
        _sync(dev)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        pulls = Counter(r.drafter for r in rounds)
        # The time split comes from the per-round events (their sum is the summary's).
        return Outcome(list(s.token_ids), wall, s.target_calls, s.mean_accepted, cpu_s=cpu, prefill_s=s.prefill_s,
                       draft_s=sum(r.draft_ms for r in rounds) / 1000, verify_s=sum(r.verify_ms for r in rounds) / 1000,
                       overhead_s=sum(r.overhead_ms for r in rounds) / 1000, stop_reason=s.stop_reason,
                       pulls=dict(pulls), rounds=rounds)
    extra: dict[str, Any] = {}
    if method.kind == "hf-pld":
        extra["prompt_lookup_num_tokens"] = method.lookup
    elif method.kind == "hf-assisted":
        helper = bundle.models[method.drafter]
        sizes = (getattr(bundle.target.config, "vocab_size", None), getattr(helper.config, "vocab_size", None))
        if sizes[0] != sizes[1]:  # transformers then takes them for different tokenizers and refuses
            raise InvalidInput(f"method {method.name!r}: transformers' assisted generation needs the same vocabulary "
                               f"size in both models ({sizes[0]} vs {sizes[1]}); our engine handles it (fit_vocab)")
        extra["assistant_model"] = helper
    before = counter.calls if counter else 0
    if counter:
        counter.arm()
    with default_kernels(bundle.target) if method.kind == "default-kernels" else nullcontext():
        _sync(dev)
        t0, c0 = time.perf_counter(), time.process_time()
        out = target_greedy(bundle, ids, max_new_tokens, **extra)
        _sync(dev)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    # Every forward call of `generate` emits at least one token (its first one also prefills).
    calls = counter.calls - before if counter else 0
    mean_acc = max(0.0, len(out) / calls - 1) if calls else math.nan
    stop = "eos" if out and out[-1] in bundle.eos_ids else "max_new_tokens"
    # Its prompt's pass: the first forward call (with prompt lookup or assisted generation, also the first candidates).
    prefill = counter.first_s if counter and counter.first_s is not None else math.nan
    return Outcome(out, wall, calls, mean_acc, cpu_s=cpu, prefill_s=prefill, stop_reason=stop)


# ---------------------------------------------------------------------------------------------
# The benchmark


def _first_mismatch(a: Sequence[int], b: Sequence[int]) -> int:
    """Index of the first differing token, -1 when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def run_bench(bundle: Bundle, prompts: Sequence[Prompt], methods: Sequence[Method], *, max_new_tokens: int = 128,
              gamma: int | None = None, chat_template: bool = True, seed: int = 0, warmup: bool = True,
              progress: bool = True, log: Callable[[str], None] | None = None,
              on_prompt: Callable[[BenchResult], None] | None = None, repeats: int = 1,
              cold: bool = False) -> BenchResult:
    """Every method on every prompt, interleaved; the oracle rows are derived afterwards.

    `repeats`: run each prompt's methods that many times and keep each method's fastest run.
    `on_prompt` receives the results so far after each prompt (to checkpoint a long run).
    """
    if repeats < 1:
        raise InvalidInput(f"repeats must be 1 or more, got {repeats}")
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    if not any(m.kind == "baseline" for m in methods):
        raise InvalidInput("the benchmark needs the 'baseline' method: every speed-up is relative to it")
    runnable = [m for m in methods if m.kind != "oracle"]
    g = bundle.preset.gamma if gamma is None else gamma
    encoded = _encode_prompts(bundle, prompts, max_new_tokens + g + 1, chat_template, log)
    meta = {
        "preset": bundle.preset.name, "device": str(bundle.device),
        "dtype": str(next(bundle.target.parameters()).dtype).replace("torch.", ""),
        "max_new_tokens": max_new_tokens, "gamma": g, "chat_template": chat_template, "seed": seed,
        "prompts": len(encoded), "methods": [m.name for m in methods], "torch_threads": torch.get_num_threads(),
        "repeats": repeats, "cold": cold, "packed_layers": packed_count(bundle.target),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    counter = _CallCounter(bundle.target)
    rows: list[dict[str, Any]] = []
    round_rows: list[dict[str, Any]] = []

    def one(m: Method, ids: list[int], n: int) -> Outcome:
        return run_method(bundle, m, ids, n, gamma=g, seed=seed, counter=counter, cold=cold)

    try:
        if warmup:  # first calls pay for lazy initialisation: not measured
            for m in runnable:
                one(m, encoded[0][1], min(8, max_new_tokens))
        # Models and tokenizer are long-lived: freeze them out of the collector so that the full
        # collection before each run (outside its timing) stays cheap.
        gc.collect()
        gc.freeze()
        bar = tqdm(total=len(encoded) * len(runnable) * repeats, desc="bench", unit="run", file=sys.stderr,
                   disable=not progress, dynamic_ncols=True)
        for i, (p, ids) in enumerate(encoded):
            fastest = _fastest_runs(lambda m, ids=ids: one(m, ids, max_new_tokens), runnable, i, repeats, p, bar)
            _prompt_rows(methods, p, ids, fastest, rows, round_rows)
            # What the cost-aware plans read as the pass's price by ids fed in this process (probed once, by the
            # first greedy run, warm-up or measured): a probe taken while the machine was busy can make drafting
            # look dearer or cheaper for the whole run, so a reader sees the curve the run's decisions stood on.
            if bundle.probed:
                meta["verify_profile"] = [[n, round(ms, 2)] for n, ms in bundle.probed]
            if on_prompt is not None:
                on_prompt(_result(rows, round_rows, meta | {"prompts": i + 1}))
        bar.close()
    finally:
        gc.unfreeze()
        counter.close()
    return _result(rows, round_rows, meta)


def _encode_prompts(bundle: Bundle, prompts: Sequence[Prompt], room: int, chat_template: bool,
                    log: Callable[[str], None]) -> list[tuple[Prompt, list[int]]]:
    """Every prompt's ids, skipping those that leave fewer than `room` positions in the context."""
    encoded: list[tuple[Prompt, list[int]]] = []
    for p in prompts:
        ids = prompt_ids(bundle, p.text, chat_template)
        if len(ids) + room > bundle.max_context:
            log(f"[bench] skipping question {p.question_id}: {len(ids)} prompt tokens leave no room for "
                f"{room} more positions in {bundle.max_context}")
            continue
        encoded.append((p, ids))
    if not encoded:
        raise InvalidInput("no prompt fits the model's context")
    return _round_robin(encoded)


def _fastest_runs(one: Callable[[Method], Outcome], runnable: list[Method], i: int, repeats: int, p: Prompt,
                  bar: Any) -> dict[str, tuple[Method, Outcome]]:
    """Each method's fastest of `repeats` runs on prompt number i, in an order rotated per prompt and
    per repeat (no method always runs first or last); repeats must agree token for token."""
    fastest: dict[str, tuple[Method, Outcome]] = {}
    for rep in range(repeats):
        k = (i + rep) % len(runnable)
        for m in runnable[k:] + runnable[:k]:
            bar.set_postfix_str(f"q{p.question_id} {p.category} {m.name}", refresh=False)
            gc.collect()  # not inside anyone's timing
            o = one(m)
            if m.name in fastest and fastest[m.name][1].token_ids != o.token_ids:
                raise RuntimeError(f"{m.name} gave different tokens on question {p.question_id} when repeated")
            if m.name not in fastest or o.wall_s < fastest[m.name][1].wall_s:
                fastest[m.name] = (m, o)
            bar.update(1)
    return fastest


def _prompt_rows(methods: Sequence[Method], p: Prompt, ids: list[int], fastest: dict[str, tuple[Method, Outcome]],
                 rows: list[dict[str, Any]], round_rows: list[dict[str, Any]]) -> None:
    """One prompt's result rows (the oracle's picked from the single-drafter runs) and round rows."""
    base = next(o for m, o in fastest.values() if m.kind == "baseline").token_ids
    for m in methods:
        if m.kind == "oracle":
            singles = [(n, o) for n, (mm, o) in fastest.items() if mm.single]
            choice, o = min(singles, key=lambda x: x[1].wall_s)
            rows.append(_row(m.name, p, ids, o, base, oracle_choice=choice))
            continue
        o = fastest[m.name][1]
        rows.append(_row(m.name, p, ids, o, base))
        round_rows.extend({
            "method": m.name, "question_id": p.question_id, "category": p.category, "round": r.round,
            "drafter": r.drafter, "drafted": len(r.draft), "accepted": r.accepted, "emitted": len(r.emitted),
            "draft_ms": r.draft_ms, "verify_ms": r.verify_ms, "overhead_ms": r.overhead_ms,
            "ids_verified": r.ids_verified,
        } for r in o.rounds)


def _round_robin(encoded: list[tuple[Prompt, list[int]]]) -> list[tuple[Prompt, list[int]]]:
    """The first prompt of every category, then the second of every category, ...: a run cut short
    (or checkpointed) has already covered every category."""
    seen: Counter[str] = Counter()
    keyed = []
    for n, (p, ids) in enumerate(encoded):
        keyed.append((seen[p.category], n, p, ids))
        seen[p.category] += 1
    return [(p, ids) for _, _, p, ids in sorted(keyed, key=lambda x: (x[0], x[1]))]


def _result(rows: list[dict[str, Any]], round_rows: list[dict[str, Any]], meta: dict[str, Any]) -> BenchResult:
    return BenchResult(pd.DataFrame(rows, columns=RESULT_COLUMNS), pd.DataFrame(round_rows, columns=ROUND_COLUMNS), dict(meta))


def _row(name: str, p: Prompt, ids: list[int], o: Outcome, base: list[int], oracle_choice: str = "") -> dict[str, Any]:
    mismatch = _first_mismatch(o.token_ids, base)
    return {
        "method": name, "question_id": p.question_id, "category": p.category, "new_tokens": len(o.token_ids),
        "wall_s": o.wall_s, "target_calls": o.target_calls, "mean_accepted": o.mean_accepted,
        "identical_to_baseline": mismatch < 0, "first_mismatch": mismatch,
        "tokens_per_s": len(o.token_ids) / o.wall_s if o.wall_s > 0 else math.nan, "cpu_s": o.cpu_s,
        "prompt_tokens": len(ids), "prefill_s": o.prefill_s, "draft_s": o.draft_s, "verify_s": o.verify_s,
        "overhead_s": o.overhead_s, "stop_reason": o.stop_reason, "oracle_choice": oracle_choice,
        "drafter_pulls": " ".join(f"{k}={v}" for k, v in sorted(o.pulls.items())),
    }



def write_outputs(result: BenchResult, out_dir: str | Path, html: bool = True) -> dict[str, Path]:
    """results.csv, rounds.csv, summary.md, summary.csv, meta.json and (with html) report.html in out_dir."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = {name: d / name for name in ("results.csv", "rounds.csv", "summary.csv", "summary.md", "meta.json",
                                          "report.html")}
    result.results.to_csv(paths["results.csv"], index=False)
    result.rounds.to_csv(paths["rounds.csv"], index=False)
    summarize(result.results).to_csv(paths["summary.csv"], index=False)
    paths["summary.md"].write_text(summary_markdown(result), encoding="utf-8")
    paths["meta.json"].write_text(json.dumps(result.meta, indent=2), encoding="utf-8")
    if html:
        # Deferred on purpose: the report pulls in plotly, which only an HTML report needs.
        from metasd.benchmark.report import report_html

        paths["report.html"].write_text(report_html(result), encoding="utf-8")
    else:
        del paths["report.html"]
    return paths


# ---------------------------------------------------------------------------------------------
# Command line


def cmd_bench(a: argparse.Namespace) -> int:
    if a.max_new_tokens < 1 or a.max_new_tokens > 4096:
        raise InvalidInput(f"max_new_tokens must be between 1 and 4096, got {a.max_new_tokens}")
    if a.per_category < 0:
        raise InvalidInput(f"per-category must be 0 (all) or more, got {a.per_category}")
    preset = get_preset(a.preset)
    prompts = load_prompts(a.prompts, a.categories, a.per_category or None, a.spec_bench_tasks)
    # Fail fast on the preset's declared drafters (model-free kinds aside, every drafter is a model);
    # the loaded bundle decides in the end (a preset may leave out a drafter whose weights are missing).
    # An operator's plugin drafters (METASD_PLUGINS, loaded by the CLI) join every preset's list.
    free = ("prompt-lookup", "token-recycling", "retrieval")
    names = [*preset.drafter_names, *(n for n in registered() if n not in preset.drafter_names)]
    parse_methods(a.methods, names, [d.name for d in preset.drafters if d.kind not in free], a.reward,
                  default_drafters(preset, present_specs(preset)))
    if a.threads is not None:
        if a.threads < 1:
            raise InvalidInput(f"threads must be 1 or more, got {a.threads}")
        torch.set_num_threads(a.threads)
    transformers.logging.set_verbosity_error()  # generate's advisory warnings would break the progress bar
    bundle = load_bundle(a.preset, device=a.device, dtype=a.dtype)
    methods = parse_methods(a.methods, bundle.drafter_names, list(bundle.models), a.reward, bundle.default_drafters)
    if not a.methods and not packed_count(bundle.target):  # nothing packed: it would be the baseline again
        methods = [m for m in methods if m.kind != "default-kernels"]
    cats = len(dict.fromkeys(p.category for p in prompts))
    print(f"[bench] {len(prompts)} prompts in {cats} categories x {len(methods)} methods: "
          f"{', '.join(m.name for m in methods)}", file=sys.stderr, flush=True)
    result = run_bench(bundle, prompts, methods, max_new_tokens=a.max_new_tokens, gamma=a.gamma,
                       chat_template=not a.no_chat_template, seed=a.seed, warmup=not a.no_warmup,
                       progress=not a.quiet, on_prompt=lambda partial: write_outputs(partial, a.out, html=False),
                       repeats=a.repeats, cold=a.cold)
    paths = write_outputs(result, a.out)
    print(paths["summary.md"].read_text(encoding="utf-8"))
    print(f"[bench] wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------
# Informed priors (metasd/bandits/priors.py): measured with the benchmark's prompts and runner


def measure_priors(bundle: Bundle, prompts: list[Prompt], max_new_tokens: int, weight: float = DEFAULT_WEIGHT,
                   progress: bool = True, arms: list[str] | None = None) -> dict[str, Any]:
    """Run every prompt with full information once per reward kind and average each arm's reward (`arms`: the
    preset's default arms unless named)."""
    arms = list(arms or bundle.default_drafters)
    sums = {r: dict.fromkeys(arms, 0.0) for r in PRIOR_REWARDS}
    counts = {r: dict.fromkeys(arms, 0) for r in PRIOR_REWARDS}
    jobs = [(r, p) for r in PRIOR_REWARDS for p in prompts]
    for reward, p in tqdm(jobs, desc="priors", unit="run", file=sys.stderr, disable=not progress):
        ids = prompt_ids(bundle, p.text, True)
        rounds, _ = run(bundle, ids, drafters=arms, policy="metasd-ucb", reward=reward, full_info=True,
                        max_new_tokens=max_new_tokens, priors=False)
        for ev in rounds:
            for a, x in ev.rewards.items():
                if x is not None:
                    sums[reward][a] += x
                    counts[reward][a] += 1
    return {
        "format": PRIORS_FORMAT, "preset": bundle.preset.name, "weight": weight,
        "means": {r: {a: round(sums[r][a] / counts[r][a], 4) for a in arms if counts[r][a]} for r in PRIOR_REWARDS},
        "meta": {"prompts": [str(p.question_id) for p in prompts], "max_new_tokens": max_new_tokens,
                 "date": time.strftime("%Y-%m-%d"), "command": " ".join(["python -m metasd priors", *sys.argv[2:]])},
    }


def cmd_priors(a: argparse.Namespace) -> int:
    everything = load_prompts(a.prompts, spec_bench_tasks=True)
    skipped = set(id(p) for p in first_per_category(everything, a.skip_per_category, category=lambda p: p.category))
    rest = [p for p in everything if id(p) not in skipped]
    prompts = first_per_category(rest, a.per_category, category=lambda p: p.category)
    if not prompts:
        raise InvalidInput(f"no prompts left in {a.prompts} after skipping {a.skip_per_category} per category")
    arms = [x.strip() for x in a.drafters.split(",") if x.strip()]
    bundle = load_bundle(a.preset)
    unknown = [x for x in arms if x not in bundle.drafter_names]
    if unknown:
        raise InvalidInput(f"no drafter {', '.join(unknown)} in preset {a.preset!r}: {', '.join(bundle.drafter_names)}")
    missing = [x for x in bundle.default_drafters if arms and x not in arms]
    if missing:  # the priors file serves the default arms first
        raise InvalidInput(f"--drafters must include every default arm; missing {', '.join(missing)}")
    doc = measure_priors(bundle, prompts, a.max_new_tokens, a.weight, arms=list(dict.fromkeys(arms)) or None)
    out = Path(a.out) if a.out else PRIORS_DIR / f"{a.preset}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}: {json.dumps(doc['means'])}")
    return 0
