"""Expected errors: bad input a user can fix (a bad path, value, mismatch, missing file, an
offline load without a cache). The `draftsmith` command prints them as one line naming the
file, key or value and the fix, and exits 2; `--debug` shows the traceback instead.

    raise UserError(f"{path}: no checkpoint here; pass a runs/NAME/final directory")
"""
from __future__ import annotations


class UserError(ValueError):
    """Bad input; the message names the file/key/value and the fix, in one line."""


class ConfigError(UserError):
    """All problems found in one recipe, one per line."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} problem(s) in the recipe:\n{lines}")


class UnknownNameError(KeyError):
    """A name that is not registered (a drafter kind, a workload, ...); the message suggests one."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ""


# What the top-level handler treats as expected: draftsmith's own user errors (UserError and its
# subclasses), files the system cannot read or write (OSError) and unknown names. Everything else,
# a ValueError from inside torch or a library included, is a bug and keeps its traceback.
EXPECTED = (UserError, OSError, UnknownNameError)


def one_line(exc: BaseException) -> str:
    """The error message on one line (a recipe's list of problems keeps one line per problem)."""
    text = str(exc)
    if isinstance(exc, ConfigError):
        return text
    return " ".join(part.strip() for part in text.splitlines() if part.strip()) or type(exc).__name__
