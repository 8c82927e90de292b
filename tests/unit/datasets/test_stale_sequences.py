"""A sequences JSON made before its token file changed fails the same way under every order: a
``FormatError`` naming the ``.idx`` and the JSON ("index is N bytes, expected ... as seq.json
records them"), whether the JSON records the dtype (tokenload's) or only the counts (Megatron's).
And the computed order checks the two pointers it takes of a split against their neighbours."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import FormatError
from tokenload.format import TokenFile
from tokenload.format.sequences import DTYPES_KEY, counts_of, write_sequences

ORDERS = ("megatron", "computed", "neox")


def _docs(count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1000, 20 + i % 7) for i in range(count)]


def _config(prefix, order, **kw) -> MegatronDataConfig:
    return MegatronDataConfig(sequence_length=16, blend=[prefix], split="90,10,0", order=order,
                              cache="off", **kw)


def _read(cfg) -> None:
    train = build_datasets(cfg, [50, 5, 0])[0]
    assert train is not None
    train.__getitems__([0, 1, 2])


@pytest.mark.parametrize("dtype_recorded", [True, False], ids=["tokenload-json", "megatron-json"])
@pytest.mark.parametrize("now", [60, 30], ids=["file-gained-documents", "file-lost-documents"])
@pytest.mark.parametrize("order", ORDERS)
def test_a_stale_sequences_json_names_the_idx_and_the_json(tmp_path, order, now, dtype_recorded):
    prefix = write_documents(tmp_path / "data", _docs(40))
    seq = tmp_path / "seq.json"
    write_sequences(seq, {prefix: counts_of(TokenFile(prefix))})
    if not dtype_recorded:  # as Megatron's tool writes it: counts only
        data = json.loads(seq.read_text())
        data.pop(DTYPES_KEY)
        seq.write_text(json.dumps(data))
    write_documents(prefix, _docs(now, seed=1))
    with pytest.raises(FormatError) as info:
        _read(_config(prefix, order, sequences_path=str(seq)))
    text = str(info.value)
    assert text.startswith(f"{prefix}.idx: ") and f"as {seq} records them" in text, text
    assert "40 sequences" in text or "expected 40 and 41" in text, text
    assert "HINT" in text and "tokenload sequences" in text


def _patch_pointer(prefix: str, n: int, i: int, delta: int) -> None:
    at = 34 + 4 * n + 8 * i
    with open(prefix + ".idx", "r+b") as f:
        f.seek(at)
        (value,) = struct.unpack("<q", f.read(8))
        f.seek(at)
        f.write(struct.pack("<q", value + delta))


def test_the_computed_order_checks_the_pointers_at_the_ends_of_each_split(tmp_path):
    """The computed order reads a split as one token range from its first pointer to its last
    sequence's end: a moved end pointer would shift every window; it is a FormatError naming the
    sequence. A pointer inside the split is not used by its reads: the items stay correct."""
    prefix = write_documents(tmp_path / "data", _docs(40))
    cfg = _config(prefix, "computed")
    sound = build_datasets(cfg, [50, 5, 0])[0].__getitems__(list(range(50)))["tokens"]
    train_end = 36  # split "90,10,0" of 40 documents: train is sequences [0, 36)
    _patch_pointer(prefix, 40, 10, 4)  # inside the train split
    inner = build_datasets(cfg, [50, 5, 0])[0].__getitems__(list(range(50)))["tokens"]
    np.testing.assert_array_equal(inner, sound)
    _patch_pointer(prefix, 40, 10, -4)
    _patch_pointer(prefix, 40, train_end, 4)  # the valid split's first pointer
    named = rf"data\.idx: sequence {train_end - 1} has pointer .* sequence {train_end}'s pointer"
    with pytest.raises(FormatError, match=named):
        build_datasets(cfg, [50, 5, 0])
