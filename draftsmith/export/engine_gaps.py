"""Why a format takes no drafter of a kind, when there is more to say than "no layout": an engine that serves
the kind in a format draftsmith does not write yet (naming where that format is defined), or an engine that
has no such drafter at all. Each format's own file registers its lines, keyed by (format, kind):

    REFUSED.register("trtllm", KIND, "TensorRT-LLM's ... export it with {fits}", whole=True)

export/support.can_export (and with it `draftsmith export`, inspect, ls and the matrix) asks here through
common.not_taken. `{fits}` in a line becomes the formats that do take the kind ("--to a or --to b")."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gap:
    why: str  # one line; may hold {fits}
    whole: bool = False  # True: `why` is the whole message; False: it follows "--to FMT does not take KIND drafters: "


class Refusals:
    """(format, kind) -> the one-line reason that format refuses every drafter of that kind."""

    def __init__(self):
        self._gaps: dict[tuple[str, str], Gap] = {}

    def register(self, fmt: str, kind: str, why: str, whole: bool = False) -> None:
        if (fmt, kind) in self._gaps:
            raise ValueError(f"the refusal of {kind} drafters by --to {fmt} is registered twice")
        self._gaps[(fmt, kind)] = Gap(why, whole)

    def unregister(self, fmt: str, kind: str) -> None:
        self._gaps.pop((fmt, kind), None)

    def reason(self, fmt: str, kind: str, fits: list[str]) -> str | None:
        """The message `--to fmt` refuses `kind` with (fits: the formats that take it), or None."""
        gap = self._gaps.get((fmt, kind))
        if gap is None:
            return None
        why = gap.why.replace("{fits}", " or ".join(f"--to {f}" for f in fits) or "no other format")
        return why if gap.whole else f"--to {fmt} does not take {kind} drafters: {why}"


REFUSED = Refusals()
