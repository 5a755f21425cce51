"""Type aliases.

Arrays from different libraries share no common base class, so at runtime an
array is just ``Any``; the aliases document intent in signatures.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, TypeAlias

__all__ = ["Array", "DType", "Device", "Namespace"]

Array: TypeAlias = Any
DType: TypeAlias = Any
Device: TypeAlias = Any
Namespace: TypeAlias = ModuleType
