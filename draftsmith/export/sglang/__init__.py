"""SGLang: EAGLE-3 (layouts.py), the block drafters (block.py), EAGLE-1 (eagle1.py), the doctor reader for
`python -m sglang.launch_server` (doctor.py) and the kinds it serves per hybrid / vision-language target
(targets.py)."""
from draftsmith.export.sglang import block, eagle1, layouts, targets  # noqa: F401  (register the layouts and table)
