"""Packed rows in the Megatron order through the build policies: the command a
build_policy='none' job prints prepares the packed plan, the job loads it and serves what an
in-memory build serves; a damaged plan array is a CacheError naming it, never other rows."""

from __future__ import annotations

import dataclasses
import glob
from pathlib import Path

import numpy as np
import pytest

from support import run_cli, run_shell, write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import CacheError


@pytest.fixture
def packed_job(tmp_path):
    rng = np.random.default_rng(9)
    prefixes = [
        write_documents(
            tmp_path / name,
            [rng.integers(1, 90, size=int(n)).tolist() for n in rng.integers(1, 40, size=400)],
        )
        for name in ("a", "b")
    ]
    config = MegatronDataConfig(
        sequence_length=16, blend=["0.3", prefixes[0], "0.7", prefixes[1]], split="90,10,0",
        packing="best-fit", max_documents_per_row=5, path_to_cache=str(tmp_path / "c"),
        build_policy="none",
    )
    return config, [300, 30, 0], tmp_path / "c"


def test_the_printed_command_prepares_the_packed_plan_that_none_loads(packed_job):
    config, sizes, cache = packed_job
    with pytest.raises(CacheError) as info:
        build_datasets(config, sizes)
    command = str(info.value).split("with: ", 1)[1].split("  (or use", 1)[0]
    assert "--packing best-fit --max-documents-per-row 5" in command
    out = run_shell(command)
    assert out.returncode == 0, out.stderr
    # the summary says which caches these are
    assert "packing             best-fit (PackedGPTDataset caches, at most 5 documents per row)" in out.stdout
    assert glob.glob(str(cache / "*-PackedGPTDataset-train-piece_index.npy"))
    assert glob.glob(str(cache / "*-PackedGPTDataset-train-piece_part.npy"))
    # the layout is in the cache's identity: a plan of another layout is another cache
    for description in glob.glob(str(cache / "*-PackedGPTDataset-*-description.txt")):
        assert '"layout": "sequence+part, rows served in order, shuffled per block"' in Path(description).read_text()
    loaded = build_datasets(config, sizes)
    built = build_datasets(dataclasses.replace(config, build_policy="every-rank", path_to_cache=None), sizes)
    for got, want in zip(loaded[:2], built[:2]):
        assert len(got) == len(want) >= 30
        rows = np.arange(len(want))
        a, b = got.__getitems__(rows), want.__getitems__(rows)
        for field in ("tokens", "labels", "loss_mask", "position_ids", "dataset_id"):
            np.testing.assert_array_equal(a[field], b[field])


@pytest.mark.parametrize("array", ["piece_index", "piece_part"])
def test_a_damaged_plan_is_refused_under_none(packed_job, array):
    config, sizes, cache = packed_job
    with pytest.raises(CacheError) as info:
        build_datasets(config, sizes)
    command = str(info.value).split("with: ", 1)[1].split("  (or use", 1)[0]
    assert run_shell(command).returncode == 0
    files = glob.glob(str(cache / f"*-PackedGPTDataset-train-{array}.npy"))
    assert len(files) == 2  # one per prefix
    for path in files:
        data = bytearray(Path(path).read_bytes())
        # the last piece's sequence, or its start: past any document
        data[-4:] = (10**6).to_bytes(4, "little")
        Path(path).write_bytes(bytes(data))
    train = build_datasets(config, sizes)[0]
    with pytest.raises(CacheError, match=array):
        train.__getitems__(np.arange(len(train)))


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--max-documents-per-row", "3"], "--packing best-fit"),  # a cap without packed rows
        (["--split", "1,1,1,1"], "split"),  # a bad value the configuration refuses (as Megatron)
    ],
)
def test_flags_the_configuration_refuses_create_nothing(tmp_path, flags, words):
    prefix = write_documents(tmp_path / "a", [[1, 2, 3, 4]] * 40)
    cache = tmp_path / "made" / "cache"
    out = run_cli("prepare-cache", "--data-path", prefix, "--seq-length", 4,
                  "--train-valid-test-num-samples", 8, 0, 0, "--data-cache-path", cache,
                  *flags)  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert words in out.stderr and "packing=" not in out.stderr, out.stderr
    assert out.stdout == ""  # not even the values it would have used
    assert not (tmp_path / "made").exists()
