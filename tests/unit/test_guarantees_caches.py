"""Integrity guarantees at their boundaries (issue 38, points 5-7; planted bugs: tests/PLANTED.md).

* A shuffle entry equal to the sample count (and one past it) is a ``CacheError`` under
  ``cache="strict"``, and the cache is rebuilt under ``auto`` and serves what an in-memory build
  serves; the largest valid entry is not refused (README "Differences from Megatron", the
  sidecar-less check in ``datasets/megatron/cache_match.py`` and the per-batch range checks).
* A blend's arrays loaded through a build manifest (``build_policy="none"``) are checked like a
  GPT dataset's: a value damaged in range in ``dataset_sample_index`` or ``dataset_index`` is a
  ``CacheError`` naming the file before a batch reads through it (docs/SCALE.md).
* The batch read path checks sequence pointers in chunks of 16,384 sequences (docs/FORMAT.md):
  damage at a chunk's last sequence, the next chunk's first, one past it, the file's first and
  last, is a ``FormatError`` naming that sequence, whichever of them a batch reads first.
"""

from __future__ import annotations

import glob
import os
import pickle
import struct

import numpy as np
import pytest

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import CacheError, FormatError
from tokenload.format import TokenFile

SEQ = 8


def _documents(seed: int, count: int = 40) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(rng.integers(0, 1000, size=3 + i)) for i in range(count)]


def _megatron_file(prefix, documents) -> str:
    """A token file as Megatron writes it (no tokenload sidecar)."""
    write_documents(prefix, documents)
    os.remove(f"{prefix}.json")
    return str(prefix)


def _cache_file(folder, suffix: str, kind: str = "GPTDataset") -> str:
    (path,) = glob.glob(os.path.join(folder, f"*-{kind}-train-{suffix}"))
    return path


def _rewrite(path: str, change) -> None:
    """New values, same dtype and shape: sidecar and headers still match."""
    old = np.load(path)
    new = change(old.copy()).astype(old.dtype)
    assert new.shape == old.shape
    np.save(path, new)


def _tokens(ds) -> np.ndarray:
    return ds.__getitems__(list(range(len(ds))))["tokens"]


def _config(prefix, **overrides) -> MegatronDataConfig:
    return MegatronDataConfig(sequence_length=SEQ, blend=[prefix], split="90,10,0", **overrides)


def _set_entry(value_of_n):
    """Shuffle entry 3 set to ``value_of_n(n)``, n = the number of entries (samples)."""

    def change(a: np.ndarray) -> np.ndarray:
        a[3] = value_of_n(a.size)
        return a

    return change


SHUFFLE_BOUNDARY = {
    "equal to the sample count": _set_entry(lambda n: n),
    "one past the sample count": _set_entry(lambda n: n + 1),
    "the largest sample, duplicated": _set_entry(lambda n: n - 1),
}


@pytest.fixture
def megatron_cache(tmp_path):
    """A GPT index cache as Megatron leaves it (no tokenload sidecar, no build manifest): only
    the check against the token file's lengths stands between it and the batches."""
    prefix = _megatron_file(tmp_path / "data", _documents(5))
    cache = tmp_path / "cache"
    build_datasets(_config(prefix, path_to_cache=str(cache)), [300, 10, 0])
    for name in os.listdir(cache):
        if name.endswith(("-tokenload.json", "-tokenload-build.json")):
            os.remove(cache / name)
    return prefix, cache


@pytest.mark.parametrize("entry", list(SHUFFLE_BOUNDARY))
def test_a_shuffle_entry_at_or_past_the_sample_count_is_refused_then_rebuilt(megatron_cache, entry):
    prefix, cache = megatron_cache
    fresh = _tokens(build_datasets(_config(prefix, cache="off"), [300, 10, 0])[0])
    shuffle = _cache_file(cache, "shuffle_index.npy")
    _rewrite(shuffle, SHUFFLE_BOUNDARY[entry])
    with pytest.raises(CacheError, match=r"stale: .*shuffle_index") as info:
        build_datasets(_config(prefix, path_to_cache=str(cache), cache="strict"), [300, 10, 0])
    assert "HINT" in str(info.value)
    rebuilt = build_datasets(_config(prefix, path_to_cache=str(cache)), [300, 10, 0])[0]
    np.testing.assert_array_equal(_tokens(rebuilt), fresh)
    # the rebuilt file is a permutation of the samples again, and strict now takes it as it is
    assert sorted(np.load(shuffle).tolist()) == list(range(len(rebuilt)))
    again = build_datasets(_config(prefix, path_to_cache=str(cache), cache="strict"), [300, 10, 0])
    np.testing.assert_array_equal(_tokens(again[0]), fresh)


