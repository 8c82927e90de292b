"""One GPT dataset's three indices, built exactly as Megatron's ``GPTDataset`` builds them.

The order of operations is part of the contract, because one ``RandomState(seed)`` per dataset
is consumed by them in turn: tokens per epoch -> epochs and the separate-final-epoch rule ->
document index (one or two shuffles) -> sample index (no randomness) -> shuffle index (one or
two shuffles). Every split and every prefix uses the same seed, as in Megatron.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tokenload.errors import ConfigError
from tokenload.index.document import (
    _INT32_MAX,
    as_sequence_ids,
    build_document_index,
    tokens_per_epoch,
)
from tokenload.index.epochs import EpochPlan, plan_epochs
from tokenload.index.sample import build_sample_index, sample_count
from tokenload.index.shuffle import build_shuffle_index

__all__ = [
    "GPTIndexConfig",
    "GPTIndices",
    "build_gpt_indices",
    "drop_last_for",
    "gpt_length",
    "gpt_shapes",
]


@dataclass(frozen=True, kw_only=True)
class GPTIndexConfig:
    """The settings that shape a GPT dataset's indices."""

    sequence_length: int
    """Tokens per sample, ``S`` (Megatron's ``--seq-length``)."""

    random_seed: int = 1234
    """Seed of the dataset's ``numpy.random.RandomState`` (Megatron's ``--seed``)."""

    add_extra_token: bool = True
    """Read ``S + 1`` tokens per sample so labels are the inputs shifted by one (Megatron's
    ``add_extra_token_to_sequence``; not part of Megatron's cache hash)."""

    drop_last: bool = True
    """Drop the final partial sample. Megatron drops it except on the valid split, where
    ``drop_last_partial_validation_sequence`` decides; use ``drop_last_for``."""

    def __post_init__(self) -> None:
        if isinstance(self.sequence_length, bool) or not isinstance(self.sequence_length, int):
            raise ConfigError(f"sequence_length is {self.sequence_length!r}; expected an int")
        if not 1 <= self.sequence_length <= _INT32_MAX:
            raise ConfigError(
                f"sequence_length is {self.sequence_length}; expected 1..{_INT32_MAX}"
            )
        if isinstance(self.random_seed, bool) or not isinstance(self.random_seed, int):
            raise ConfigError(f"random_seed is {self.random_seed!r}; expected an int")
        if not 0 <= self.random_seed <= 2**32 - 1:
            raise ConfigError(
                f"random_seed is {self.random_seed}; expected 0..2**32-1 (RandomState's range)",
                field="random_seed",
                hint="use the job's seed (Megatron's default is 1234)",
            )

    @property
    def extra(self) -> int:
        """1 when an extra token is read per sample, else 0."""
        return int(self.add_extra_token)


@dataclass(frozen=True, kw_only=True, eq=False)
class GPTIndices:
    """The three index arrays of one GPT dataset and the epoch facts behind them."""

    document_index: npt.NDArray[np.int32]
    """Sequence ids, every epoch shuffled (int32)."""

    sample_index: npt.NDArray[np.int32] | npt.NDArray[np.int64]
    """``(len + 1, 2)`` rows of (document-index position, token offset)."""

    shuffle_index: npt.NDArray[np.uint32] | npt.NDArray[np.int64]
    """Dataset position -> sample number."""

    epochs: EpochPlan
    """Tokens per epoch, number of epochs, separated final epoch."""

    def __len__(self) -> int:
        return int(self.sample_index.shape[0]) - 1


def drop_last_for(split: str, drop_last_partial_validation_sequence: bool = True) -> bool:
    """Megatron's drop-last rule: always on, except on ``"valid"`` where the option decides."""
    return drop_last_partial_validation_sequence if split == "valid" else True


