#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU only) from the llama.cpp that the pinned PyPI sdist
# `llama-cpp-python==0.3.36` vendors (vendor/llama.cpp, as of 2026-10-01), plus the converter
# `convert_hf_to_gguf.py` and the Python packages it needs (pyproject's `llamacpp` extra), into a cache
# outside the repo:
#   bash scripts/install_llama_cpp.sh            # prints the llama-server path as its LAST line
#   LLAMA_CPP_JOBS=4 bash scripts/install_llama_cpp.sh
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/draftsmith/llama.cpp-0.3.36 (DRAFTSMITH_LLAMA_CPP_DIR
# overrides it). A second run finds the built binary and returns at once.
# draftsmith finds the result there by itself (draftsmith/export/llamacpp/tools.py), or through
# DRAFTSMITH_LLAMA_SERVER / DRAFTSMITH_LLAMA_CPP_DIR.
#
# The download fetches the sdist alone: `--only-binary :all: --no-binary llama-cpp-python` lets pip
# take the sdist's build dependencies (scikit-build-core, for its metadata step) only as wheels; the
# former `--no-binary :all:` built them from source too (issue 34: 1,495 s on a fresh shared machine).
# (`--no-build-isolation` does not skip the metadata step: it fails where scikit-build-core is absent.)
# Only the `llama-server`, `llama-quantize` and `llama-bench` targets are built (their libraries: ggml,
# llama, common, mtmd); no tests, examples or other tools. llama-quantize writes the Q4_0 drafts of
# `export --to llama.cpp --gguf-type q4_0`; llama-bench times the verification widths of
# benchmarks/bench_verify_bounds.py. On a cache whose server was built first the two are built alone
# (measured for llama-quantize: one source file and a link, about 4 s of CPU).
#
# Measured on this project's kind of machine (2 cores, -j2, the cores shared with other work):
# sdist download 8.6 s (76.6 MB, pip's cache off; the former command 7.2 s here, where its build
# dependencies happened to build quickly), unpack + pip installs 7 s, configure + build of
# llama-server 1,286 s (21 min; BUILD_SECONDS in the cache's build.log), about 1,300 s in all;
# a second run 0.05 s.
set -euo pipefail

VERSION="0.3.36"
GGUF_VERSION="${GGUF_VERSION:-0.19.0}"   # must match vendor/llama.cpp/gguf-py/pyproject.toml (checked)
CACHE="${DRAFTSMITH_LLAMA_CPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/draftsmith/llama.cpp-${VERSION}}"
JOBS="${LLAMA_CPP_JOBS:-2}"
SERVER="$CACHE/build/bin/llama-server"
QUANTIZE="$CACHE/build/bin/llama-quantize"   # `draftsmith export --to llama.cpp --gguf-type q4_0`
BENCH="$CACHE/build/bin/llama-bench"         # benchmarks/bench_verify_bounds.py
PYTHON="${PYTHON:-python3}"

log() { echo "[install_llama_cpp] $*" >&2; }

if [ -x "$SERVER" ] && [ -f "$CACHE/src/convert_hf_to_gguf.py" ] && [ -f "$CACHE/.done" ]; then
  if [ ! -x "$QUANTIZE" ] || [ ! -x "$BENCH" ]; then   # a cache built before these tools were added
    log "building llama-quantize and llama-bench in $CACHE/build (the server is already built)"
    cmake --build "$CACHE/build" --target llama-quantize llama-bench -j"$JOBS" >> "$CACHE/build.log" 2>&1 \
      || { tail -30 "$CACHE/build.log" >&2; exit 1; }
  fi
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
  t_dl=$(date +%s)
  "$PYTHON" -m pip download --quiet --no-deps --only-binary :all: --no-binary llama-cpp-python \
    "llama-cpp-python==$VERSION" -d "$tmp"
  log "downloaded in $(($(date +%s) - t_dl)) s"
  tar -xzf "$tmp/llama_cpp_python-$VERSION.tar.gz" -C "$tmp"
  rm -rf "$CACHE/src"
  mv "$tmp/llama_cpp_python-$VERSION/vendor/llama.cpp" "$CACHE/src"
  rm -rf "$tmp"
fi

# 2. the converter's Python packages (pyproject.toml's `llamacpp` extra, the same pins: a test checks);
#    gguf pinned to what the vendored gguf-py says it is
vendored="$(sed -n 's/^version = "\(.*\)"/\1/p' "$CACHE/src/gguf-py/pyproject.toml" | head -1)"
if [ "$vendored" != "$GGUF_VERSION" ]; then
  log "vendor/llama.cpp/gguf-py is version $vendored, this script pins $GGUF_VERSION: update GGUF_VERSION"
  exit 1
fi
"$PYTHON" -m pip install --quiet "gguf==$GGUF_VERSION" "sentencepiece==0.2.1" "protobuf>=4.21"

# 3. configure + build, CPU only (no curl: nothing is downloaded at run time; no GPU backends)
log "building llama-server with -j$JOBS (about 21 minutes on 2 cores)"
t0=$(date +%s)
cmake -S "$CACHE/src" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF \
  > "$CACHE/build.log" 2>&1 || { tail -30 "$CACHE/build.log" >&2; exit 1; }
cmake --build "$CACHE/build" --target llama-server llama-quantize llama-bench -j"$JOBS" >> "$CACHE/build.log" 2>&1 \
  || { tail -30 "$CACHE/build.log" >&2; exit 1; }
t1=$(date +%s)
echo "BUILD_SECONDS $((t1 - t0)) (jobs $JOBS, total with download $((t1 - start)))" >> "$CACHE/build.log"
log "built in $((t1 - t0)) s"

"$SERVER" --version >/dev/null 2>&1 || { log "$SERVER does not run"; exit 1; }
touch "$CACHE/.done"
echo "$SERVER"
