"""What a user is told when a request goes wrong: bad input gets its own message, an unexpected fault a
short one (the log keeps the traceback), and out of memory frees what the failed request held."""

from __future__ import annotations

import gc
import logging
import traceback

import gradio as gr
import torch

from metasd.core.validation import InvalidInput

log = logging.getLogger("metasd.app")


def refused(e: InvalidInput) -> gr.Error:
    """Bad input: its message, for the user (not a server fault, so no traceback in the log either)."""
    return gr.Error(str(e), print_exception=False)


def failure(e: BaseException, what: str = "Generation") -> gr.Error:
    """A message for the user about an unexpected fault; the log keeps the traceback. Out of memory
    frees what the failed request held, so the shared models serve the next request normally."""
    log.error("request failed", exc_info=e)
    # The traceback's frames hold the failed request's KV caches and drafters: let them go now (the
    # gr.Error raised from here keeps `e` as its context), so that out of memory can really be freed.
    traceback.clear_frames(e.__traceback__)
    e.__traceback__ = None
    if isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower():
        free_memory()
        return gr.Error("Out of memory on this machine: try fewer new tokens, a shorter prompt, or again in a moment.",
                        print_exception=False)
    hint = " Try a shorter prompt or fewer tokens." if what == "Generation" else ""
    return gr.Error(f"{what} failed ({type(e).__name__}).{hint}", print_exception=False)


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