def build_gpt_indices(
    sequence_lengths: npt.ArrayLike,
    documents: npt.ArrayLike,
    *,
    num_samples: int | None,
    config: GPTIndexConfig,
) -> GPTIndices:
    """Build the document, sample and shuffle indices of one GPT dataset.

    ``sequence_lengths``: every sequence length of the token file (int); ``documents``: the
    sequence ids of this split (Megatron's ``indexed_indices``, usually ``arange(beg, end)``);
    ``num_samples``: the requested sample count, or ``None`` for one epoch. Bit-identical to
    megatron-core's ``GPTDataset`` arrays. A split without tokens gives an empty dataset when
    ``num_samples`` is ``None`` and raises ``ConfigError`` otherwise.
    """
    lengths = np.asarray(sequence_lengths)
    docs = as_sequence_ids(documents)
    if docs.size and (int(docs.max()) >= lengths.shape[0]):
        raise ConfigError(
            f"documents refer to sequence {int(docs.max())}; expected ids below "
            f"{lengths.shape[0]} (the file's sequence count)"
        )
    extra = config.extra
    tokens = tokens_per_epoch(lengths, docs)
    # An empty split asked for samples is a ConfigError (raised by plan_epochs; Megatron loops
    # forever); without a sample count it is an empty dataset, as in Megatron.
    epochs = plan_epochs(
        tokens_per_epoch=tokens,
        num_samples=num_samples,
        sequence_length=config.sequence_length,
        extra=extra,
    )
    rng = seeded_random_state(config.random_seed)
    document_index = build_document_index(docs, epochs.num_epochs, rng, epochs.separate_final_epoch)
    sample_index = build_sample_index(
        lengths,
        document_index,
        sequence_length=config.sequence_length,
        num_epochs=epochs.num_epochs,
        tokens_per_epoch=tokens,
        drop_last=config.drop_last,
        extra=extra,
    )
    total = sample_index.shape[0] - 1
    split_at = epochs.samples_sans_final_epoch if epochs.separate_final_epoch else total
    shuffle_index = build_shuffle_index(split_at, total, rng)
    return GPTIndices(
        document_index=document_index,
        sample_index=sample_index,
        shuffle_index=shuffle_index,
        epochs=epochs,
    )


_LOCAL = threading.local()


def seeded_random_state(seed: int) -> np.random.RandomState:
    """This thread's ``RandomState``, reseeded: the state of a fresh ``RandomState(seed)``.

    A new ``RandomState(seed)`` first seeds its MT19937 from OS entropy and then reseeds it
    (~0.15-0.27 ms; 0.03-0.05 s for a blend of 100 prefixes x 2 splits); ``seed(seed)`` on a
    kept one costs ~1.3 us (measured). One per thread, because builds run in a thread pool;
    the generator must not outlive the caller's use of it.
    """
    rng = getattr(_LOCAL, "rng", None)
    if rng is None:
        rng = _LOCAL.rng = np.random.RandomState()
    rng.seed(seed)
    return rng


def gpt_length(*, tokens_per_epoch: int, num_samples: int | None, config: GPTIndexConfig) -> int:
    """The dataset length (that of the built sample index) without building anything."""
    return _len_and_epochs(tokens_per_epoch, num_samples, config)[0]


def gpt_shapes(
    *, num_documents: int, tokens_per_epoch: int, num_samples: int | None, config: GPTIndexConfig
) -> dict[str, tuple[int, ...]]:
    """The shapes of the three arrays ``build_gpt_indices`` would build, without building them:
    a cache whose arrays have other shapes was built for other data or is damaged."""
    n, epochs = _len_and_epochs(tokens_per_epoch, num_samples, config)
    return {
        "document_index": (epochs * num_documents,),
        "sample_index": (n + 1, 2),
        "shuffle_index": (n,),
    }


def _len_and_epochs(
    tokens_per_epoch: int, num_samples: int | None, config: GPTIndexConfig
) -> tuple[int, int]:
    """``(length, num_epochs)`` of a GPT dataset, from its epoch plan."""
    epochs = plan_epochs(
        tokens_per_epoch=tokens_per_epoch,
        num_samples=num_samples,
        sequence_length=config.sequence_length,
        extra=config.extra,
    )
    n = sample_count(
        epochs.num_epochs,
        epochs.tokens_per_epoch,
        config.sequence_length,
        config.drop_last,
        config.extra,
    )
    return n, epochs.num_epochs
