"""TensorRT-LLM: EAGLE-3 for the PyTorch backend (layouts.py) and the doctor reader for trtllm-serve and
extra_llm_api_options.yaml (doctor.py); the targets it captures EAGLE-3 features for (targets.py)."""
from draftsmith.export.trtllm import layouts, targets  # noqa: F401  (register the layouts and table)
