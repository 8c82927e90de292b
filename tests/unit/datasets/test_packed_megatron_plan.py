"""The Megatron order's packed plan (``datasets.megatron.packed``): its 6-byte-per-piece layout
names exactly the pieces ``pack_block`` makes of Megatron's document index, the build holds the
plan and one block's packing at its peak (the document index lives in the pieces' buffer), and
damaged values of the plan are a ``CacheError`` naming the array they came from
(tests/unit/datasets/test_packing.py checks the rows served through both orders)."""

from __future__ import annotations

import tracemalloc
from collections import Counter

import numpy as np
import pytest

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.datasets.megatron.gpt_dataset import IndexArrays
from tokenload.datasets.megatron.packed import PackedGPTDataset, build_packed_indices
from tokenload.errors import CacheError
from tokenload.index.document import build_document_index
from tokenload.index.epochs import plan_epochs
from tokenload.index.gpt import seeded_random_state
from tokenload.index.packing import pack_block


def lengths_with_every_case(n: int, window: int, extra: int, seed: int) -> np.ndarray:
    """Short documents, long ones cut into windows (with and without a rest), empty ones, and
    ones of exactly ``window`` tokens (whole, never cut)."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(rng.lognormal(np.log(window / 3), 1.2, n).astype(np.int64), 0)
    at = rng.permutation(n)
    stride = window - extra
    lengths[at[:20]] = 0
    lengths[at[20:40]] = window
    lengths[at[40:60]] = 3 * stride + extra  # three full windows, a rest of ``extra`` (dropped)
    lengths[at[60:80]] = 2 * stride + extra + 1  # two full windows and a rest of one input
    return lengths


def reference_pieces(lengths, documents, *, num_samples, seq, extra, seed, cap, block):
    """Each row's (sequence, start, length) pieces straight from ``pack_block`` over the
    document index, each block's rows in the order the generator then draws, with one more
    epoch while the rows fall short (the module docstring)."""
    window = seq + extra
    docs = np.asarray(documents, dtype=np.int32)
    epochs = plan_epochs(
        tokens_per_epoch=int(lengths[docs].sum()),
        num_samples=num_samples,
        sequence_length=seq,
        extra=extra,
    )
    num_epochs, separate = epochs.num_epochs, epochs.separate_final_epoch
    while True:
        rng = seeded_random_state(seed)
        order = build_document_index(docs, num_epochs, rng, separate)
        rows: list[list[tuple[int, int, int]]] = []
        # a separate final epoch's documents are packed on their own
        final = (num_epochs - 1) * docs.size if separate and num_epochs > 1 else order.size
        spans = [(lo, min(lo + block, final)) for lo in range(0, final, block)]
        spans += [(lo, min(lo + block, order.size)) for lo in range(final, order.size, block)]
        for lo, hi in spans:
            ids = order[lo:hi]
            plan = pack_block(lengths[ids], window, extra, cap, row_order=rng.permutation)
            for r in range(plan.num_rows):
                a, b = plan.row_offsets[r], plan.row_offsets[r + 1]
                rows.append(
                    [
                        (int(ids[d]), int(s), int(n))
                        for d, s, n in zip(
                            plan.piece_doc[a:b],
                            plan.piece_start[a:b],
                            plan.piece_length[a:b],
                            strict=True,
                        )
                    ]
                )
        if num_samples is None or len(rows) >= num_samples:
            return rows
        # one more epoch, separate when the request takes under 80% of an epoch's rows from it
        separate = num_samples - len(rows) < int(0.8 * (len(rows) // num_epochs))
        num_epochs += 1


def decoded_rows(plan, lengths, seq, extra):
    """The plan's rows by the layout of the module docstring, decoded entry by entry."""
    window = seq + extra
    offsets, table, parts = plan["row_index"], plan["piece_index"], plan["piece_part"]
    rows = []
    for r in range(offsets.size - 1):
        span = slice(offsets[r], offsets[r + 1])
        row = []
        for s, k in zip(table[span].tolist(), parts[span].tolist(), strict=True):
            row.append((s, k * seq, min(window, int(lengths[s]) - k * seq)))
        rows.append(row)
    return rows


