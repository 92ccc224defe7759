"""Drafter kinds: one file each, registered in DRAFTERS under their recipe name."""
from draftsmith.registry import Registry

DRAFTERS: Registry = Registry("drafter kind")

from draftsmith.heads import eagle3  # noqa: E402,F401  (registers "eagle3")
from draftsmith.heads import medusa  # noqa: E402,F401  (registers "medusa")
from draftsmith.heads import mlp_speculator  # noqa: E402,F401  (registers "mlp_speculator")
from draftsmith.heads import eagle1  # noqa: E402,F401  (registers "eagle1")
from draftsmith.heads import draft_lm  # noqa: E402,F401  (registers "draft_lm")
