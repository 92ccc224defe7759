#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU only) from the llama.cpp that the pinned PyPI sdist
# `llama-cpp-python==0.3.36` vendors (vendor/llama.cpp, as of 2026-10-01), plus the converter
# `convert_hf_to_gguf.py` and the pinned `gguf` package it needs, into a cache outside the repo:
#   bash scripts/install_llama_cpp.sh            # prints the llama-server path as its LAST line
#   LLAMA_CPP_JOBS=4 bash scripts/install_llama_cpp.sh
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/draftsmith/llama.cpp-0.3.36 (DRAFTSMITH_LLAMA_CPP_DIR
# overrides it). A second run finds the built binary and returns at once.
# draftsmith finds the result there by itself (draftsmith/export/llamacpp_tools.py), or through
# DRAFTSMITH_LLAMA_SERVER / DRAFTSMITH_LLAMA_CPP_DIR.
#
# Measured on this project's kind of machine (2 cores, -j2, the cores shared with one training run):
# sdist download + unpack + pip installs 7 s, configure + build of llama-server 1,257 s (21 min;
# BUILD_SECONDS in the cache's build.log), 1,264 s in all; a second run 0.05 s.
set -euo pipefail

VERSION="0.3.36"
GGUF_VERSION="${GGUF_VERSION:-0.19.0}"   # must match vendor/llama.cpp/gguf-py/pyproject.toml (checked)
CACHE="${DRAFTSMITH_LLAMA_CPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/draftsmith/llama.cpp-${VERSION}}"
JOBS="${LLAMA_CPP_JOBS:-2}"
SERVER="$CACHE/build/bin/llama-server"
PYTHON="${PYTHON:-python3}"

log() { echo "[install_llama_cpp] $*" >&2; }

if [ -x "$SERVER" ] && [ -f "$CACHE/src/convert_hf_to_gguf.py" ] && [ -f "$CACHE/.done" ]; then
  log "already built in $CACHE"
  echo "$SERVER"
  exit 0
fi

mkdir -p "$CACHE"
start=$(date +%s)

# 1. the pinned sdist, never a wheel (a wheel has no vendor/llama.cpp)
if [ ! -f "$CACHE/src/CMakeLists.txt" ]; then
  tmp="$(mktemp -d "$CACHE/dl.XXXXXX")"
  log "downloading llama-cpp-python==$VERSION (sdist)"
  "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$tmp"
  tar -xzf "$tmp/llama_cpp_python-$VERSION.tar.gz" -C "$tmp"
  rm -rf "$CACHE/src"
  mv "$tmp/llama_cpp_python-$VERSION/vendor/llama.cpp" "$CACHE/src"
  rm -rf "$tmp"
fi

# 2. the converter's own gguf package: pin what the vendored gguf-py says it is
vendored="$(sed -n 's/^version = "\(.*\)"/\1/p' "$CACHE/src/gguf-py/pyproject.toml" | head -1)"
if [ "$vendored" != "$GGUF_VERSION" ]; then
  log "vendor/llama.cpp/gguf-py is version $vendored, this script pins $GGUF_VERSION: update GGUF_VERSION"
  exit 1
fi
"$PYTHON" -m pip install --quiet "gguf==$GGUF_VERSION" "sentencepiece==0.2.1"

# 3. configure + build, CPU only (no curl: nothing is downloaded at run time; no GPU backends)
log "building llama-server with -j$JOBS (about 21 minutes on 2 cores)"
t0=$(date +%s)
cmake -S "$CACHE/src" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF \
  > "$CACHE/build.log" 2>&1 || { tail -30 "$CACHE/build.log" >&2; exit 1; }
cmake --build "$CACHE/build" --target llama-server -j"$JOBS" >> "$CACHE/build.log" 2>&1 \
  || { tail -30 "$CACHE/build.log" >&2; exit 1; }
t1=$(date +%s)
echo "BUILD_SECONDS $((t1 - t0)) (jobs $JOBS, total with download $((t1 - start)))" >> "$CACHE/build.log"
log "built in $((t1 - t0)) s"

"$SERVER" --version >/dev/null 2>&1 || { log "$SERVER does not run"; exit 1; }
touch "$CACHE/.done"
echo "$SERVER"
