"""The one interface of preprocess's executors.

An executor (``pool.LocalExecutor``: threads or processes on this machine; ``cluster.RayExecutor``:
tasks on a Ray cluster) takes the input files a run still has to do and leaves each one
finished in the work folder, its ``.done`` marker written last: the local one with the file's
tokens appended to the outputs it writes once and its index beside the marker, Ray's with the
file's parts published (see ``workdir``). It returns a ``FileSummary`` per file (``summaries``),
the content of that marker, from which ``pipeline`` and ``outputs`` publish the final token
files (Ray's: the parts concatenated).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .inputs import InputFile
    from .progress import Progress
    from .summaries import FileSummary
    from .workdir import WorkFolder


class Executor(ABC):
    """Encodes input files and marks each finished in the work folder (see the module
    docstring)."""

    @abstractmethod
    def run(
        self, work: WorkFolder, todo: Sequence[tuple[int, InputFile]], bar: Progress
    ) -> dict[int, FileSummary]:
        """Encode the files ``todo`` (input number, file) into ``work``, counting on ``bar``;
        returns each file's summary by its number. On an error, the files finished before it
        stay finished in ``work`` (a rerun reuses them) and the error is raised."""
