"""nanoGPT-style training windows over a flat token file, shuffled without an index.

Sample k of the global order is the window of ``block_size + 1`` tokens starting at token
``p_e(k mod n) * block_size`` where ``n = (num_tokens - 1) // block_size`` non-overlapping windows
fit in the file, ``e = k // n`` is the epoch and ``p_e`` a keyed permutation (``index.permutation``)
chosen by (seed, e). Nothing of size n is ever built, so a 16 GB OpenWebText file (8 billion
tokens) starts instantly on every rank; sharding is the sampler's job, not a DistributedSampler's.
The file opens lazily in each process that reads, so DataLoader workers never share a mapping.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt

from ..arrays import distinct, sample_indices
from ..contract import Allocator, MixtureCursors, SourceInfo, Sources
from ..errors import ConfigError
from ..fielddocs import FieldDocs, documented
from ..format import FlatTokenFile, ReadMode
from ..format.flat_file import content_fingerprint
from ..index.permutation import KeyedPermutation


@documented
@dataclass(frozen=True, kw_only=True)
class FlatDatasetConfig(metaclass=FieldDocs):
    """How windows are cut from a flat token file and ordered."""

    block_size: int
    """Tokens per training input; each window reads ``block_size + 1`` (inputs plus the
    next-token labels)."""
    seed: int = 1234
    """Key of the window order; the same seed gives the same order on every rank and run."""
    shuffle: bool = True
    """Permute windows within each epoch; False reads them in file order."""
    num_epochs: int = 1
    """Epochs in the global order; each epoch uses its own permutation."""
    dtype: str = "uint16"
    """Token dtype of the file (nanoGPT writes uint16)."""
    mode: str = "mmap"
    """Read mode of the file: mmap, pread or memory."""

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ConfigError(
                f"block_size is {self.block_size}, expected >= 1", hint="use e.g. block_size=1024"
            )
        if self.num_epochs < 1:
            raise ConfigError(
                f"num_epochs is {self.num_epochs}, expected >= 1", hint="use num_epochs=1 or more"
            )
        ReadMode.parse(self.mode)


class FlatTokenDataset:
    """Windows of a flat token file; ``__getitems__`` reads a whole micro-batch at once."""

    def __init__(self, path: str | os.PathLike[str], config: FlatDatasetConfig) -> None:
        self.path = os.fspath(path)
        self.config = config
        self.file = FlatTokenFile(self.path, dtype=config.dtype, mode=config.mode)
        self._fingerprint: str | None = None
        num_tokens = os.path.getsize(self.path) // np.dtype(config.dtype).itemsize
        self.windows_per_epoch = max(num_tokens - 1, 0) // config.block_size
        if self.windows_per_epoch == 0:
            raise ConfigError(
                f"the file holds {num_tokens} tokens, fewer than one window of"
                f" {config.block_size + 1}",
                path=self.path,
                hint="use a smaller block_size or a larger file",
            )

    def __len__(self) -> int:
        return self.windows_per_epoch * self.config.num_epochs

    @property
    def fingerprint(self) -> str:
        """Identity of (data, config) that resume state must match: the file's content (not its
        name or folder, so a run can move) and everything that orders or cuts the windows (not
        the read mode). Computed on first use, once per dataset object."""
        if self._fingerprint is None:
            order = sorted((k, v) for k, v in asdict(self.config).items() if k != "mode")
            payload = repr((content_fingerprint(self.path), order))
            self._fingerprint = hashlib.sha256(payload.encode()).hexdigest()[:16]
        return self._fingerprint

    def window_starts(self, indices: np.ndarray) -> np.ndarray:
        """Start token of each global sample index (vectorized)."""
        k = sample_indices(indices)
        if k.size and (int(k.min()) < 0 or int(k.max()) >= len(self)):
            raise IndexError(f"sample indices must lie in [0, {len(self)})")
        n = self.windows_per_epoch
        epochs, within = np.divmod(k, n)
        if not self.config.shuffle:
            return within * self.config.block_size
        windows = np.empty_like(within)
        for epoch in distinct(epochs).tolist():
            sel = epochs == epoch
            windows[sel] = KeyedPermutation(n, self.config.seed, epoch)(within[sel])
        return windows * self.config.block_size

    def read_batch(self, indices: npt.ArrayLike) -> dict[str, np.ndarray]:
        """The raw windows (file dtype)."""
        starts = self.window_starts(np.asarray(indices))
        span = self.config.block_size + 1
        return {
            "windows": self.file.read_spans(starts, np.full(starts.size, span)).reshape(-1, span)
        }

    def finish_batch(
        self, batch: dict[str, np.ndarray], alloc: Allocator | None = None
    ) -> dict[str, np.ndarray]:
        """tokens and labels (int64) of ``read_batch`` windows, in arrays made by ``alloc``."""
        rows = batch["windows"]
        shape, int64 = (rows.shape[0], rows.shape[1] - 1), np.dtype(np.int64)
        tokens = alloc(shape, int64) if alloc else np.empty(shape, int64)
        labels = alloc(shape, int64) if alloc else np.empty(shape, int64)
        np.copyto(tokens, rows[:, :-1])
        np.copyto(labels, rows[:, 1:])
        return {"tokens": tokens, "labels": labels}

    def __getitems__(self, indices: npt.ArrayLike) -> dict[str, np.ndarray]:
        return self.finish_batch(self.read_batch(indices))

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {k: v[0] for k, v in self.__getitems__([index]).items()}

    # -- the loader's contract (contract.LoaderDataset) ------------------------------------------
    reads_in_groups = True
    """A loader worker may read several micro-batches with one ``read_batch``."""

    @property
    def startup_phases(self) -> dict[str, float]:
        """None measured: opening the file is the whole build."""
        return {}

    def describe_sources(self) -> Sources:
        """One source named by the file's path (no sequence length: it counts blocks)."""
        return Sources(members=(SourceInfo(name=self.path, key=self.path),))

    def epoch_sizes(self) -> list[int]:
        return [self.windows_per_epoch]

    def sample_bytes(self) -> list[int | None]:
        """``(block_size + 1) x itemsize``: each window reads the labels' extra token."""
        return [(self.config.block_size + 1) * self.file.dtype.itemsize]

    def blend_index(self) -> np.ndarray | None:
        return None

    def mixture_cursors(self) -> MixtureCursors | None:
        return None
