"""llama.cpp: GGUF drafts (layouts.py: EAGLE-3 and the draft LM; block.py: DFlash, DFlash 2, DSpark), the converter
(convert.py), the draft vocabulary (vocab.py), the built engine (tools.py) and the doctor reader for llama-server
(doctor.py)."""
from draftsmith.export.llamacpp import block, layouts  # noqa: F401  (register the layouts)
