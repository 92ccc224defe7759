"""Drafter kinds: one file each, registered in DRAFTERS under their recipe name.

Importing a kind's module registers it, so the imports below must follow DRAFTERS."""
from draftsmith.registry import Registry

DRAFTERS: Registry = Registry("drafter kind")

# Each import registers one kind: "draft_lm", "eagle1", "eagle3", "medusa", "mlp_speculator", "dflash",
# "dspark", "peagle".
from draftsmith.heads import dflash, draft_lm, dspark, eagle1, eagle3, medusa, mlp_speculator, peagle  # noqa: E402,F401
