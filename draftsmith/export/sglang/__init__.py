"""SGLang: EAGLE-3 (layouts.py), the block drafters (block.py), EAGLE-1 (eagle1.py) and the doctor reader for
`python -m sglang.launch_server` (doctor.py); which kinds it serves per hybrid / vision-language target (targets.py)."""
from draftsmith.export.sglang import block, eagle1, layouts, targets  # noqa: F401  (register the layouts, the target table)
