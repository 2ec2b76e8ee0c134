"""Real text for training prompts that ships with the machine: no hub, no download.

Three sources, each with its licence recorded beside every shard that uses it:
- Python's own documentation topics (`pydoc_data.topics`, the text of `help()`) and standard-library
  source: PSF-2.0, on every Python installation.
- Manual pages of the Debian packages installed here (`/usr/share/man`, English and German): each
  page's licence is its package's, read from `/usr/share/doc/PACKAGE/copyright`.

Man pages are troff; `troff_text` keeps their prose (paragraphs under their section names) and drops
the markup, which is all a prompt needs.
"""

from __future__ import annotations

import functools
import gzip
import random
import re
from dataclasses import dataclass
from pathlib import Path

MAN_ROOT = Path("/usr/share/man")
DPKG_INFO = Path("/var/lib/dpkg/info")
DOC_ROOT = Path("/usr/share/doc")
PSF = "PSF-2.0 (Python's documentation and standard library)"


@dataclass(frozen=True)
class Passage:
    """A paragraph or a few of real text, with where it came from and under which licence."""

    text: str
    title: str  # the command, module or topic it documents
    source: str  # e.g. "man:de/xz.1" or "pydoc:assert"
    licence: str


# Inline troff: font changes, named glyphs, escapes that print nothing.
_FONT = re.compile(r"\\f(?:\[[^\]]*\]|\(..|.)")
_GLYPH = {"(em": "-", "(en": "-", "(bu": "*", "(aq": "'", "(dq": '"', "(lq": '"', "(rq": '"', "(oq": "'",
          "(cq": "'", "(co": "(c)", "(ti": "~", "(ha": "^", "(rs": "\\", "(mi": "-", "(hy": "-", "(Fo": "«",
          "(Fc": "»", "(:a": "ä", "(:o": "ö", "(:u": "ü", "(ss": "ß", "(:A": "Ä", "(:O": "Ö", "(:U": "Ü"}
_NAMED = re.compile(r"\\(\(..|\[[^\]]*\])")
_STRING = re.compile(r"\\\*(?:\(..|\[[^\]]*\]|.)")
_BREAKS = {"PP", "P", "LP", "TP", "IP", "sp", "br", "RS", "RE", "HP", "nf", "fi", "in", "ti", "EX", "EE", "TQ"}
_FONT_MACROS = {"B", "I", "BR", "BI", "IB", "IR", "RB", "RI", "SM", "SB"}


def _inline(line: str) -> str:
    line = _FONT.sub("", line)
    line = _NAMED.sub(lambda m: _GLYPH.get(m.group(1), "") if m.group(1).startswith("(") else "", line)
    line = _STRING.sub("", line)
    for a, b in (("\\-", "-"), ("\\&", ""), ("\\e", "\\"), ("\\ ", " "), ("\\~", " "), ("\\|", ""), ("\\^", ""),
                 ("\\%", ""), ("\\c", ""), ("\\(", "(")):
        line = line.replace(a, b)
    return line


def troff_text(src: str) -> list[tuple[str, str]]:
    """(section, paragraph) pairs of a man page's prose; tables, code blocks' markup and comments dropped."""
    out: list[tuple[str, str]] = []
    section, para = "", []

    def flush() -> None:
        text = " ".join(" ".join(para).split())
        if text:
            out.append((section, text))
        para.clear()

    for raw in src.splitlines():
        if raw.startswith((".\\\"", "'\\\"", '.\\"')) or raw.strip() in {".", "'"}:
            continue
        if raw.startswith((".", "'")):
            parts = raw[1:].split(None, 1)
            if not parts:
                continue
            macro, rest = parts[0], (parts[1] if len(parts) > 1 else "")
            if macro in {"SH", "SS"}:
                flush()
                section = _inline(rest).strip('" ')
            elif macro in _FONT_MACROS:
                para.append(_inline(" ".join(w.strip('"') for w in rest.split())) if macro != "B" and macro != "I"
                            else _inline(rest.strip('"')))
            elif macro in _BREAKS:
                flush()
            continue  # .TH, .de, .if and other requests carry no prose
        para.append(_inline(raw))
    flush()
    return out


@functools.cache
def _package_of() -> dict[str, str]:
    """Installed file -> its Debian package, from dpkg's file lists (read once)."""
    owner: dict[str, str] = {}
    if DPKG_INFO.is_dir():
        for lst in DPKG_INFO.glob("*.list"):
            pkg = lst.stem.split(":")[0]
            try:
                for line in lst.read_text(encoding="utf-8", errors="replace").splitlines():
                    if line.startswith(str(MAN_ROOT)):
                        owner[line] = pkg
            except OSError:
                continue
    return owner


