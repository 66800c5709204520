"""Where Headrace keeps its state: under the `home` setting unless a setting of its own names the
place (shared/settings.py). Derived on every read, never stored, so changing `home` moves them all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, overload


class UnderHome:
    """A Settings attribute that reads as the directory `setting` names, or `home / name` when
    `setting` is None or unset; `setting` None: always under home."""

    def __init__(self, setting: str | None, name: str):
        self.setting, self.name = setting, name

    @overload
    def __get__(self, settings: None, owner: type | None = None) -> UnderHome: ...

    @overload
    def __get__(self, settings: Any, owner: type | None = None) -> Path: ...

    def __get__(self, settings: Any, owner: type | None = None) -> Path | UnderHome:
        if settings is None:  # read on the class
            return self
        own = getattr(settings, self.setting) if self.setting else None
        return own or settings.home / self.name
