"""Drafter kinds: one file each, registered in DRAFTERS under their recipe name."""
from draftsmith.registry import Registry

DRAFTERS: Registry = Registry("drafter kind")

from draftsmith.heads import eagle3  # noqa: E402,F401  (registers "eagle3")
