"""vLLM: EAGLE-3, Medusa and the MLP speculator (layouts.py), the block drafters and P-EAGLE (parallel.py), EAGLE-1
(eagle1.py), Medusa's draft vocabulary (medusa_vocab.py), the doctor reader for `vllm serve` (doctor.py) and the
kinds it serves per hybrid / vision-language target, by release (targets.py)."""
from draftsmith.export.vllm import eagle1, layouts, parallel, targets  # noqa: F401  (register the layouts and table)