@pytest.mark.parametrize(
    "seq, extra, cap, num_samples, block",
    [
        (16, 1, None, None, 1 << 20),
        (16, 1, None, 4_000, 700),  # several blocks, more than one epoch
        (24, 0, None, 900, 512),
        (16, 1, 3, 1_500, 1 << 10),  # at most 3 pieces per row
    ],
)
def test_the_plan_names_exactly_the_pieces_pack_block_makes(seq, extra, cap, num_samples, block):
    lengths = lengths_with_every_case(2_000, seq + extra, extra, seed=seq + extra)
    beg, end = 50, 1_950
    kwargs = dict(num_samples=num_samples, sequence_length=seq, extra=extra, seed=3)
    plan = build_packed_indices(lengths, range(beg, end), max_documents=cap, block=block, **kwargs)
    assert plan.keys() == {"row_index", "piece_index", "piece_part"}
    assert plan["piece_index"].dtype == np.int32 and plan["piece_index"].ndim == 1
    assert plan["piece_part"].dtype == np.uint16
    assert plan["piece_part"].shape == plan["piece_index"].shape
    assert plan["row_index"].dtype == np.int32 and plan["row_index"][0] == 0
    assert plan["row_index"][-1] == plan["piece_index"].size
    assert (plan["piece_part"] > 0).any()  # cut documents: pieces past their first
    want = reference_pieces(
        lengths,
        np.arange(beg, end),
        num_samples=num_samples,
        seq=seq,
        extra=extra,
        seed=3,
        cap=cap,
        block=block,
    )
    assert decoded_rows(plan, lengths, seq, extra) == want
    # the ids as an array: the same plan
    same = build_packed_indices(
        lengths, np.arange(beg, end, dtype=np.int32), max_documents=cap, block=block, **kwargs
    )
    assert plan.keys() == same.keys()
    for name, array in plan.items():
        np.testing.assert_array_equal(array, same[name])
        assert array.dtype == same[name].dtype


def test_a_sequence_of_2_16_windows_or_more_numbers_its_parts_in_uint32():
    # piece_part is uint16 while every part number fits: a sequence of 2^16 windows of S tokens
    # or more (here 1M tokens at S = 8) needs uint32, and its pieces decode the same
    seq, extra = 8, 1
    lengths = lengths_with_every_case(300, seq + extra, extra, seed=5)
    for longest, dtype in ((seq * ((1 << 16) - 1) + extra + 3, np.uint16), (seq * (1 << 16) + extra + 3, np.uint32)):
        lengths[17] = longest  # its rest is part (longest - extra) // seq
        kwargs = dict(num_samples=None, sequence_length=seq, extra=extra, seed=2)
        plan = build_packed_indices(lengths, range(0, 300), block=128, **kwargs)
        assert plan["piece_part"].dtype == dtype
        assert int(plan["piece_part"].max()) == (longest - extra) // seq
        want = reference_pieces(
            lengths, np.arange(300), num_samples=None, seq=seq, extra=extra, seed=2, cap=None, block=128
        )
        assert decoded_rows(plan, lengths, seq, extra) == want


def served_before_a_repeat(plan, lengths, seq, extra) -> tuple[int, int]:
    """(distinct pieces, rows) served (row k is sample k) before a piece comes twice."""
    rows = decoded_rows(plan, lengths, seq, extra)
    seen: set[tuple[int, int, int]] = set()
    for at, row in enumerate(rows):
        for piece in row:
            if piece in seen:
                return len(seen), at
            seen.add(piece)
    return len(seen), len(rows)


