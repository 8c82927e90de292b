"""Packed rows of whole documents in the Megatron order (``packing="best-fit"``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import ConfigError
from ..config import MegatronDataConfig
from .builder import MegatronOptions

__all__ = ["build_packed_megatron_datasets"]


def build_packed_megatron_datasets(
    config: MegatronDataConfig, sizes: Sequence[int | None], options: MegatronOptions
) -> tuple[Any | None, Any | None, Any | None]:
    raise ConfigError(
        "packing='best-fit' with order='megatron' is not available yet",
        hint="use order='computed' with packing='best-fit', or packing='concat'",
    )
