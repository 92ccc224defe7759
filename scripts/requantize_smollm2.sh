#!/usr/bin/env bash
# Requantize the installed SmolLM2-135M-Instruct GGUF (Q4_1, as scripts/install_smollm2.sh installs it) to another
# llama.cpp type with llama.cpp's own llama-quantize, and print the new .gguf file's path as the LAST line.
#
#   bash scripts/requantize_smollm2.sh                 # Q4_0 beside the installed Q4_1 file (default)
#   bash scripts/requantize_smollm2.sh Q8_0 DIR        # Q8_0, written into DIR
#
# Why: on this project's CPUs a Q4_0 SmolLM2 decodes faster than the shipped Q4_1 (issue 41 measured 9.2 against
# 12.0 ms a token with `llama-bench -d 200 -t 2`), which raises the bound of any drafter served beside it.
# Requantizing from Q4_1 (`--allow-requantize`) loses a little more than quantizing from the original weights would;
# the original float weights are not installed here (nothing downloads from a hub).
#
# What it does (idempotent: the output is kept once written): installs the target and llama.cpp with the project's
# scripts, writes DIR (default: the installed model's folder, $DRAFTSMITH_MODELS or ~/.cache/draftsmith/models)
# /SmolLM2-135M-Instruct.<TYPE>.gguf through a temporary file in the same folder and renames it into place, so an
# interrupted run leaves no half-written model. Measured: under 1 s of CPU once both installs are there.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
TYPE="${1:-Q4_0}"
case "$TYPE" in
  Q4_0|Q4_1|Q5_0|Q5_1|Q8_0) ;;
  *) echo "requantize_smollm2.sh: type '$TYPE' is not one of Q4_0 Q4_1 Q5_0 Q5_1 Q8_0" >&2; exit 2 ;;
esac
SOURCE="$(bash "$REPO/scripts/install_smollm2.sh" | tail -1)"
SERVER="$(bash "$REPO/scripts/install_llama_cpp.sh" | tail -1)"
QUANTIZE="$(dirname "$SERVER")/llama-quantize"
[ -x "$QUANTIZE" ] || { echo "requantize_smollm2.sh: $QUANTIZE not found (scripts/install_llama_cpp.sh builds it)" >&2; exit 1; }
DIR="${2:-$(dirname "$SOURCE")}"
[ -d "$DIR" ] || { echo "requantize_smollm2.sh: output folder '$DIR' does not exist" >&2; exit 2; }
OUT="$DIR/SmolLM2-135M-Instruct.$TYPE.gguf"
if [ "$TYPE" = "Q4_1" ]; then
  echo "$SOURCE"
  exit 0
fi
if [ ! -s "$OUT" ]; then
  TMP="$OUT.tmp.$$"
  trap 'rm -f "$TMP"' EXIT
  echo "requantizing $SOURCE -> $OUT" >&2
  "$QUANTIZE" --allow-requantize "$SOURCE" "$TMP" "$TYPE" 1 >&2
  mv "$TMP" "$OUT"
  trap - EXIT
fi
echo "$OUT"
