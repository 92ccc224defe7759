#!/usr/bin/env bash
# Fetch vLLM's own config code for tests/export/test_vllm_config_code.py, which runs it on every
# speculators-format export (vLLM's SpeculatorsConfig imports on CPU without vLLM's compiled kernels):
#   bash scripts/fetch_vllm_config_code.sh [VERSION ...]        # default: 0.33.0 (the newest)
#   bash scripts/fetch_vllm_config_code.sh 0.20.0 0.27.0 0.33.0
# For each version it downloads the vLLM wheel with `pip download --no-deps` (measured: 0.33.0 is 336 MB,
# 0.27.0 313 MB, 0.20.0 244 MB; 30 s for all three from this machine's mirror), keeps only the pure-Python files the config path imports (4 / 8 / 11 MB for 0.20 / 0.27 / 0.33) in
# ${DRAFTSMITH_VLLM_CONFIG_CODE:-~/.cache/draftsmith/vllm-config-code}/VERSION, and deletes the wheel.
# Idempotent. .ci/run runs it for all three versions (the download is deleted; ~25 MB stay), and a failure
# there only makes the tests skip.
set -euo pipefail
root="${DRAFTSMITH_VLLM_CONFIG_CODE:-$HOME/.cache/draftsmith/vllm-config-code}"
[ "$#" -gt 0 ] || set -- 0.33.0
for version in "$@"; do
  dest="$root/$version"
  if [ -f "$dest/vllm/transformers_utils/configs/speculators/base.py" ] \
     && [ -f "$dest/vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py" ]; then
    echo "$dest"; continue
  fi
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python -m pip download --quiet --no-deps --dest "$tmp" "vllm==$version"
  mkdir -p "$dest.partial"
  # vllm/*.py (version, envs, logger, env_override) and the packages the config path imports; config/speculative.py
  python - "$tmp"/vllm-"$version"-*.whl "$dest.partial" <<'EOF'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
# 0.27's env_override also imports vllm.platforms (platform detection) and, through it, parts of vllm.v1.attention
keep = ("vllm/logging_utils/", "vllm/utils/", "vllm/transformers_utils/", "vllm/platforms/", "vllm/plugins/",
        "vllm/third_party/", "vllm/v1/attention/")
with zipfile.ZipFile(wheel) as z:
    # the hidden-states writer and its layer stacking: tests/data/test_vllm_hidden_states.py reads the format from them
    hidden = ("vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py",
              "vllm/v1/spec_decode/extract_hidden_states.py")
    names = [n for n in z.namelist() if n.endswith(".py") and (n.count("/") == 1 or n.startswith(keep)
             or n == "vllm/config/speculative.py" or (n.startswith("vllm/v1/") and n.count("/") == 2)
             or n in hidden)]
    z.extractall(out, names)
print(f"kept {len(names)} files of {wheel}", file=sys.stderr)
EOF
  rm -rf "$dest" && mv "$dest.partial" "$dest"
  rm -rf "$tmp"
  trap - EXIT
  echo "$dest"
done
