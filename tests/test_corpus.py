"""The specialists' data pipeline: held-out prompts refused, shards that resume, real text parsed."""

from __future__ import annotations

import argparse
import json
import re

import numpy as np
import pytest

from metasd.paths import CORPUS_DIR, EXAMPLES_FILE
from metasd.training import corpus, sources


def _examples() -> list[str]:
    return [t for row in json.loads(EXAMPLES_FILE.read_text(encoding="utf-8")) for t in row["turns"]]


def test_held_out_refuses_benchmark_prompts_and_page_examples(tmp_path):
    bench = tmp_path / "question.jsonl"
    spec = ("Imagine you are writing a blog post comparing two popular smartphone models. Develop an outline "
            "for the blog post, including key points and subheadings.")
    bench.write_text(json.dumps({"question_id": 1, "turns": [spec]}) + "\n", encoding="utf-8")
    held = corpus.HeldOut.default(specbench=bench)
    example = _examples()[0]
    assert held.hits(spec) and held.hits(spec.upper() + "  ")  # case and spacing do not hide it
    assert held.hits("Please help me with this:\n\n" + spec)  # nor a template around it
    assert held.hits(example) and held.hits(f"Answer briefly. {example}")
    # Eight words in a row taken out of a benchmark prompt are enough.
    assert held.hits("Notes: comparing two popular smartphone models. Develop an outline for the talk.")
    # Prompts of the same kind and words that are not copied pass.
    assert not held.hits("Write a blog post outline that compares two laptops, with subheadings.")
    assert not held.hits("Translate into French: The museum opens at ten.")


def test_every_domain_makes_prompts_none_held_out():
    held = corpus.HeldOut.default()
    for domain in corpus.DOMAINS:
        prompts = corpus.domain_prompts(domain, seed=5, n=12)
        assert len(prompts) >= 8, domain
        assert corpus.domain_prompts(domain, seed=5, n=12) == prompts  # reproducible from the seed
        assert all(p.licence and p.source for p in prompts)
        assert sum(held.hits(p.text) for p in prompts) == 0, domain


def test_shard_plan_cycles_domains_and_holds_out_a_round():
    plan = [corpus.shard_plan(i) for i in range(6 * 18)]
    assert [d for d, _ in plan[:6]] == list(corpus.DOMAINS)
    assert {s for _, s in plan[6:12]} == {"eval"} and {s for _, s in plan[:6] + plan[12:96]} == {"train"}
    assert {s for _, s in plan[96 + 6 : 96 + 12]} == {"eval"}


def test_troff_prose_without_markup():
    src = "\n".join([
        '.\\" a comment that must vanish', ".TH XZ 1", ".SH NAME", "xz \\- compress \\fB.xz\\fP files",
        ".SH DESCRIPTION", "\\fBxz\\fR is a \\fIgeneral\\-purpose\\fP tool.", "It reads \\(lqfiles\\(rq.", ".PP",
        ".B \"Second paragraph\"", "continues here.", ".IP \\(bu 3", "A bullet.",
    ])
    assert sources.troff_text(src) == [
        ("NAME", "xz - compress .xz files"),
        ("DESCRIPTION", 'xz is a general-purpose tool. It reads "files".'),
        ("DESCRIPTION", "Second paragraph continues here."),
        ("DESCRIPTION", "A bullet."),
    ]


def test_passages_record_a_licence():
    import random

    p = sources.pydoc_passage(random.Random(0))
    assert p is not None and p.licence == sources.PSF and len(p.text) >= 200
    families = sources.man_families(sources.man_pages())
    if families:  # the Debian man pages are on this machine, maybe not on another
        m = sources.man_passage(random.Random(0), families)
        assert m is not None and m.source.startswith("man:") and m.licence


def _args(**kw) -> argparse.Namespace:
    a = corpus.build_parser().parse_args([])
    a.prompts_per_shard, a.max_new_tokens, a.batch = 3, 6, 2
    vars(a).update(kw)
    return a


