#!/usr/bin/env bash
# The benchmark on one GPU with a hub preset, then a class of users at once, within TOTAL_LIMIT (560 s; docs/DESIGN.md §6:
# GPU figures come only from a GPU run). CPU CI never runs this.
#
#   scripts/gpu_bench.sh                       # qwen2.5-1.5b, 6 categories x 1 prompt, 128 tokens
#   PRESET=qwen2.5-7b scripts/gpu_bench.sh     # the larger preset (~24 GB)
#   scripts/gpu_bench.sh --dry-run             # the same commands on the CPU against tiny stand-ins (CI)
#
# Settings (environment): PRESET, DEVICE (cuda), PROMPTS (Spec-Bench question.jsonl), CATEGORIES,
# PER_CATEGORY, MAX_NEW_TOKENS, METHODS, OUT_DIR, TIME_LIMIT (seconds, the benchmark), RUN_EXAMPLES (the
# examples recorded as replays), LOAD_USERS (class sizes of the concurrent-users run, "1 8 32"),
# TOTAL_LIMIT (seconds, the whole script: the class run gets what is left, 560), PYTHON;
# METASD_DRY_RUN=1 is the same as --dry-run.
# The models come from the Hugging Face hub: on a machine without network they must already be
# in the hub cache (then set HF_HUB_OFFLINE=1). Results go to OUT_DIR, and also to $OUT when the
# device runner sets it (so they come back from the GPU machine).
#
# --dry-run writes 2-layer stand-ins with the preset's repository ids into a temporary hub cache
# (tests/hub_standins.py), sets HF_HUB_OFFLINE=1, and runs every command below on the CPU with tiny
# settings, so the script cannot rot before a GPU runs it. Its figures mean nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=${METASD_DRY_RUN:-0}
args_in=()
for a in "$@"; do
  if [[ $a == --dry-run ]]; then DRY_RUN=1; else args_in+=("$a"); fi
done
set -- "${args_in[@]+"${args_in[@]}"}"

PRESET=${PRESET:-qwen2.5-1.5b}
if [[ $DRY_RUN == 1 ]]; then
  DEVICE=${DEVICE:-cpu}
  MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-8}
  TIME_LIMIT=${TIME_LIMIT:-240}
  OUT_DIR=${OUT_DIR:-bench-out/dry-$PRESET}
  RUN_EXAMPLES=${RUN_EXAMPLES:-ex-rag-1}
  CATEGORIES=${CATEGORIES:-qa,coding}  # every method on two prompts: enough to keep the commands working
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # tiny models: one thread is the fastest
fi
DEVICE=${DEVICE:-cuda}
CATEGORIES=${CATEGORIES:-translation,summarization,qa,math_reasoning,rag,coding}
PER_CATEGORY=${PER_CATEGORY:-1}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-128}
TIME_LIMIT=${TIME_LIMIT:-240}
OUT_DIR=${OUT_DIR:-bench-out/gpu-$PRESET}
RUN_EXAMPLES=${RUN_EXAMPLES:-ex-rag-1 ex-code-1 ex-math-1}

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

if [[ -z "${PROMPTS:-}" ]]; then
  for p in shared/specbench/question.jsonl ../shared/specbench/question.jsonl /work/shared/specbench/question.jsonl; do
    if [[ -f $p ]]; then PROMPTS=$p; break; fi
  done
fi
if [[ $DRY_RUN == 1 ]]; then
  STANDINS=$(mktemp -d "${TMPDIR:-/tmp}/metasd-standins.XXXXXX")
  trap 'rm -rf "$STANDINS"' EXIT
  if [[ -z "${PROMPTS:-}" ]]; then  # no Spec-Bench here: the page's examples, in its format
    PROMPTS=$STANDINS/examples.jsonl
    "$PYTHON" -c "import json,sys; [print(json.dumps(e)) for e in json.load(open('assets/examples.json'))]" > "$PROMPTS"
    CATEGORIES=$("$PYTHON" -c "import json; print(','.join(list(dict.fromkeys(e['category'] for e in json.load(open('assets/examples.json'))))[:2]))")
  fi
  echo "gpu_bench: dry run: stand-ins for $PRESET in $STANDINS/hub" >&2
  PYTHONPATH=. TOKENIZERS_PARALLELISM=false "$PYTHON" -m tests.hub_standins "$STANDINS/hub"
  export HF_HUB_CACHE=$STANDINS/hub HF_HOME=$STANDINS/hf-home HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
fi
if [[ -z "${PROMPTS:-}" || ! -f $PROMPTS ]]; then
  echo "gpu_bench: no Spec-Bench question.jsonl found; set PROMPTS=/path/to/question.jsonl" >&2
  exit 2
fi