@pytest.mark.parametrize("offset, refused", [(-1, False), (0, True), (1, True)])
def test_a_batch_reading_a_shuffle_entry_at_the_sample_count_is_a_cache_error(
    megatron_cache, offset, refused
):
    """Damage after the cache was checked (no sidecar: no hash): the per-batch range check.
    ``offset`` -1 is the largest valid sample number (reads that sample), 0 the sample count."""
    prefix, cache = megatron_cache
    train = build_datasets(_config(prefix, path_to_cache=str(cache), cache="strict"), [300, 10, 0])[
        0
    ]
    n = len(train)
    # the item that holds sample n + offset now (the entry that names it), read before the damage
    holder = np.flatnonzero(np.asarray(train.shuffle_index) == n + offset)
    want = None if refused else train.__getitems__([int(holder[0])])["tokens"]
    shuffle = _cache_file(cache, "shuffle_index.npy")
    _rewrite(shuffle, _set_entry(lambda size: size + offset))
    shipped = pickle.loads(pickle.dumps(train))  # maps the arrays again, as a loader worker does
    if refused:
        with pytest.raises(CacheError, match="shuffle_index holds sample numbers past") as info:
            shipped.__getitems__([0, 3])
        assert info.value.path == shuffle and "HINT" in str(info.value)
    else:
        np.testing.assert_array_equal(shipped.__getitems__([3])["tokens"], want)


# -- point 6: a blend's arrays through the build manifest ------------------------------------------
BLEND_IN_RANGE = {
    # two entries of the same member swapped: every value in range, other items served
    "dataset_sample_index": lambda di: lambda a: _swap_within(a, di),
    # two entries of different members swapped: both still valid member ids
    "dataset_index": lambda di: lambda a: _swap_across(a),
}


def _swap_within(a: np.ndarray, di: np.ndarray) -> np.ndarray:
    first, second = np.flatnonzero(di == di[0])[:2]
    a[first], a[second] = a[second], a[first]
    return a


def _swap_across(a: np.ndarray) -> np.ndarray:
    other = int(np.flatnonzero(a != a[0])[0])
    a[0], a[other] = a[other], a[0]
    return a


@pytest.mark.parametrize("array", list(BLEND_IN_RANGE))
def test_a_blend_array_damaged_in_range_is_a_cache_error_under_build_policy_none(tmp_path, array):
    a = write_documents(tmp_path / "a", _documents(6))
    b = write_documents(tmp_path / "b", _documents(7))
    cache = tmp_path / "cache"
    cfg = MegatronDataConfig(
        sequence_length=SEQ, blend=["30", a, "70", b], split="90,10,0", path_to_cache=str(cache)
    )
    built = build_datasets(cfg, [200, 10, 0])[0]
    sound = _tokens(built)
    assert glob.glob(str(cache / "*-tokenload-build.json"))
    di = np.load(_cache_file(cache, "dataset_index.npy", "BlendedDataset"))
    path = _cache_file(cache, f"{array}.npy", "BlendedDataset")
    _rewrite(path, BLEND_IN_RANGE[array](di))
    loading = MegatronDataConfig(**{**cfg.__dict__, "build_policy": "none"})
    train = build_datasets(loading, [200, 10, 0])[0]
    # the damage is in range: without the digest the batch would read, and read other items
    assert len(train) == len(sound)
    shipped = pickle.loads(pickle.dumps(train))  # a loader worker maps the arrays itself
    with pytest.raises(CacheError, match=r"xxh3-64 is .* the index cache is damaged") as info:
        _tokens(shipped)
    assert info.value.path == path and "HINT" in str(info.value)


# -- point 7: pointers checked in chunks of 16,384 sequences ---------------------------------------
CHUNK = 16_384  # docs/FORMAT.md; deliberately not read from the code
COUNT = 2 * CHUNK + 5


@pytest.fixture(scope="module")
def chunked(tmp_path_factory):
    """A token file of 2 chunks + 5 sequences of 1-3 tokens, and its sound bytes."""
    folder = tmp_path_factory.mktemp("chunks")
    rng = np.random.default_rng(11)
    lengths = rng.integers(1, 4, size=COUNT)
    docs = [rng.integers(0, 60000, size=int(n)) for n in lengths]
    prefix = write_documents(folder / "seq", docs)
    with open(prefix + ".idx", "rb") as f:
        return prefix, f.read(), [d.tolist() for d in docs]


def _damaged(prefix: str, sound: bytes, sequence: int, what: str) -> None:
    data = bytearray(sound)
    if what == "length":  # length + 1: the sequence runs into the next one's tokens
        at = 34 + 4 * sequence
        (n,) = struct.unpack_from("<i", data, at)
        struct.pack_into("<i", data, at, n + 1)
    else:  # pointer moved one token on: the sequence before ends short, this one runs over
        at = 34 + 4 * COUNT + 8 * sequence
        (p,) = struct.unpack_from("<q", data, at)
        struct.pack_into("<q", data, at, p + 2)
    with open(prefix + ".idx", "wb") as f:
        f.write(data)


