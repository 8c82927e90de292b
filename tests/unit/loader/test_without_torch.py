"""Without torch (tokenload installed without the ``torch`` extra) the loader is refused when it is
built, with a MissingExtraError naming the extra, not at the first batch; the rest still works."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np

from tokenload.format import write_flat

SCRIPT = """
import sys
sys.modules["torch"] = None  # as if torch were not installed: importing it raises ImportError

from tokenload.datasets import FlatDatasetConfig, FlatTokenDataset
from tokenload.errors import MissingExtraError
from tokenload.loader import LoaderConfig, TokenloadDataLoader, build_dataloader

dataset = FlatTokenDataset(sys.argv[1], FlatDatasetConfig(block_size=8))
assert dataset.__getitems__([0, 1])["tokens"].shape == (2, 8)  # datasets need no torch
for build in (
    lambda: build_dataloader(dataset, micro_batch_size=2, num_workers=2),
    lambda: TokenloadDataLoader(dataset, LoaderConfig(micro_batch_size=2, num_workers=0)),
):
    try:
        build()
    except MissingExtraError as exc:
        print("refused:", str(exc).replace(chr(10), " | "))
    else:
        print("built without torch")
"""


def test_the_loader_is_refused_when_built(tmp_path):
    write_flat(tmp_path / "train.bin", np.arange(1_000))
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), str(tmp_path / "train.bin")],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2, result.stdout
    for line in lines:
        assert line.startswith("refused: tokenload's DataLoader needs the Python package 'torch'"), line
        assert "HINT: tokenload is not on a package index: pip install '.[torch]' in its clone" in line
