"""``tokenload.arrays.distinct`` is ``np.unique`` (values, and first indices), and a fresh
process's first micro-batch over real token files no longer imports ``numpy.ma`` (NumPy 2.x's
first ``np.unique`` did: 3-16 ms of every rank's and spawned worker's start)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from support import write_small_blend
from tokenload.arrays import distinct


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint16, np.float64])
def test_distinct_is_np_unique(dtype):
    rng = np.random.default_rng(7)
    for size in (0, 1, 2, 5, 100, 10_000):
        for high in (1, 3, 1000):
            values = rng.integers(-high if dtype != np.uint16 else 0, high + 1, size=size).astype(dtype)
            want, first = np.unique(values, return_index=True)
            got = distinct(values)
            assert got.dtype == want.dtype and np.array_equal(got, want)
            got_values, got_first = distinct(values, first_index=True)
            assert np.array_equal(got_values, want) and np.array_equal(got_first, first)
    grid = rng.integers(0, 4, size=(6, 7))
    assert np.array_equal(distinct(grid), np.unique(grid))  # flattened, as np.unique


_FIRST_BATCH = """
import json, sys
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.datasets.computed.computed_dataset import build_computed_datasets
from tokenload.loader import build_dataloader
folder, order = sys.argv[1], sys.argv[2]
blend = ["0.5", folder + "/a", "0.3", folder + "/b", "0.2", folder + "/c"]
config = MegatronDataConfig(blend=blend, split="100,0,0", sequence_length=16)
build = build_datasets if order == "megatron" else build_computed_datasets
dataset = build(config, [200, 0, 0])[0]
batch = next(iter(build_dataloader(dataset, micro_batch_size=8, num_workers=0)))
print(json.dumps({"ma": "numpy.ma" in sys.modules, "rows": len(batch["tokens"])}))
"""


@pytest.mark.parametrize("order", ["megatron", "computed"])
def test_a_first_micro_batch_over_a_blend_does_not_import_numpy_ma(tmp_path, order):
    write_small_blend(tmp_path)
    run = subprocess.run([sys.executable, "-c", _FIRST_BATCH, str(tmp_path), order],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == {"ma": False, "rows": 8}
