"""Adapters to training frameworks (optional extras); each submodule imports its framework.

``tokenload.integrations.lightning.TokenloadDataModule`` needs the ``lightning`` extra.
Nothing is imported here, so importing this package never pulls in a framework.
"""

from __future__ import annotations