@pytest.mark.parametrize("bad", [["--workers", "0"], ["--threads", "0"]])
def test_no_workers_or_threads_is_refused(bad, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        corpus.main(["--out", str(tmp_path), *bad])
    assert e.value.code == 2 and "must be at least 1" in capsys.readouterr().err


def test_a_run_for_some_domains_makes_only_their_shards():
    """`--domains math,code`: the plan's shards of those domains, under their own numbers (a later run of every
    domain fills the gaps with the shards it would have made); a misspelt domain is refused."""
    wanted = corpus.wanted_shards(_args(shards=30, domains="math, code"))
    assert wanted and {corpus.shard_plan(i)[0] for i in wanted} == {"math", "code"}
    assert wanted == [i for i in range(30) if corpus.shard_plan(i)[0] in ("math", "code")]
    assert {corpus.shard_plan(i)[1] for i in wanted} == {"train", "eval"}  # held-out rounds kept as planned
    assert corpus.wanted_shards(_args(shards=12)) == list(range(12))
    with pytest.raises(SystemExit, match="maths"):
        corpus.wanted_shards(_args(domains="maths"))


def test_shards_drop_held_out_prompts_and_resume(offline, tmp_path, monkeypatch):
    example = _examples()[1]
    real = corpus.domain_prompts

    def planted(domain: str, seed: int, n: int) -> list[corpus.Prompt]:
        return [corpus.Prompt(example, "templates", corpus.OWN)] + real(domain, seed, n - 1)

    monkeypatch.setattr(corpus, "domain_prompts", planted)
    held = corpus.HeldOut.default()
    made = {}
    for i in (0, 2):
        rows, info = corpus.make_shard(i, offline, _args(), held)
        corpus.write_shard(tmp_path, i, rows, info)
        made[i] = rows
        assert info["held_out_dropped"] == 1 and info["answers"] == len(rows) == 2
        assert info["prompts_version"] == (2 if info["domain"] in ("code", "math") else 1)
        assert all(example not in offline.tokenizer.decode(p) for p, _ in rows)
    # A shard cut off before its .json was written is not done, so a rerun makes it again.
    np.savez(tmp_path / "shard-00001.npz", ids=np.zeros(3, np.uint16), lengths=np.zeros((0, 2), np.int32))
    assert corpus.done_shards(tmp_path) == [0, 2]
    back = corpus.read_shard(tmp_path, 2)
    assert back == made[2] and all(len(a) <= 6 for _, a in back)
    man = corpus.write_manifest(tmp_path)
    assert man["shards"] == 2 and man["answer_tokens"] == sum(len(a) for r in made.values() for _, a in r)
    assert set(man["by_domain"]) == {"code/train", "translation/train"}
    assert list(corpus.iter_corpus(tmp_path, domain="translation")) == back


def test_the_progress_line_counts_this_runs_shards(offline, tmp_path, monkeypatch, capsys):
    """A run for one domain in a folder that holds other domains' shards says how many of its own are done (it
    once said "61/54 shards": every shard in the folder over the run's wanted ones)."""
    from metasd.decoding import loading

    other = [i for i in range(12) if corpus.shard_plan(i)[0] != "math"][:3]
    held = corpus.HeldOut.default()
    for i in other:
        rows, info = corpus.make_shard(i, offline, _args(), held)
        corpus.write_shard(tmp_path, i, rows, info)
    monkeypatch.setattr(loading, "load_bundle", lambda *a, **k: offline)
    assert corpus.main(["--out", str(tmp_path), "--shards", "12", "--domains", "math", "--prompts-per-shard", "2",
                        "--max-new-tokens", "4", "--batch", "2"]) == 0
    err = capsys.readouterr().err
    math = [i for i in range(12) if corpus.shard_plan(i)[0] == "math"]
    assert len(math) == 2 and corpus.done_shards(tmp_path) == sorted(other + math)
    assert "1/2 shards" in err and "2/2 shards" in err and "5/2" not in err


def test_workers_split_the_shards_and_share_the_folder(tmp_path):
    """`--workers 2`: two processes make every shard still to make, none twice, and the manifest counts all (as
    a user runs it: the command in a subprocess, on the offline model)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "metasd.training.corpus", "--out", str(tmp_path), "--shards", "5", "--only", "0,2,3,4",
           "--prompts-per-shard", "2", "--max-new-tokens", "3", "--batch", "2", "--workers", "2"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert corpus.done_shards(tmp_path) == [0, 2, 3, 4]  # --only is kept: shard 1 was not asked for
    made = {int(m) for m in re.findall(r"\[corpus \d/2\] shard (\d+)", run.stderr)}
    assert made == {0, 2, 3, 4} and "by 2 workers of 1 thread(s)" in run.stderr
    assert "[corpus 1/2]" in run.stderr and "[corpus 2/2]" in run.stderr
    assert json.loads((tmp_path / "manifest.json").read_text())["shards"] == 4
    assert not list(tmp_path.glob("*.tmp"))
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)  # resumes: nothing left
    assert again.returncode == 0 and "0 to make" in again.stderr and "by 2 workers" not in again.stderr


def test_answers_equal_the_targets_own_greedy(offline, reference_model):
    """Batched, left-padded answers are the target's greedy answers (a padding bug shows here)."""
    import torch

    prompts = [corpus.encode(offline.tokenizer, t, 640) for t in ("Name a colour.", "What is two plus two? Explain.")]
    outs = corpus.answers(offline.target, prompts, 8, offline.eos_ids, offline.tokenizer.pad_token_id or 0, 2)
    for p, out in zip(prompts, outs, strict=True):
        ref = reference_model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=8,
                                       pad_token_id=offline.tokenizer.pad_token_id or 0)[0, len(p):].tolist()
        cut = next((j + 1 for j, t in enumerate(ref) if t in offline.eos_ids), len(ref))
        assert out == ref[:cut]


