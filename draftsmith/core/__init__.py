"""Leaf utilities: errors, bounded file I/O, registries, safe YAML, sampling."""
