"""Progress of a preprocess run: a tqdm bar over input bytes with documents/s and tokens/s.

The bar is shown on a terminal only (or when asked); counters are kept either way, since the
run's result reports them.
"""

from __future__ import annotations

import time

from .encode import Encoded
from .inputs import InputFile


class Progress:
    """Counts encoded documents, tokens and input bytes; drives an optional bar."""

    def __init__(self, *, todo: list[InputFile], enabled: bool | None, resumed: int = 0) -> None:
        self.documents = self.tokens = self.input_bytes = self.files_done = 0
        self.files_todo = len(todo)
        self.files_resumed = resumed
        self._start = time.perf_counter()
        self._live = (0, 0, 0)
        self._bar = None
        if enabled is False or not todo:
            return
        from tqdm import tqdm

        sized = all(  # parquet/arrow/dataset chunks count decoded column bytes, not file bytes
            f.compression is None and f.size is not None and f.format in ("jsonl", "text", "lines")
            for f in todo
        )
        self._bar = tqdm(
            total=sum(f.size or 0 for f in todo) if sized else None,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc="preprocess",
            disable=None if enabled is None else False,
            mininterval=0.5,
            dynamic_ncols=True,
        )

    def update(self, result: Encoded) -> None:
        """Count one chunk's result and move the bar."""
        tokens = sum(int(t.size) for t, _, _ in result.outputs)
        self.add(documents=result.documents, tokens=tokens, input_bytes=result.input_bytes)

    def add(self, *, documents: int, tokens: int, input_bytes: int) -> None:
        """Count finished work (a chunk, or a Ray task's part) and move the bar."""
        self.documents += documents
        self.tokens += tokens
        self.input_bytes += input_bytes
        self._live = (0, 0, 0)
        self._show()

    def live(self, input_bytes: int, tokens: int, documents: int) -> None:
        """Show, on top of the finished work, what tasks under way have done so far (they report
        as they go; it is shown, never added: a task's result brings its final counts)."""
        self._live = (documents, tokens, input_bytes)
        self._show()

    def _show(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(self.postfix(), refresh=False)
            self._bar.n = self.input_bytes + self._live[2]
            self._bar.update(0)  # redraws at most every mininterval

    def file_done(self) -> None:
        """Count a finished input file (shown at once: the count changes rarely)."""
        self.files_done += 1
        self.tick()

    def tick(self) -> None:
        """Redraw (elapsed time, rates) while a result is awaited; called about twice a second."""
        if self._bar is not None:
            self._bar.set_postfix_str(self.postfix(), refresh=False)
            self._bar.refresh()

    def postfix(self) -> str:
        """The bar's text after the byte count: files finished, documents/s, tokens/s."""
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        documents, tokens = self.documents + self._live[0], self.tokens + self._live[1]
        return (
            f"files {self.files_done}/{self.files_todo}  {documents / elapsed:,.0f} docs/s"
            f"  {tokens / elapsed / 1e6:,.2f}M tok/s"
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(self.postfix(), refresh=False)
            self._bar.close()
