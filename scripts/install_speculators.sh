#!/usr/bin/env bash
# Install speculators 0.9.0 (vLLM's speculators-format loader) for the export tests, WITHOUT its
# torchvision/torchaudio requirements (they pull a CUDA torch; nothing speculators imports needs them).
#   bash scripts/install_speculators.sh
# Then tests/export/test_speculators_load.py loads the vLLM export with SpeculatorModel.from_pretrained.
set -euo pipefail
python -m pip install --no-deps "speculators==0.9.0" "hs-connectors==0.9.0"
# Its real, torch-free requirements that `import speculators` needs (the rest are already in the stack).
python -m pip install "loguru>=0.7.2,<=0.7.3" "openai>=2.0.0" aiohttp
python -c "import speculators; print('speculators', speculators.__name__, 'importable')"
