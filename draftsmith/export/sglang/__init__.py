"""SGLang: EAGLE-3 (layouts.py), the block drafters (block.py), EAGLE-1 (eagle1.py) and the doctor reader for
`python -m sglang.launch_server` (doctor.py)."""
from draftsmith.export.sglang import block, eagle1, layouts  # noqa: F401  (register the layouts)
