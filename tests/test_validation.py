"""Bad input gets a clear InvalidInput naming the problem, from the API and the CLI."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metasd import InvalidInput, generate, run
from metasd.core.validation import LIMITS, clean_prompt, validate_settings
from tests.tiny import tiny_bundle

ARMS = ["prompt-lookup", "token-recycling", "layer-skip", "tiny-lm"]


@pytest.fixture(scope="module")
def tiny():
    return tiny_bundle(vocab=16)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(drafters="nope"), "unknown drafter"),
    (dict(policy="nope"), "unknown policy"),
    (dict(policy="single:nope"), "not among the chosen drafters"),
    (dict(reward="nope"), "unknown reward"),
    (dict(gamma=0), "gamma must be between 1 and 16"),
    (dict(gamma=2.5), "gamma must be a whole number"),
    (dict(max_new_tokens=0), "max_new_tokens must be between 1"),
    (dict(max_new_tokens="many"), "max_new_tokens must be a number"),
    (dict(temperature=-1), "temperature must be between 0.0 and 2.0"),
    (dict(temperature=float("nan")), "temperature must be a finite number"),
    (dict(top_p=0), "top_p must be between"),
    (dict(seed=-1), "seed must be between"),
    (dict(drafters=[]), None),  # empty list means every drafter: allowed
])
def test_bad_settings_raise_clear_errors(tiny, kwargs, needle):
    if needle is None:
        _, s = run(tiny, [1, 2, 3], max_new_tokens=3, **kwargs)
        assert s.new_tokens == 3
        return
    with pytest.raises(InvalidInput, match=needle):
        generate(tiny, [1, 2, 3], **kwargs)


def test_empty_and_overlong_prompts(tiny, offline):
    with pytest.raises(InvalidInput, match="empty"):
        generate(tiny, [])
    with pytest.raises(InvalidInput, match="empty"):
        generate(offline, "   \n\t ")
    with pytest.raises(InvalidInput, match="context"):
        generate(tiny, list(range(16)) * 40, max_new_tokens=8)  # 640 ids > 512 positions
    long = "word " * 6000  # ~6000 tokens (30,000 characters): under the character limit, over the room left
    with pytest.raises(InvalidInput, match=r"the model's context is 8,192"):
        generate(offline, long, max_new_tokens=4000)


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None)
def test_clean_prompt_on_arbitrary_text(text):
    try:
        out = clean_prompt(text)
    except InvalidInput as e:
        assert "empty" in str(e) or "limit" in str(e)
        return
    assert out.strip()
    out.encode("utf-8")  # always encodable: no lone surrogates survive
    assert all(ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co") for ch in out)


@given(
    gamma=st.one_of(st.integers(-5, 40), st.floats(allow_nan=True), st.text(max_size=4), st.none(), st.booleans()),
    mnt=st.one_of(st.integers(-5, 5000), st.floats(), st.text(max_size=4)),
    temperature=st.one_of(st.floats(-3, 5), st.floats(allow_nan=True, allow_infinity=True)),
    top_p=st.floats(-1, 2),
    seed=st.one_of(st.integers(-10, 2**33), st.floats()),
)
@settings(max_examples=400, deadline=None)
def test_settings_either_valid_or_clear_error(gamma, mnt, temperature, top_p, seed):
    try:
        s = validate_settings(ARMS, None, "metasd-ucb", "bd", gamma, mnt, temperature, top_p, 0, seed)
    except InvalidInput as e:
        assert any(name in str(e) for name in LIMITS)
        return
    lo, hi = LIMITS["gamma"]
    assert lo <= s.gamma <= hi and isinstance(s.gamma, int)
    assert 1 <= s.max_new_tokens <= LIMITS["max_new_tokens"][1]
    assert 0.0 <= s.temperature <= 2.0 and math.isfinite(s.temperature)
    assert 0.01 <= s.top_p <= 1.0 and 0 <= s.seed < 2**32


def test_odd_unicode_prompt_generates(offline):
    _, s = run(offline, "Ünïcödé \u202etest\u0000 with emoji 🧪 and CJK 漢字?", max_new_tokens=6)
    assert s.new_tokens == 6


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.run([sys.executable, "-m", "metasd", *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.offline_model
@pytest.mark.parametrize("args,needle", [
    (["generate", ""], "the prompt is empty"),
    (["generate", "hi", "--drafters", "nope"], "unknown drafter"),
    (["generate", "hi", "--policy", "nope"], "unknown policy"),
    (["generate", "hi", "--gamma", "0"], "gamma must be between 1 and 16"),
    (["generate", "hi", "--max-new-tokens", "0"], "max_new_tokens must be between 1"),
    (["generate", "hi", "--preset", "nope"], "unknown preset"),
])
def test_cli_bad_input_is_one_clear_line(args, needle, capsys):
    """In this process (a command line costs seconds of imports; tests/test_readme.py runs three of these as a
    user types them): status 2 and one line naming what was wrong."""
    from metasd.cli import main

    assert main(list(args)) == 2
    err = capsys.readouterr().err  # the model's loading lines, then the error
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0] and "Traceback" not in err, err


# ---- Bounds of one visitor's work (issue #27) ----

def test_compare_work_is_bounded_before_it_starts():
    from metasd.core.validation import COMPARE_MAX_WORK, check_compare_work

    assert check_compare_work(["x" * 2401], 256) <= COMPARE_MAX_WORK  # the 14 built-in examples at 256 tokens
    with pytest.raises(InvalidInput, match="at most 3,000,000.*at most 11,718 characters at 256 tokens"):
        check_compare_work(["word " * 3600] * 21, 256)  # the set (capped at 21 prompts)


def test_playground_work_is_bounded_with_what_fits():
    from metasd.core.validation import validate_playground

    rows = [{"drafter": f"d{i}", "acceptance": 0.5, "cost": 0.1} for i in range(8)]
    with pytest.raises(InvalidInput, match="at most 320,000: use at most 8,000 rounds"):
        validate_playground(rows, ["exp3", "hedge", "thompson", "uniform", "metasd-ucb"], 4, 20000, "bd", False, 8, 0)
    assert validate_playground(rows[:4], ["exp3", "hedge", "thompson", "uniform"], 4, 20000, "bd", False, 8, 0).rounds == 20000


def test_markdown_literal_shows_markup_as_text():
    from metasd.core.validation import markdown_literal

    out = markdown_literal('[click](https://evil.example) <script>|**x**\n')
    assert "](" not in out.replace("\\](", "").replace("\\(", "") and "<script>" not in out and "\\|" in out
    assert len(markdown_literal("x" * 1000)) <= 64