def _restore(prefix: str, sound: bytes) -> None:
    with open(prefix + ".idx", "wb") as f:
        f.write(sound)


def _piece(tf: TokenFile, sequence: int) -> np.ndarray:
    """Sequence ``sequence``'s first token through the batch path (``read_pieces``)."""
    one = np.ones(1, np.int64)
    return tf.read_pieces(np.array([sequence]), np.zeros(1, np.int64), one)


PLACES = {
    "the file's first sequence": 0,
    "a chunk's last sequence": CHUNK - 1,
    "the next chunk's first": CHUNK,
    "one past it": CHUNK + 1,
    "the second chunk's last": 2 * CHUNK - 1,
    "the last chunk's first": 2 * CHUNK,
}


@pytest.mark.parametrize("mode", ["mmap", "pread"])
@pytest.mark.parametrize("place", list(PLACES))
def test_damage_at_each_chunk_boundary_is_found_by_the_batch_read(chunked, place, mode):
    prefix, sound, docs = chunked
    sequence = PLACES[place]
    try:
        _damaged(prefix, sound, sequence, "length")
        tf = TokenFile(prefix, mode=mode)
        with pytest.raises(FormatError, match=rf"seq\.idx: sequence {sequence} has pointer"):
            _piece(tf, sequence)
        # the chunk stays unchecked: a second read of it is refused again
        with pytest.raises(FormatError, match=rf"sequence {sequence} has pointer"):
            _piece(tf, sequence)
        # a pointer moved at the same place: the first bad step is the sequence before it (or
        # this one, where a read touches only this one's chunk)
        _damaged(prefix, sound, sequence, "pointer")
        tf = TokenFile(prefix, mode=mode)
        named = sequence - 1 if sequence % CHUNK else sequence
        with pytest.raises(FormatError, match=rf"sequence {named} has pointer"):
            _piece(tf, sequence)
    finally:
        _restore(prefix, sound)
    # sound again: every boundary sequence reads what was written (no false alarm)
    tf = TokenFile(prefix, mode=mode)
    for s in (0, CHUNK - 1, CHUNK, 2 * CHUNK, COUNT - 1):
        assert _piece(tf, s).tolist() == docs[s][:1]


def test_the_files_last_sequence_is_checked_against_the_end_of_the_bin(chunked):
    """The last sequence has no next pointer (the end of ``.bin``): a length grown by one is
    refused at the open's size check or by the read, never read past."""
    prefix, sound, _ = chunked
    try:
        _damaged(prefix, sound, COUNT - 1, "length")
        with pytest.raises(FormatError):
            _piece(TokenFile(prefix), COUNT - 1)
    finally:
        _restore(prefix, sound)


def test_a_same_size_rewrite_of_a_token_file_is_noticed_under_build_policy_none(tmp_path):
    """docs/SCALE.md: under ``none`` a token file whose ``.bin`` size *or index digest* differs
    from the manifest's facts is a ``CacheError`` naming it where it opens (once per process,
    whatever the batch reads). Here the size is the same: documents 0 and 1 swapped (other
    lengths, same tokens), and the batch reads a sample away from them, which the per-batch
    range checks cannot find stale: only the digest can."""
    docs = _documents(9)
    prefix = write_documents(tmp_path / "data", docs)
    cache = tmp_path / "cache"
    cfg = _config(prefix, path_to_cache=str(cache))
    built = build_datasets(cfg, [300, 10, 0])[0]
    away = next(i for i in range(len(built)) if not {0, 1} & set(_documents_of(built, i)))
    sizes = (os.path.getsize(f"{prefix}.bin"), os.path.getsize(f"{prefix}.idx"))
    for ext in (".bin", ".idx", ".json"):
        os.remove(f"{prefix}{ext}")
    write_documents(prefix, [docs[1], docs[0], *docs[2:]])
    assert (os.path.getsize(f"{prefix}.bin"), os.path.getsize(f"{prefix}.idx")) == sizes
    loading = MegatronDataConfig(**{**cfg.__dict__, "build_policy": "none"})
    train = pickle.loads(pickle.dumps(build_datasets(loading, [300, 10, 0])[0]))
    with pytest.raises(CacheError, match="index_xxh3_64") as info:
        train.__getitems__([away])
    assert info.value.path == f"{prefix}.idx" and "HINT" in str(info.value)


def _documents_of(ds, i: int) -> list[int]:
    """The documents item ``i`` of a GPT dataset reads (Megatron's three indices)."""
    s = int(ds.shuffle_index[i])
    first, last = int(ds.sample_index[s][0]), int(ds.sample_index[s + 1][0])
    return ds.document_index[first : last + 1].tolist()
