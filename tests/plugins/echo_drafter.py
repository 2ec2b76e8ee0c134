"""An example plugin (METASD_PLUGINS=tests.plugins.echo_drafter): a drafter that proposes the last token again.

It is deliberately simple; what it shows is the whole contract of a bring-your-own drafter.
"""

from __future__ import annotations

import torch

from metasd import Draft, Drafter, register_drafter


class EchoLast(Drafter):
    """Proposes k copies of the context's last token: right in runs like "1 1 1" or "....", wrong elsewhere."""

    model_free = True

    def reset(self, prompt_ids: list[int]) -> None:
        pass  # no per-request state

    def propose(self, ids, k, s, generator):
        return Draft([ids[-1]] * k if ids else [], None)

    def predict(self, ids, start, n, s):
        return torch.tensor([ids[j - 1] for j in range(start, start + n)])


register_drafter("echo-last", lambda bundle: EchoLast("echo-last"), kind="model-free",
                 description="repeats the context's last token (an example plugin)")