@functools.cache
def package_licence(pkg: str) -> str:
    """The package's licences as its copyright file names them (DEP-5 `License:` lines), else the file."""
    path = DOC_ROOT / pkg / "copyright"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"unknown (no {path})"
    names = sorted({ln.split(":", 1)[1].strip() for ln in text.splitlines()
                    if ln.startswith("License:") and ln.split(":", 1)[1].strip()})
    return f"{pkg}: {', '.join(names[:6])}" if names else f"{pkg}: see {path}"


def man_pages(lang: str = "") -> list[Path]:
    """Installed man pages of one language ('' = English, 'de' = German), sorted for reproducibility."""
    root = MAN_ROOT / lang if lang else MAN_ROOT
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("man[1-8]/*.gz") if p.is_file())


def man_families(pages: list[Path]) -> list[list[Path]]:
    """Pages grouped by family (`gcloud_alpha_...` pages are one family), so a sampler picking a family
    first does not draw one tool's thousands of pages nearly every time."""
    groups: dict[str, list[Path]] = {}
    for p in pages:
        groups.setdefault(re.split(r"[_.]", p.name, maxsplit=1)[0], []).append(p)
    return [groups[k] for k in sorted(groups)]


_SKIP_SECTIONS = {"SYNOPSIS", "ÜBERSICHT", "AUTHOR", "AUTHORS", "AUTOR", "AUTOREN", "COPYRIGHT", "SEE ALSO",
                  "SIEHE AUCH", "TRANSLATION", "ÜBERSETZUNG", "REPORTING BUGS", "FEHLER BERICHTEN"}


def man_page(path: Path) -> list[tuple[str, str]]:
    try:
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            return troff_text(f.read())
    except (OSError, EOFError):
        return []


def _run_of(paras: list[str], i: int, max_chars: int) -> str:
    """Paragraph i and as many of the ones after it as fit in max_chars."""
    text = paras[i]
    for p in paras[i + 1 :]:
        if len(text) + len(p) + 2 > max_chars:
            break
        text += "\n\n" + p
    return text


def man_passage(rng: random.Random, families: list[list[Path]], min_chars: int = 200, max_chars: int = 1400,
                tries: int = 40) -> Passage | None:
    """A run of consecutive paragraphs from a man page of a random family, between min_chars and max_chars long."""
    for _ in range(tries):
        if not families:
            return None
        path = rng.choice(rng.choice(families))
        paras = [t for s, t in man_page(path) if len(t) > 40 and s.upper() not in _SKIP_SECTIONS]
        if not paras:
            continue
        text = _run_of(paras, rng.randrange(len(paras)), max_chars)
        if min_chars <= len(text) <= max_chars * 1.3:
            rel = path.relative_to(MAN_ROOT)
            pkg = _package_of().get(str(path), "")
            licence = package_licence(pkg) if pkg else "unknown (no dpkg owner)"
            return Passage(text[: int(max_chars * 1.3)], path.name.split(".")[0], f"man:{rel}", licence)
    return None


def sentences(text: str, min_words: int = 6, max_words: int = 40) -> list[str]:
    """Whole sentences of prose (no option lists, no code), for translation prompts."""
    parts = re.split(r"(?<=[.!?])\s+(?=[A-ZÄÖÜ])", text)
    return [s for s in parts if min_words <= len(s.split()) <= max_words and s.endswith((".", "!", "?"))
            and not re.search(r"[{}<>=|]|--|\bhttps?:", s)]


@functools.cache
def pydoc_topics() -> dict[str, str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return {}
    return dict(sorted(topics.items()))


def pydoc_passage(rng: random.Random, min_chars: int = 200, max_chars: int = 1400) -> Passage | None:
    """Paragraphs of one of Python's documentation topics (prose paragraphs, not the code examples)."""
    topics = pydoc_topics()
    for _ in range(20):
        if not topics:
            return None
        name = rng.choice(list(topics))
        paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", topics[name])
                 if len(p) > 60 and not p.startswith("   ") and "***" not in p and "===" not in p]
        if not paras:
            continue
        text = _run_of(paras, rng.randrange(len(paras)), max_chars)
        if len(text) >= min_chars:
            return Passage(text[: int(max_chars * 1.3)], name, f"pydoc:{name}", PSF)
    return None