def test_a_drafter_trains_from_corpus_shards(tmp_path):
    """`train --corpus`: the shards' (prompt, answer) ids become examples whose labels are the target's own
    distributions at the answer's tokens (one teacher-forced pass), train shards for training, eval held out."""
    import torch

    from metasd.training.common import corpus_examples
    from metasd.training.corpus import corpus_data
    from tests.tiny import tiny_llama

    target = tiny_llama(32)
    rows = [([1, 2, 3], [4, 5, 6, 7]), ([8, 9], [10, 11])]
    ex = corpus_examples(target, rows, topk=4)
    assert [e.start for e in ex] == [2, 1] and [e.labels for e in ex] == [4, 2]
    with torch.inference_mode():  # row j is the target's prediction after ids[start + j]
        full = torch.log_softmax(target(input_ids=torch.tensor([ex[0].ids])).logits[0].float(), -1)
    assert torch.allclose(ex[0].top_logp, full[2:6].topk(4, dim=-1).values, atol=1e-5)
    info = {"domain": "qa", "split": "train", "answers": 2, "answer_tokens": 6, "prompt_tokens": 5, "seconds": 1.0,
            "licences": ["x"], "settings": {}}
    corpus.write_shard(tmp_path, 4, rows, info)
    corpus.write_shard(tmp_path, 10, rows[:1], {**info, "split": "eval", "answers": 1})
    corpus.write_shard(tmp_path, 1, rows, {**info, "domain": "math"})  # another drafter's domain: not read
    corpus.write_manifest(tmp_path)
    a = argparse.Namespace(corpus=str(tmp_path), domain="chat", seed=0, topk=4, eval_prompts=8)
    train_ex, eval_ex, secs, shards = corpus_data(a, target)
    # the target's seconds of the drafter's own shards (the math shard's second is not counted)
    assert len(train_ex) == 2 and len(eval_ex) == 1 and secs == 2.0
    # A white-box head's run leaves them unscored: its features pass labels them (one target pass, not two).
    heads = corpus_data(argparse.Namespace(**vars(a), kind="white-box"), target)[0]
    assert [e.top_ids for e in heads] == [None, None] and [e.labels for e in heads] == [e.labels for e in train_ex]
    # What the drafter's file records of the folder: the shards it read (its domains' only), by split and prompts
    # version; one added after the data was read is not among them.
    assert shards == {"train_shards": 1, "eval_shards": 1, "answers": 3, "prompts_versions": {"1": 2},
                      "domains": {"qa": 2}}
    corpus.write_shard(tmp_path, 16, rows, {**info, "domain": "summarization", "prompts_version": 2})
    assert shards["train_shards"] == 1
    shards = corpus_data(a, target)[3]
    assert shards == {"train_shards": 2, "eval_shards": 1, "answers": 5, "prompts_versions": {"1": 2, "2": 1},
                      "domains": {"qa": 2, "summarization": 1}}
    assert corpus_data(argparse.Namespace(**{**vars(a), "domain": "math"}), target)[3]["train_shards"] == 1
    from metasd.training.common import corpus_line

    line = corpus_line({"corpus": "c", "domain": "chat", "corpus_shards": shards})
    assert line.startswith("- the qa, summarization shards of the corpus `c`")  # the domains it read, not all four
    assert "the chat, qa, summarization, translation shards" in corpus_line(
        {"corpus": "c", "domain": "chat", "corpus_shards": {k: v for k, v in shards.items() if k != "domains"}})
    assert "(2 train and 1 eval shards, 5 answers; prompts version 1: 2 shards, prompts version 2: 1 shard)" in line
    # `--shards-from`: a piece reads only the shards numbered from it on (train and held out alike), and its
    # card says so.
    later = corpus_data(argparse.Namespace(**vars(a), shards_from=10), target)
    assert len(later[0]) == 2 and len(later[1]) == 1  # shard 16 to train on, shard 10 held out; shard 4 not read
    assert later[3] == {"train_shards": 1, "eval_shards": 1, "answers": 3, "prompts_versions": {"1": 1, "2": 1},
                        "domains": {"qa": 1, "summarization": 1}, "first_shard": 10}
    assert "(1 train and 1 eval shards numbered 10 and up, 3 answers;" in corpus_line(
        {"corpus": "c", "domain": "chat", "corpus_shards": later[3]})
    with pytest.raises(SystemExit, match="numbered 17 or more"):
        corpus_data(argparse.Namespace(**vars(a), shards_from=17), target)
    with pytest.raises(SystemExit, match="no held-out shards of .* numbered 11 or more"):
        corpus_data(argparse.Namespace(**vars(a), shards_from=11), target)  # shard 16 to train on, none held out


def test_the_kept_corpus_matches_its_records_and_holds_no_measured_prompt(offline):
    """The shards committed in data/corpus: each as its record says (domain and split by the plan, answers and
    tokens counted), the manifest their sum, and no prompt a Spec-Bench turn or a page example."""
    shards = list(corpus.shard_infos(CORPUS_DIR))
    assert shards, f"{CORPUS_DIR} holds no finished shard"
    man = json.loads((CORPUS_DIR / "manifest.json").read_text(encoding="utf-8"))
    assert man["shards"] == len(shards)
    assert man["answer_tokens"] == sum(info["answer_tokens"] for _, info in shards)
    held = corpus.HeldOut.default()
    for i, info in shards:
        rows = corpus.read_shard(CORPUS_DIR, i)
        assert (info["shard"], info["answers"], len(rows)) == (i, len(rows), info["answers"])
        assert (info["domain"], info["split"]) == corpus.shard_plan(i)
        assert sum(len(a) for _, a in rows) == info["answer_tokens"]
        assert sum(len(p) for p, _ in rows) == info["prompt_tokens"]
        for p, a in rows:
            assert a and not held.hits(offline.tokenizer.decode(p)), (i, offline.tokenizer.decode(p)[:200])
