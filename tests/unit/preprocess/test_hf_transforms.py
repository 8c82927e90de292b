"""An HF ``IterableDataset`` is written with exactly the rows it yields, in its order.

The independent model is the dataset's own iteration (``[row["text"] for row in ds]``); the
output is read back document by document with the byte tokenizer (a document's ids are its UTF-8
bytes), so the comparison needs nothing of preprocess. Each transform the issue found lost
(take, skip, shuffle, interleave_datasets, filter), the others a user reaches for (map, a later
epoch, a split by node), random chains of them, and a kill and resume of a transformed dataset.
"""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenload.format import TokenFile
from tokenload.preprocess import PreprocessConfig, TokenizerSpec, hf, preprocess

datasets.disable_progress_bars()
ROWS = 3000


def _table(name: str, rows: int, shards: int) -> datasets.IterableDataset:
    texts = [f"{name} row {i} " + "é" * (i % 5) for i in range(rows)]
    return datasets.Dataset.from_dict({"text": texts, "n": list(range(rows))}).to_iterable_dataset(
        num_shards=shards
    )


@pytest.fixture(scope="module")
def base() -> datasets.IterableDataset:
    """3,000 rows in 3 shards of 1,000, as in the issue."""
    return _table("a", ROWS, 3)


def write(ds, out: Path, **kw):
    kw.setdefault("workers", 1)
    config = PreprocessConfig(
        inputs=(ds,), output_prefix=str(out), tokenizer=TokenizerSpec(kind="byte"), **kw
    )
    return preprocess(config, progress=False)


def written_texts(out: Path) -> list[str]:
    tf = TokenFile(f"{out}_text_document")
    return [bytes(tf.document(i).astype(np.uint8)).decode() for i in range(tf.num_documents)]


def yielded_texts(ds) -> list[str]:
    return [row["text"] for row in ds]


TRANSFORMS = {
    "take(100)": lambda ds, other: ds.take(100),
    "skip(2900)": lambda ds, other: ds.skip(2900),
    "shuffle(seed=1)": lambda ds, other: ds.shuffle(seed=1, buffer_size=500),
    "interleave_datasets": lambda ds, other: datasets.interleave_datasets([ds, other]),
    "interleave_datasets(probabilities)": lambda ds, other: datasets.interleave_datasets(
        [ds, other], probabilities=[0.3, 0.7], seed=4
    ),
    "filter": lambda ds, other: ds.filter(lambda row: row["n"] % 7 != 3),
    "map": lambda ds, other: ds.map(lambda row: {"text": row["text"].upper()}),
    "take(2500).skip(40)": lambda ds, other: ds.take(2500).skip(40),
}


@pytest.mark.parametrize("name", TRANSFORMS)
def test_a_transformed_iterable_is_written_as_it_yields(tmp_path, base, name):
    other = _table("b", 999, 2)  # 2,999 rows in all with the base, as in the issue
    ds = TRANSFORMS[name](base, other)
    expected = yielded_texts(ds)
    write(ds, tmp_path / "out")
    assert written_texts(tmp_path / "out") == expected


def test_a_later_epoch_a_split_by_node_and_a_loaded_state_are_written_as_they_yield(tmp_path, base):
    from datasets.distributed import split_dataset_by_node

    epoch = _table("a", ROWS, 3)
    epoch.set_epoch(3)  # a later epoch reorders the shards
    read = iter(base)
    for _ in range(1234):
        next(read)
    resumed = _table("a", ROWS, 3)
    resumed.load_state_dict(base.state_dict())  # rows 1234 onwards
    nodes = split_dataset_by_node(base, rank=1, world_size=2)
    for i, ds in enumerate([epoch, nodes, resumed]):
        expected = yielded_texts(ds)
        write(ds, tmp_path / f"out{i}")
        assert written_texts(tmp_path / f"out{i}") == expected


