"""A prefix that misses, or a folder given as a prefix: the error names the nearest existing
prefixes ("did you mean out/corpus_text_document?") wherever a prefix is opened: TokenFile,
info, verify and every order's datasets (``tests/cli/test_missing_prefix_cli.py``: the
commands, doctor included)."""

from __future__ import annotations

import os

import pytest

from support import write_documents
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.errors import StorageError
from tokenload.format import TokenFile, check_file, describe
from tokenload.format.prefixes import nearest_prefixes


@pytest.fixture
def out(tmp_path, monkeypatch):
    """out/ as preprocess leaves it for --output-prefix out/corpus with two json keys, plus an
    unrelated pair and an index without its .bin (no prefix); the test runs in tmp_path."""
    monkeypatch.chdir(tmp_path)
    os.mkdir("out")
    for name in ("corpus_text_document", "corpus_title_document", "zeta"):
        write_documents(f"out/{name}", [[1, 2, 3, 4, 5]] * 20)
    open("out/corpus_idx_only.idx", "wb").close()
    os.mkdir("empty")
    return "out"


def _hint(exc: pytest.ExceptionInfo) -> str:
    return exc.value.hint or ""


def test_the_nearest_prefixes_are_ranked_by_start_then_spelling(out):
    expected = ["out/corpus_text_document", "out/corpus_title_document", "out/zeta"]
    assert nearest_prefixes("out/corpus") == expected
    assert nearest_prefixes("out/corpus_titel_document")[0] == "out/corpus_title_document"
    assert nearest_prefixes("out/zet")[0] == "out/zeta"
    assert nearest_prefixes("out") == nearest_prefixes("out/") == expected  # in the folder
    assert nearest_prefixes("out/", limit=1) == ["out/corpus_text_document"]
    assert nearest_prefixes("empty/x") == [] and nearest_prefixes("nowhere/x") == []
    assert nearest_prefixes("s3://bucket/corpus") == []  # a URL is not listed


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("out/corpus", "out/corpus.idx: cannot read the index (No such file or directory)"),
        ("out/corpus.bin", "out/corpus.idx: cannot read the index (No such file or directory)"),
        ("out", "out is a folder, not a token file prefix"),
        ("out/", "out/ is a folder, not a token file prefix"),
    ],
)
def test_a_missing_prefix_or_a_folder_names_the_nearest_prefixes(out, given, message):
    for open_it in (lambda p: TokenFile(p).header, describe, check_file):
        with pytest.raises(StorageError) as info:
            open_it(given)
        assert message in str(info.value)
        assert _hint(info).startswith(
            "did you mean out/corpus_text_document? (other prefixes"
            " there: out/corpus_title_document, out/zeta)"
        )


def test_a_folder_without_token_files_says_so(out):
    with pytest.raises(StorageError) as info:
        TokenFile("empty/corpus").document(0)
    assert _hint(info).startswith("empty holds no token files (PREFIX.idx + PREFIX.bin)")


@pytest.mark.parametrize("order", ["megatron", "computed"])
@pytest.mark.parametrize("given", ["out/corpus", "out"])
def test_every_orders_datasets_name_the_nearest_prefixes(out, tmp_path, order, given):
    config = MegatronDataConfig(
        sequence_length=4,
        blend=[given],
        split="100,0,0",
        order=order,
        path_to_cache=str(tmp_path / "cache") if order == "megatron" else None,  # its caches
    )
    with pytest.raises(StorageError) as info:
        build_datasets(config, [10, 0, 0])
    assert "did you mean out/corpus_text_document?" in _hint(info)
