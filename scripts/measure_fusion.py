"""What the fused layers save (metasd/models/cpu_linear.py, fuse_layers): one verification pass of the offline
target with its MLPs' gate and up projections as one product, its attention's query, key and value projections as
one product and its RMSNorms as one op, each kind alone and together, against the same model computing them
unfused. The same loaded model is switched between the modes (no second copy in memory, so
memory placement cannot tilt the comparison), the modes interleaved, the median of --repeats kept; the logits of
every mode are checked bitwise against the unfused ones first.

    .venv/bin/python scripts/measure_fusion.py               # 1 thread, 1 and 4 ids on a 200-token context
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # measure_verify's one timed pass

from measure_verify import forward_ms  # noqa: E402

from metasd.decoding.loading import load_causal_lm, offline_target_dir  # noqa: E402
from metasd.models import cpu_linear  # noqa: E402

# A mode names the kinds of fused module that compute fused in it ("all": every kind).
KINDS = {cpu_linear._rms_forward: "norms", cpu_linear._mlp_forward: "mlp", cpu_linear._attention_forward: "attention"}
MODES = ("unfused", "norms", "mlp", "attention", "mlp+norms", "all")


def switch(fused: dict, mode: str) -> None:
    """Put back or take away each fused module's forward (its instance attribute) for `mode`."""
    for module, forward in fused.items():
        if mode == "all" or KINDS[forward.__func__] in mode.split("+"):
            module.__dict__["forward"] = forward
        else:
            module.__dict__.pop("forward", None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--ids", default="1,4", help="ids fed per pass, comma-separated")
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = load_causal_lm(str(offline_target_dir(progress=print)), torch.device("cpu"), torch.float32)
    fused = {m: m.__dict__["forward"] for m in model.modules() if "forward" in m.__dict__}
    if not fused:
        sys.exit("nothing is fused here (no packed layers, or no probe gave the unfused bits)")
    ks = [int(k) for k in a.ids.split(",")]
    ids = torch.randint(100, 40000, (1, a.context + max(ks)), generator=torch.Generator().manual_seed(1))
    for k in ks:
        switch(fused, "unfused")
        want = forward_ms(model, ids, a.context, k)[1]
        for mode in MODES[1:]:
            switch(fused, mode)
            assert torch.equal(forward_ms(model, ids, a.context, k)[1], want), f"{mode}, {k} ids: other logits"
    times: dict[tuple[str, int], list[float]] = {}
    for _ in tqdm(range(a.repeats), desc="passes", unit="round"):
        for k in ks:
            for mode in MODES:
                switch(fused, mode)
                times.setdefault((mode, k), []).append(forward_ms(model, ids, a.context, k)[0])
    switch(fused, "all")
    counts = {kind: sum(KINDS[f.__func__] == kind for f in fused.values()) for kind in KINDS.values()}
    print(", ".join(f"{n} {kind}" for kind, n in counts.items()) + " fused; logits bitwise equal")
    print("| ids | " + " | ".join(f"{m} (ms)" for m in MODES) + " | all / unfused |")
    print("|---:|" + "---:|" * (len(MODES) + 1))
    for k in ks:
        ms = [statistics.median(times[(m, k)]) for m in MODES]
        print(f"| {k} | " + " | ".join(f"{x:.1f}" for x in ms) + f" | {ms[-1] / ms[0]:.3f} |")


if __name__ == "__main__":
    main()