def test_only_an_untransformed_iterable_is_read_shard_by_shard(tmp_path, base):
    """The fast path stays for what it is right for: one piece per shard, the same rows."""
    assert hf.reads_as_shards(base)
    result = write(base, tmp_path / "out")
    assert result.files == 3
    assert written_texts(tmp_path / "out") == yielded_texts(base)
    for name, transform in TRANSFORMS.items():
        ds = transform(base, _table("b", 10, 2))
        assert not hf.reads_as_shards(ds), name
        assert len(hf.object_pieces(ds, 1 << 20)) == 1, name


# -- random chains -------------------------------------------------------------------------------

_STEP = st.one_of(
    st.tuples(st.just("take"), st.integers(0, 400)),
    st.tuples(st.just("skip"), st.integers(0, 400)),
    st.tuples(st.just("shuffle"), st.integers(0, 2**32 - 1), st.integers(1, 200)),
    st.tuples(st.just("interleave"), st.integers(1, 4), st.booleans(), st.integers(0, 99)),
)


def _chain(steps: list[tuple], shards: int) -> datasets.IterableDataset:
    ds = _table("s", 300, shards)
    for k, step in enumerate(steps):
        if step[0] == "take":
            ds = ds.take(step[1])
        elif step[0] == "skip":
            ds = ds.skip(step[1])
        elif step[0] == "shuffle":
            ds = ds.shuffle(seed=step[1], buffer_size=step[2])
        else:
            other = _table(f"i{k}", 37 * step[1], step[1])
            chances = [0.5, 0.5] if step[2] else None
            ds = datasets.interleave_datasets([ds, other], probabilities=chances, seed=step[3])
    return ds


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(_STEP, min_size=0, max_size=4), shards=st.integers(1, 4))
def test_random_take_skip_shuffle_interleave_chains_are_written_as_they_yield(
    tmp_path_factory, steps, shards
):
    ds = _chain(steps, shards)
    out = tmp_path_factory.mktemp("chain") / "out"
    expected = yielded_texts(ds)
    write(ds, out)
    assert written_texts(out) == expected
    assert hf.reads_as_shards(ds) == (not steps)


# -- kill and resume -------------------------------------------------------------------------------


def test_a_killed_run_of_a_transformed_iterable_resumes_to_the_same_bytes(
    tmp_path, base, monkeypatch
):
    """Two inputs: an untransformed iterable (3 shard pieces) and a shuffled, filtered one (one
    piece read through its iteration). A kill in the second piece, then the same job in the same
    output: the finished pieces are reused and the bytes equal an uninterrupted run's."""

    def inputs():
        chained = _table("c", 2000, 4).shuffle(seed=9, buffer_size=300)
        return (_table("a", ROWS, 3), chained.filter(lambda row: row["n"] % 3 != 0).take(900))

    def run(out):
        config = PreprocessConfig(
            inputs=inputs(),
            output_prefix=str(out),
            tokenizer=TokenizerSpec(kind="byte"),
            workers=1,
            chunk_bytes=4096,
        )
        return preprocess(config, progress=False)

    clean = run(tmp_path / "clean")
    original = hf.Shard.tables

    def killed(self, *args):
        for n, chunk in enumerate(original(self, *args)):
            if self.count == 0 and n == 3:
                raise KeyboardInterrupt  # as a kill would stop it, within the iterated piece
            yield chunk

    monkeypatch.setattr(hf.Shard, "tables", killed)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "out")
    monkeypatch.setattr(hf.Shard, "tables", original)
    resumed = run(tmp_path / "out")
    assert resumed.files == clean.files == 4 and 1 <= resumed.files_resumed <= 3
    for ext in (".bin", ".idx"):
        clean_bytes = Path(f"{tmp_path}/clean_text_document{ext}").read_bytes()
        assert Path(f"{tmp_path}/out_text_document{ext}").read_bytes() == clean_bytes
    a, c = inputs()
    assert written_texts(tmp_path / "out") == yielded_texts(a) + yielded_texts(c)