if [[ -z "${METHODS:-}" ]]; then
  case $PRESET in
    qwen2.5-1.5b)
      METHODS=baseline,hf-pld,hf-assisted:qwen-0.5b,single:qwen-0.5b,single:coder-0.5b,single:prompt-lookup,single:token-recycling,metasd-ucb,metasd-ucb/throughput,hedge,metasd-tree,oracle ;;
    qwen2.5-7b)
      # No hf-assisted here: the 7B's embedding table has 128 more rows than its drafters', and transformers'
      # assisted generation then demands two tokenizers (universal assisted decoding, a different algorithm).
      METHODS=baseline,hf-pld,single:qwen-0.5b,single:coder-0.5b,single:math-1.5b,single:prompt-lookup,single:token-recycling,metasd-ucb,metasd-ucb/throughput,metasd-tree,oracle ;;
    *)
      METHODS="" ;;  # the benchmark's default set for the preset
  esac
fi

if [[ $DEVICE == cuda* ]]; then
  PYTHONPATH=. "$PYTHON" - <<'EOF' || { echo "gpu_bench: this Python's torch sees no CUDA GPU (install a CUDA build of torch)" >&2; exit 3; }
import sys, torch
if not torch.cuda.is_available():
    sys.exit(1)
print(f"gpu_bench: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", file=sys.stderr)
EOF
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv >&2 || true
fi

mkdir -p "$OUT_DIR"
save_out() {  # results also go to $OUT where the device runner sets it (so they come back from the GPU machine)
  if [[ $DRY_RUN != 1 && -n "${OUT:-}" && -d "${OUT:-}" ]]; then
    cp -r "$OUT_DIR" "$OUT/" 2>/dev/null || true
  fi
}
echo "gpu_bench: preset $PRESET on $DEVICE, $CATEGORIES x $PER_CATEGORY, $MAX_NEW_TOKENS tokens -> $OUT_DIR" >&2
start=$(date +%s)
args=(bench --prompts "$PROMPTS" --categories "$CATEGORIES" --per-category "$PER_CATEGORY"
      --max-new-tokens "$MAX_NEW_TOKENS" --preset "$PRESET" --device "$DEVICE" --out "$OUT_DIR")
[[ -n $METHODS ]] && args+=(--methods "$METHODS")
rc=0
# The benchmark checkpoints results.csv and summary.md after every prompt, so a run cut short by
# the time limit still leaves what it measured.
PYTHONPATH=. TOKENIZERS_PARALLELISM=false timeout --signal=INT "$TIME_LIMIT" "$PYTHON" -m metasd "${args[@]}" "$@" \
  2> >(tee "$OUT_DIR/stderr.log" >&2) || rc=$?
echo "gpu_bench: finished with exit status $rc in $(( $(date +%s) - start )) s" >&2
save_out
# Replays for the gallery (the Replay tab, `?run=gpu-<preset>-<name>`): a few examples as run files, so a
# CPU-only Space can show what the GPU preset does. Copy them into assets/runs/ to publish them.
mkdir -p "$OUT_DIR/runs"
for qid in $RUN_EXAMPLES; do
  prompt=$(PYTHONPATH=. "$PYTHON" -c "import json,sys; print(next(e['turns'][0] for e in json.load(open('assets/examples.json')) if e['question_id']==sys.argv[1]))" "$qid")
  PYTHONPATH=. TOKENIZERS_PARALLELISM=false "$PYTHON" -m metasd generate "$prompt" --preset "$PRESET" --device "$DEVICE" \
    --max-new-tokens "$MAX_NEW_TOKENS" --json > "$OUT_DIR/runs/gpu-$PRESET-$qid.json" || rc=$?
done
# A class at once (docs/DESIGN.md §7): gradio_client users pressing Run together against the app started as a
# Space on this GPU (shared rounds in blocks of rows), each answer checked against its solo run. The dry run
# cannot serve a GPU preset (a CPU's page offers only the offline one): it runs the same users on the shared
# rounds without the web server (--engine-only), on the stand-ins.
if [[ $DRY_RUN == 1 ]]; then
  load=(--engine-only --device "$DEVICE" --users 1 3 --max-new-tokens 4 --prompts 3)
else
  load=(--users ${LOAD_USERS:-1 8 32} --max-new-tokens 64 --timeout 120)  # the server gets METASD_BATCH=1
fi
save_out  # what is measured so far comes back even if the class run is cut off
left=$(( start + ${TOTAL_LIMIT:-560} - $(date +%s) ))  # the device runner ends a command after 600 s
if (( left < 90 )); then
  echo "gpu_bench: no time left for the class run ($left s); raise TOTAL_LIMIT or lower TIME_LIMIT" >&2
else
  echo "gpu_bench: a class at once -> $OUT_DIR/load_users.md (at most $left s)" >&2
  PYTHONPATH=. TOKENIZERS_PARALLELISM=false timeout --signal=INT "$left" "$PYTHON" scripts/load_users.py \
    --preset "$PRESET" "${load[@]}" > "$OUT_DIR/load_users.md" || rc=$?
  cat "$OUT_DIR/load_users.md" >&2
fi
save_out
exit $rc
