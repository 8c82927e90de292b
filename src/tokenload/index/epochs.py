"""How many passes over a split's documents a GPT dataset needs, and whether the last is separate.

Megatron adds epochs in a ``while`` loop until ``E * tokens_per_epoch >= num_samples * S + extra``;
that is the smallest such ``E >= 1``, i.e. ``max(1, ceil(requested / tokens_per_epoch))``,
computed here in Python integers (exact for any size). Megatron's loop never ends on an empty
split; here that is a ``ConfigError``.

The "separate final epoch" rule: when the samples drawn from the last epoch are fewer than
``int(0.80 * samples_per_epoch)`` (float product, truncated), the last epoch's documents and
samples are shuffled on their own so that the partial epoch is consumed last.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenload.errors import ConfigError
from tokenload.index.document import _INT32_MAX

__all__ = [
    "SEPARATE_THRESHOLD",
    "EpochPlan",
    "num_epochs",
    "plan_epochs",
    "separate_final_epoch",
]

SEPARATE_THRESHOLD = 0.80
"""Fraction of an epoch below which Megatron shuffles the final epoch separately."""


@dataclass(frozen=True, kw_only=True)
class EpochPlan:
    """The epoch-level facts of one GPT dataset (everything before the arrays are drawn)."""

    tokens_per_epoch: int
    """Tokens in one pass over the split's sequences."""

    num_epochs: int
    """Passes over the documents (``E``); 1 when ``num_samples`` is ``None``."""

    separate_final_epoch: bool
    """Whether the last epoch's documents and samples are shuffled separately."""

    samples_sans_final_epoch: int
    """Samples in the first ``E - 1`` epochs (the shuffle boundary when separated; else 0)."""


def _check_common(tokens_per_epoch: int, sequence_length: int, extra: int) -> None:
    if tokens_per_epoch < 0:
        raise ConfigError(f"tokens_per_epoch is {tokens_per_epoch}; expected >= 0")
    if not 1 <= sequence_length <= _INT32_MAX:
        raise ConfigError(f"sequence_length is {sequence_length}; expected 1..{_INT32_MAX}")
    if extra not in (0, 1):
        raise ConfigError(f"extra token count is {extra}; expected 0 or 1")


def num_epochs(
    *, tokens_per_epoch: int, num_samples: int | None, sequence_length: int, extra: int
) -> int:
    """Return the smallest ``E >= 1`` with ``E * tokens_per_epoch >= num_samples * S + extra``.

    ``num_samples=None`` means one epoch. Raises ``ConfigError`` for an empty split that is asked
    for samples (Megatron loops forever there) and when ``E`` does not fit Megatron's int32.
    """
    _check_common(tokens_per_epoch, sequence_length, extra)
    if num_samples is None:
        return 1
    if num_samples < 0:
        raise ConfigError(f"num_samples is {num_samples}; expected >= 0 or None")
    requested = int(num_samples) * sequence_length + extra
    if tokens_per_epoch == 0:
        if requested <= 0:
            return 1
        raise ConfigError(
            f"the split holds 0 tokens but {num_samples} samples were requested; "
            "expected a split with at least one non-empty sequence",
            hint="the split fractions leave this split empty for this file: change the split "
            "string (e.g. '98,2,0' on a tiny file gives an empty valid split) or the sizes",
        )
    epochs = max(1, -(-requested // int(tokens_per_epoch)))
    if epochs > _INT32_MAX:
        raise ConfigError(
            f"{epochs} epochs are needed; expected at most {_INT32_MAX} (Megatron's int32)",
            hint="request fewer samples or use more data",
        )
    return epochs


def separate_final_epoch(
    *,
    tokens_per_epoch: int,
    num_samples: int | None,
    num_epochs: int,
    sequence_length: int,
    extra: int,
) -> tuple[bool, int]:
    """Return ``(separate, samples_sans_final_epoch)`` by Megatron's 80% rule.

    ``samples_sans_final_epoch = ((E - 1) * T - extra) // S`` is where the separated shuffle
    index splits; it is 0 when not separated.
    """
    _check_common(tokens_per_epoch, sequence_length, extra)
    if num_epochs == 1 or num_samples is None:
        return False, 0
    sans_final = ((num_epochs - 1) * tokens_per_epoch - extra) // sequence_length
    from_final = num_samples - sans_final
    per_epoch = (tokens_per_epoch - extra) // sequence_length
    if not 0 <= from_final <= per_epoch + 1:
        raise ConfigError(
            f"{num_epochs} epochs leave {from_final} samples for the final epoch; expected "
            f"0..{per_epoch + 1} (num_epochs must come from num_epochs())"
        )
    separate = from_final < int(SEPARATE_THRESHOLD * per_epoch)
    return separate, sans_final if separate else 0


def plan_epochs(
    *, tokens_per_epoch: int, num_samples: int | None, sequence_length: int, extra: int
) -> EpochPlan:
    """``num_epochs`` and ``separate_final_epoch`` together."""
    epochs = num_epochs(
        tokens_per_epoch=tokens_per_epoch,
        num_samples=num_samples,
        sequence_length=sequence_length,
        extra=extra,
    )
    separate, sans = separate_final_epoch(
        tokens_per_epoch=tokens_per_epoch,
        num_samples=num_samples,
        num_epochs=epochs,
        sequence_length=sequence_length,
        extra=extra,
    )
    return EpochPlan(
        tokens_per_epoch=int(tokens_per_epoch),
        num_epochs=epochs,
        separate_final_epoch=separate,
        samples_sans_final_epoch=sans,
    )
