"""The progress bar moves at least once a second on a slow tokenizer and counts finished files:
a byte tokenizer made slow (2.5 s per MB, sleeping, so CPU contention does not change it) stands
in for a slow native encoder, and every redraw of the real bar is recorded."""

from __future__ import annotations

import itertools
import json
import time
from typing import ClassVar

import pytest

from tokenload.preprocess import (
    ByteTokenizer,
    PreprocessConfig,
    TokenizerSpec,
    pipeline,
    preprocess,
)
from tokenload.preprocess.progress import Progress


class SlowBytes(ByteTokenizer):
    SECONDS_PER_BYTE = 2.5e-6

    def encode_batch(self, texts):
        ids, lengths = super().encode_batch(texts)
        time.sleep(ids.size * self.SECONDS_PER_BYTE)
        return ids, lengths


class RecordingProgress(Progress):
    """The real bar, with the time and state of every byte-count move kept."""

    runs: ClassVar[list[RecordingProgress]] = []

    def __init__(self, **kw):
        super().__init__(**kw)
        self.moves: list[tuple[float, int]] = [(time.perf_counter(), 0)]
        RecordingProgress.runs.append(self)

    def update(self, result):
        super().update(result)
        self.moves.append((time.perf_counter(), int(self._bar.n)))

    def close(self):
        self.moves.append((time.perf_counter(), int(self._bar.n)))
        self.final_postfix = self._bar.postfix
        super().close()


def test_the_bar_moves_every_second_and_ends_counting_the_file(tmp_path, monkeypatch):
    path = tmp_path / "in.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(20000):
            f.write(json.dumps({"text": f"{i:08d} " + "lorem ipsum dolor " * 5}) + "\n")
    size = path.stat().st_size
    assert size > 1.5e6  # about 4 s of encoding at 2.5 s/MB
    monkeypatch.setattr(pipeline, "load_tokenizer", lambda spec: SlowBytes())
    monkeypatch.setattr(pipeline, "Progress", RecordingProgress)
    RecordingProgress.runs.clear()
    config = PreprocessConfig(
        inputs=(str(path),), output_prefix=str(tmp_path / "o"), tokenizer=TokenizerSpec(kind="byte"),
        workers=2, executor="threads",
    )
    preprocess(config, progress=True)
    (bar,) = RecordingProgress.runs
    times = [t for t, _ in bar.moves]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) < 1.0, f"the bar stood still for {max(gaps):.1f} s"
    assert [n for _, n in bar.moves] == sorted(n for _, n in bar.moves)
    assert bar.moves[-1][1] == size
    assert "files 1/1" in bar.final_postfix and bar.files_done == 1


@pytest.mark.parametrize("resumed", [0, 3])
def test_counters_without_a_bar(resumed):
    progress = Progress(todo=[], enabled=False, resumed=resumed)
    assert (progress.files_done, progress.files_resumed) == (0, resumed)
    assert progress.postfix().startswith("files 0/0")
