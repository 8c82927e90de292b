"""Sizes that overflow the int32 Megatron uses are ConfigErrors with a hint, not wrapped ints."""

from __future__ import annotations

import numpy as np
import pytest

from tokenload.errors import ConfigError
from tokenload.index import GPTIndexConfig, as_sequence_ids, num_epochs


def test_sequence_ids_beyond_int32():
    with pytest.raises(ConfigError, match="int32") as info:
        as_sequence_ids(np.array([0, 2**31], dtype=np.int64))
    assert "HINT" in str(info.value)
    assert as_sequence_ids(np.array([0, 2**31 - 1], dtype=np.int64)).dtype == np.int32


def test_epoch_count_beyond_int32():
    with pytest.raises(ConfigError, match="epochs are needed") as info:
        num_epochs(tokens_per_epoch=1, num_samples=2**31, sequence_length=4, extra=1)
    assert "HINT" in str(info.value)
    assert num_epochs(tokens_per_epoch=10, num_samples=3, sequence_length=4, extra=1) == 2


def test_sequence_length_beyond_int32():
    with pytest.raises(ConfigError, match="sequence_length"):
        GPTIndexConfig(sequence_length=2**31)