@pytest.mark.parametrize("share", [1.3, 1.0, 2.5])
def test_a_separate_final_epoch_is_served_last(share):
    # Megatron's separate final epoch (the request takes < 80% of its last epoch, as with 1.3
    # and 2.5 epochs, and with the epoch added when packed rows fall short of a 1.0 request):
    # its documents fill rows of their own, shuffled apart and served last; with 2 epochs in
    # all, the first epoch's rows thus serve every piece once before any repeats
    seq, extra, block = 16, 1, 300
    lengths = lengths_with_every_case(1_000, seq + extra, extra, seed=7)
    documents = range(0, 1_000)
    one = build_packed_indices(
        lengths, documents, num_samples=None, sequence_length=seq, extra=extra, seed=5, block=block
    )
    pieces = sum(len(row) for row in decoded_rows(one, lengths, seq, extra))
    epoch_rows = one["row_index"].size - 1
    tokens = int(lengths.sum())
    num_samples = int(share * epoch_rows) if share != 1.0 else (tokens - extra) // seq
    plan = build_packed_indices(
        lengths,
        documents,
        num_samples=num_samples,
        sequence_length=seq,
        extra=extra,
        seed=5,
        block=block,
    )
    total = plan["row_index"].size - 1
    assert total >= num_samples > epoch_rows * (share - 0.05)
    rows = decoded_rows(plan, lengths, seq, extra)
    # the final epoch's rows: the shortest tail that holds every piece (rows before it repeat
    # pieces of earlier epochs only, so a shorter tail misses a piece of its first row)
    tail, seen = total, set()
    while len(seen) < pieces:
        tail -= 1
        seen.update(rows[tail])
    assert 0.5 * epoch_rows < total - tail < 1.05 * epoch_rows
    epochs = round(share + 0.5) if share != 1.0 else 2
    head = Counter(piece for r in range(tail) for piece in rows[r])
    assert len(head) == pieces and set(head.values()) == {epochs - 1}
    final = Counter(piece for r in range(tail, total) for piece in rows[r])
    assert set(final.values()) == {1} and len(final) == pieces
    if epochs == 2:
        distinct, served = served_before_a_repeat(plan, lengths, seq, extra)
        assert distinct == pieces and served >= tail


