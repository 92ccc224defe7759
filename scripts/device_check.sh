#!/usr/bin/env bash
# The prepared GPU check (issue 12): run once on the day a session is lent a GPU (one H200 with
# torch and transformers preinstalled, no internet; deepspeed, wandb and datasets absent).
#
#   bash scripts/device_check.sh [--out DIR]         # on the GPU machine: <= 8 minutes
#   bash scripts/device_check.sh --dry-run [--out DIR] # on CPU: the same steps at toy sizes (CI runs this)
#
# Steps (each under its own timeout; a failing step is recorded and the next one still runs):
#   install      pip install --no-deps -e .   (skipped when draftsmith already imports from here)
#   pytest_gpu   pytest -m gpu: flex/chunked TTT parity with eager, a bf16 step, the lossless CUDA loop
#   quickstart   train recipes/quickstart.yaml on the GPU (dry run: 2 steps on CPU)
#   train_scale  benchmarks/bench_train_scale.py, 8B shape, 2k and 8k tokens, today vs new (real memory)
#   eval_bound   benchmarks/bench_eval_bound.py on a ~1B random Llama in bf16 with the replay proposer
# Output: DIR/device_check.json (one JSON: per step status, seconds, and the benchmarks' rows),
# plus DIR/<step>.log. The dry run also blocks `import deepspeed / wandb / datasets` to prove the
# path stays free of them, as on the GPU machine.
set -uo pipefail

DRY=0
OUT=device_check_out
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --out) OUT="$2"; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "device_check.sh: unknown argument $1 (use --dry-run, --out DIR)" >&2; exit 2 ;;
  esac
  shift
done

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
STATUS="$OUT/steps.tsv"
: > "$STATUS"

if [ "$DRY" = 1 ]; then
  DEVICE=cpu
  BLOCK="$OUT/block_imports"
  mkdir -p "$BLOCK"
  cat > "$BLOCK/sitecustomize.py" <<'PY'
# device_check --dry-run: these packages are absent on the GPU machine; make them look absent here.
import importlib.util
import sys

_NAMES = ("deepspeed", "wandb", "datasets")
_find_spec = importlib.util.find_spec


def _absent(name):
    return name.split(".")[0] in _NAMES


def find_spec(name, package=None):  # availability checks (transformers, accelerate) see nothing
    return None if _absent(name) else _find_spec(name, package)


importlib.util.find_spec = find_spec


class _Block:
    def find_spec(self, name, path=None, target=None):
        if _absent(name):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by device_check --dry-run: absent on the GPU machine)")
        return None


sys.meta_path.insert(0, _Block())
PY
  export PYTHONPATH="$BLOCK:$PYTHONPATH"
else
  DEVICE=cuda
  if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "device_check.sh: no CUDA device visible to torch; run with --dry-run on CPU" >&2
    exit 2
  fi
fi

step() {  # step NAME TIMEOUT_S COMMAND...
  local name="$1" limit="$2"; shift 2
  local start end rc
  start=$(date +%s.%N)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(python -c "print(round($end - $start, 1))")" >> "$STATUS"
  echo "device_check: $name rc=$rc ($(tail -n 1 "$OUT/$name.log" | cut -c1-120))"
}

if [ "$DRY" = 1 ] || python -c "import draftsmith, sys; sys.exit(0 if draftsmith.__file__.startswith('$ROOT') else 1)" 2>/dev/null; then
  printf 'install\t0\t0\n' >> "$STATUS"
else
  step install 120 pip install --no-deps -e .
fi

if [ "$DRY" = 1 ]; then
  step pytest_gpu 300 python -m pytest -m gpu -q tests/gpu -p no:cacheprovider
  step quickstart 300 python -m draftsmith train recipes/quickstart.yaml train.max_steps=2 train.eval_every=0 \
    data.max_samples=40 data.eval_samples=4 target.device=cpu "train.output_dir=$OUT/quickstart" \
    logging.progress_bar=false
  step train_scale 300 python benchmarks/bench_train_scale.py --shape tiny --seq 32 64 --memory real \
    --paths today new --ttt-steps 2 --json "$OUT/train_scale.json"
  step eval_bound 300 python benchmarks/bench_eval_bound.py --layers 2 --hidden 64 --vocab 512 --prompts 2 \
    --prompt-len 8 --max-new-tokens 8 --k 2 --miss 0.0 --device cpu --json "$OUT/eval_bound.json"
else
  step pytest_gpu 120 python -m pytest -m gpu -q tests/gpu -p no:cacheprovider
  step quickstart 120 python -m draftsmith train recipes/quickstart.yaml target.device=cuda \
    "train.output_dir=$OUT/quickstart" logging.progress_bar=false
  step train_scale 150 python benchmarks/bench_train_scale.py --device cuda --shape 8b --seq 2048 8192 \
    --memory real --paths today new --json "$OUT/train_scale.json"
  step eval_bound 90 python benchmarks/bench_eval_bound.py --layers 16 --hidden 2048 --vocab 32000 --prompts 2 \
    --prompt-len 64 --max-new-tokens 64 --k 2 4 --miss 0.0 0.3 --device cuda --json "$OUT/eval_bound.json"
fi

python - "$OUT" "$DRY" "$DEVICE" <<'PY'
import json, sys
from pathlib import Path
out, dry, device = Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
steps = {}
for line in (out / "steps.tsv").read_text().splitlines():
    name, rc, seconds = line.split("\t")
    steps[name] = {"rc": int(rc), "ok": rc == "0", "seconds": float(seconds)}
result = {"dry_run": dry, "device": device, "steps": steps}
try:
    import torch
    result["torch"] = torch.__version__
    result["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
except Exception as exc:  # the JSON is still written
    result["torch_error"] = str(exc)
for name in ("train_scale", "eval_bound"):
    f = out / f"{name}.json"
    if f.exists():
        result[name] = json.loads(f.read_text())
q = out / "quickstart" / "metrics.jsonl"
if q.exists():
    lines = [json.loads(l) for l in q.read_text().splitlines() if l.strip()]
    result["quickstart_last"] = lines[-1] if lines else None
(out / "device_check.json").write_text(json.dumps(result, indent=1))
print(f"device_check: wrote {out / 'device_check.json'}; steps ok: {sum(s['ok'] for s in steps.values())}/{len(steps)}")
sys.exit(0 if all(s["ok"] for s in steps.values()) else 1)
PY
