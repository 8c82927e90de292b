"""A token file whose ``.idx`` dtype code says float is never a token file.

The case of the issue: int32 tokens under code 7 (float32, the same item size, so every size
check passes) with no sidecar. Opening it, every order's datasets and the loader raise a
FormatError naming the file, the code and the integer codes expected, never a TypeError from
deep inside a read; ``verify`` reports it invalid. ``tests/cli/test_float_dtype_cli.py`` runs
the commands.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import FormatError
from tokenload.format import TokenFile, check_file, describe
from tokenload.format.idx import MEGATRON_CODES

DOCS = [list(range(1, 40)), list(range(50, 90)), list(range(7, 33))] * 10


def float_coded(tmp_path: Path, code: int = 7, dtype=np.int32, name: str = "f") -> str:
    """Integer tokens whose header's dtype code was changed to ``code``; no sidecar."""
    prefix = write_documents(tmp_path / name, DOCS, dtype=dtype)
    os.remove(prefix + ".json")
    with open(prefix + ".idx", "r+b") as f:
        f.seek(17)  # the dtype code byte: after the 9-byte magic and the u64 version
        f.write(bytes([code]))
    return prefix


def _expected_message(prefix: str, code: int) -> str:
    dtype = MEGATRON_CODES[code]
    return rf"{prefix}\.idx: dtype code {code} means {dtype}, which is not a token dtype"


@pytest.mark.parametrize(("code", "dtype"), [(7, np.int32), (6, np.int64)])
def test_opening_a_float_code_is_a_format_error_naming_file_code_and_expected(
    tmp_path, code, dtype
):
    prefix = float_coded(tmp_path, code, dtype)
    for mode in ("mmap", "pread", "memory"):
        with pytest.raises(FormatError, match=_expected_message(prefix, code)) as info:
            TokenFile(prefix, mode=mode).document(0)
        message = str(info.value)
        assert (
            "expected an integer code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16)"
            in message
        )
        assert "HINT:" in message


def test_a_sequences_json_that_says_float_is_refused_too(tmp_path):
    prefix = float_coded(tmp_path)
    with pytest.raises(FormatError, match="not a token dtype"):
        TokenFile(prefix, sequences=(len(DOCS), len(DOCS) + 1), dtype="float32").document(0)


@pytest.mark.parametrize(("order", "workers"), [("megatron", 0), ("computed", 0), ("megatron", 1)])
def test_the_datasets_and_the_loader_raise_the_format_error(tmp_path, order, workers):
    from tokenload.loader import build_dataloader

    prefix = float_coded(tmp_path)
    config = MegatronDataConfig(
        sequence_length=16,
        blend=[prefix],
        split="100,0,0",
        order=order,
        path_to_cache=str(tmp_path / "cache") if order == "megatron" else None,  # its caches
    )
    with pytest.raises(FormatError, match=_expected_message(prefix, 7)):
        train = build_datasets(config, [40, 0, 0])[0]
        loader = build_dataloader(train, micro_batch_size=4, num_workers=workers)
        next(iter(loader))


def test_verify_reports_it_invalid_and_info_still_describes_it(tmp_path):
    prefix = float_coded(tmp_path)
    result = check_file(prefix)
    assert len(result.problems) == 1 and "dtype code 7 means float32" in result.problems[0]
    described = describe(prefix)
    assert described["dtype"] == "float32" and "not a token file" in described["dtype_note"]


def test_integer_codes_open_as_before(tmp_path):
    for code, dtype in MEGATRON_CODES.items():
        if dtype.kind not in "iu" or dtype.itemsize > 4:
            continue
        prefix = float_coded(tmp_path, code, dtype, name=f"i{code}")
        assert TokenFile(prefix).document(1).tolist() == DOCS[1]
        assert check_file(prefix).problems == []
