"""The prompt as the engine reads it: its token ids (chat template or plain text) and which of them the user
did not write (the template's scaffolding), shared by the engine and the after-the-answer lanes."""

from __future__ import annotations

from metasd.core.validation import InvalidInput
from metasd.decoding.loading import Bundle


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
        empty = _empty_chat(bundle)
        head = 0
        while head < min(len(empty), len(prompt_ids)) and empty[head] == prompt_ids[head]:
            head += 1
        tail = 0
        while tail < min(len(empty), len(prompt_ids)) - head and empty[-1 - tail] == prompt_ids[-1 - tail]:
            tail += 1
        marked |= set(range(head)) | set(range(len(prompt_ids) - tail, len(prompt_ids)))
    return frozenset(marked)


def _empty_chat(bundle: Bundle) -> list[int]:
    """The chat template rendered around an empty user message, once per bundle (every request asks)."""
    ids = getattr(bundle, "_empty_chat_ids", None)
    if ids is None:
        ids = encode_prompt(bundle, "", True)
        bundle._empty_chat_ids = ids
    return ids
