"""`Problem`: one thing found wrong with a config, or worth a warning."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ("Problem",)


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """One thing wrong with a config: stable `code`, field `path`, and a `message` for people."""

    code: str
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{where}{self.message} [{self.code}]"
