"""Argument types the tests declare tools with, shared by more than one test module."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Span:
    """A dataclass whose ``__post_init__`` refuses values: a conversion that raises."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        if self.lo > self.hi:
            raise ValueError("lo must be <= hi")