def test_the_build_holds_the_plan_and_one_block_at_its_peak():
    lengths = lengths_with_every_case(300_000, 257, 1, seed=4)
    block = 1 << 14
    tracemalloc.start()
    try:
        plan = build_packed_indices(
            lengths.astype(np.int32),
            range(0, lengths.size),
            num_samples=None,
            sequence_length=256,
            extra=1,
            seed=1,
            block=block,
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    held = sum(a.nbytes for a in plan.values())
    pieces = int(plan["row_index"][-1])
    assert plan["piece_index"].nbytes + plan["piece_part"].nbytes == 6 * pieces
    empty = 4 * int(np.count_nonzero(lengths == 0))  # their places in the pieces' buffer
    # ``row_index`` is sized for a row per piece until the rows are counted (pages never written,
    # so never resident, but tracemalloc counts them), and the document index (int32) lives in
    # the end of piece_index's buffer; one block's packing costs ~130 bytes per document
    # (pack_block's int64 arrays): the plan is never held twice, nor with a document index of
    # its own (4 bytes per entry more)
    sized = 4 * (pieces - plan["row_index"].size)
    assert peak <= held + sized + empty + 200 * block, (peak, held, sized)
    assert peak > held  # (tracemalloc sees the plan)


@pytest.fixture
def packed(tmp_path):
    """A packed dataset over arrays in memory (no cache file, so no digests: only the range
    checks stand between a damaged value and a batch), on documents some of which are cut."""
    rng = np.random.default_rng(2)
    lengths = [int(n) for n in rng.integers(1, 60, size=300)]
    lengths[7] = 0
    lengths[11] = 100  # cut: full windows and a rest
    prefix = write_documents(tmp_path / "a", [rng.integers(1, 999, size=n) for n in lengths])
    config = MegatronDataConfig(
        sequence_length=16, blend=[prefix], split="1,0,0", packing="best-fit", eod_id=None
    )
    built = build_datasets(config, [None, 0, 0])[0]
    assert isinstance(built, PackedGPTDataset)
    arrays = {name: np.array(a) for name, a in built.indices.arrays().items()}  # writable
    assert (arrays["piece_part"] > 0).any()  # a cut document's later pieces
    data = PackedGPTDataset(
        built.source,
        IndexArrays(arrays=arrays),
        built.item,
        identity=built.identity,
        length=len(built),
        samples_per_epoch=built.samples_per_epoch,
    )
    return data, arrays, lengths


def test_samples_of_a_cut_document_are_those_whose_inputs_hold_its_tokens(packed):
    data, _, lengths = packed
    samples = np.arange(len(data))
    first, pieces = data.plan_pieces(samples)
    ends = np.append(first[1:], len(pieces))
    for document in (11, 0, 7, int(np.argmax(lengths))):
        want = []
        for k in samples:
            slot = 0
            for s, _, n in pieces[first[k] : ends[k]].tolist():
                if s == document and slot < data.item.sequence_length:
                    want.append(int(k))
                    break
                slot += n
        got = data.samples_of(0, document)
        assert got.tolist() == want, document
    assert len(data.samples_of(0, 11)) >= 6  # 100 tokens: 6 full windows (and a rest)


def test_damaged_values_are_a_cache_error_naming_their_array(packed):
    data, arrays, lengths = packed
    table, parts = arrays["piece_index"], arrays["piece_part"]
    later = int(np.flatnonzero(parts > 0)[0])  # a piece of the cut document past its first
    cut = int(table[later])
    mine = np.flatnonzero(table == cut)
    rest = int(mine[np.argmax(parts[mine])])  # its last piece, after its full windows
    offsets = arrays["row_index"]
    everything = np.arange(len(data))
    data.__getitems__(everything)  # whole, it serves
    cases = [
        (offsets, 3, int(offsets[2]), "row_index"),  # a row without pieces
        (offsets, 3, -5, "row_index"),  # before the pieces
        (offsets, 0, -5, "row_index"),  # the first row's: its count still positive
        (offsets, len(offsets) - 1, len(table) + 3, "row_index"),  # past them
        (offsets, 5, int(offsets[6]) + 1, "row_index"),  # decreasing
        # a row of 2^28 pieces: refused before their positions are allocated (2 GiB)
        (offsets, len(offsets) - 1, 1 << 28, "row_index"),
        (offsets, 4, -(1 << 31), "row_index"),  # the int32 count before it wraps around
        (table, 0, -1, "piece_index"),  # a negative sequence (read as uint32: past the file)
        (table, 0, len(lengths), "piece_index"),  # a sequence past the file
        (table, 0, 7, "piece_index"),  # an empty document
        (table, later, 7, "piece_index"),  # an empty document, from a start past 0
        (parts, later, -(-lengths[cut] // 16), "piece_part"),  # at its sequence's end
        (parts, later, (1 << 16) - 1, "piece_part"),  # far past it
        # a part that leaves more of the document to its piece than its row has room for
        (parts, rest, 0, "piece_index"),
    ]
    # consecutive samples slice the plan's arrays; others gather them: both check every value
    scattered = np.random.default_rng(0).permutation(len(data))
    for array, at, value, name in cases:
        kept = array[at]
        array[at] = value
        try:
            for samples in (everything, scattered, everything.tolist()):
                with pytest.raises(CacheError, match=name):
                    data.__getitems__(samples)
                with pytest.raises(CacheError, match=name):
                    data.plan_pieces(samples)
        finally:
            array[at] = kept
    data.__getitems__(everything)
    data.__getitems__(scattered)


def test_samples_of_checks_the_offsets_of_the_rows_it_decodes(packed):
    """Red-team finding: ``samples_of`` (provenance's ``where``) used ``row_index`` unchecked: a
    wrapped offset made a 16 GiB allocation, a first offset past 0 a raw ValueError, and an
    offset past its row's pieces an answer from other rows. A ``CacheError``, as for a read."""
    data, arrays, _ = packed
    table, offsets = arrays["piece_index"], arrays["row_index"]
    for at, value, document in (
        (0, 5, int(table[0])),  # a hit before the first row
        (40, 10**6, int(table[offsets[40]])),  # the row before it: 10^6 pieces
        # (last: unchecked, it would allocate 16 GiB)
        (40, -(1 << 31), int(table[offsets[40]])),  # ahead of a hit: 2^31 pieces
    ):
        kept = int(offsets[at])
        offsets[at] = value
        try:
            with pytest.raises(CacheError, match="row_index"):
                data.samples_of(0, document)
        finally:
            offsets[at] = kept
        assert data.samples_of(0, document).size


@pytest.mark.parametrize("array", ["row_index", "piece_index", "piece_part"])
def test_a_plan_array_mapped_without_a_manifest_is_checked_against_its_sidecar(tmp_path, array):
    """Arrays past ``VERIFY_AT_CHECK_BYTES`` (a 100M-document plan's ``piece_index`` is 400 MB)
    are verified when first mapped, against the digest the cache's sidecar records: a value
    damaged within range (which no range check can see) is a ``CacheError`` naming the file."""
    from tokenload.caches import files

    rng = np.random.default_rng(4)
    prefix = write_documents(tmp_path / "a", [rng.integers(1, 99, size=n) for n in [40] * 50])
    config = MegatronDataConfig(
        sequence_length=16,
        blend=[prefix],
        split="1,0,0",
        packing="best-fit",
        eod_id=None,
        path_to_cache=str(tmp_path / "cache"),
    )
    build_datasets(config, [None, 0, 0])
    (path,) = tmp_path.joinpath("cache").glob(f"*-PackedGPTDataset-train-{array}.npy")
    values = np.load(path).ravel()
    i = values.size - 1
    j = int(np.flatnonzero(values != values[i])[-1])  # two entries that differ, swapped
    values[i], values[j] = values[j], values[i]
    data = bytearray(path.read_bytes())
    data[len(data) - values.nbytes :] = values.tobytes()  # (a valid value each)
    path.write_bytes(bytes(data))
    files._VERIFIED.clear()  # as a fresh process
    with pytest.raises(CacheError, match=array):
        files.map_array(str(path))


def test_consecutive_samples_read_one_run_and_serve_what_any_other_spelling_does(packed):
    # a micro-batch of consecutive samples (a sampler's list, a range, an integer array) slices
    # the plan; any other spelling gathers: the same rows; what is no sample index is refused
    # as before (a float among ints), whichever path it would take
    from tokenload.datasets.megatron.packed import _run

    data, _, _ = packed
    n = len(data)
    assert _run([3, 4, 5], n) == (3, 5 + 1)
    assert _run(range(3, 6), n) == (3, 6)
    assert _run(np.arange(3, 6, dtype=np.uint32), n) == (3, 6)
    for other in ([3, 5, 4], [3, 4, 6], [-1, 0], [n - 1, n], [], range(0, 4, 2), [3, 4.0, 5],
                  [0, True, 2], np.array([3, 5, 4]), np.array([1.0, 2.0])):
        assert _run(other, n) is None, other
    want = data.__getitems__(np.array([7, 8, 9, 10])[::-1].copy())  # gathered
    for spelling in ([7, 8, 9, 10], range(7, 11), np.arange(7, 11), np.arange(7, 11, dtype=np.int32)):
        got = data.__getitems__(spelling)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key][::-1], err_msg=f"{key} {spelling}")
    for bad in ([7, 8.0, 9], [7.5]):
        with pytest.raises(IndexError, match="integers"):
            data.__getitems__(bad)
    with pytest.raises(IndexError, match="must lie in"):
        data.__getitems__([n - 1, n])
    with pytest.raises(IndexError, match="must lie in"):
        data.__getitems__(range(n - 1, n + 1))
