"""One small Registry class; one registry per axis (drafters, workloads, exporters, ...)."""
from __future__ import annotations

import difflib
from typing import Callable, Generic, TypeVar

from draftsmith.core.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps a name to an object (a class or a function) registered with a decorator."""

    def __init__(self, axis: str):
        self.axis = axis
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.axis} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return add

    def unregister(self, name: str) -> None:
        """Remove `name` (a registration made for one test or one session); unknown names are ignored."""
        self._items.pop(name, None)

    def get(self, name: str) -> T:
        if name not in self._items:
            hint = difflib.get_close_matches(name, self._items, n=2)  # 'eagle': both 'peagle' and 'eagle3' fit
            tip = f" (did you mean {' or '.join(repr(h) for h in hint)}?)" if hint else ""
            raise UnknownNameError(f"unknown {self.axis} {name!r}{tip}; known: {', '.join(sorted(self._items))}")
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items
