"""What a user is told when a request goes wrong: bad input gets its own message, an unexpected fault a
short one (the log keeps the traceback), and out of memory frees what the failed request held."""

from __future__ import annotations

import gc
import logging
import traceback
from typing import Any

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


def _refusal(block: Any, e: BaseException) -> gr.Error:
    label = getattr(block, "label", None) or getattr(block, "elem_id", None) or type(block).__name__.lower()
    log.info("refused a value for %s: %s", label, e)
    return gr.Error(f"{label}: the value sent is not a valid {type(block).__name__.lower()} value "
                    f"({type(e).__name__})", print_exception=False)


def name_input_errors(demo: gr.Blocks) -> None:
    """Every input component's checks answer with a message naming the component: gradio's own failures there
    (a wrong type sent through the API) reach the visitor as a bare "Error" otherwise (issue #27). Set on the
    instances, after the page is built."""
    inputs = {i for dep in demo.fns.values() for i in getattr(dep, "inputs", [])}
    for block in inputs:
        if getattr(block, "stateful", False):
            continue
        _wrap_preprocess(block)
        model = getattr(block, "data_model", None)
        if isinstance(model, type) and hasattr(model, "model_validate"):
            block.data_model = _checked_model(model, block)


def _wrap_preprocess(block: Any) -> None:
    original = block.preprocess

    def preprocess(payload: Any) -> Any:
        try:
            return original(payload)
        except gr.Error:
            raise
        except Exception as e:  # noqa: BLE001  (the visitor's value, refused by name)
            raise _refusal(block, e) from None

    block.preprocess = preprocess


def _checked_model(model: type, block: Any) -> type:
    def model_validate(cls: type, obj: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return model.model_validate(obj, *args, **kwargs)
        except Exception as e:  # noqa: BLE001
            raise _refusal(block, e) from None

    return type(model.__name__, (model,), {"model_validate": classmethod(model_validate), "__module__": model.__module__})
