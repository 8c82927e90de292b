"""Per-source signals for a training loop that steers its data mixture (``loader.set_weights``).

Every micro-batch of a blend carries ``dataset_id``: the source (0-based member of the blend) of
each row. ``per_source_loss`` turns a loss per row into a sum and a count per source, NumPy or
torch alike (a torch tensor stays on its device, so the loop can all-reduce both before it takes
the means: a mean of the ranks' means would weigh a rank's few rows of a source like its many).

``ODMExp3`` is one controller: the Exp3 rule of Online Data Mixing (Albalak, Pan, Raffel and
Wang, "Efficient Online Data Mixing For Language Model Pre-Training", 2023, arXiv:2312.02406).
Each source is an arm of a multi-armed bandit whose reward is its training loss (a source the
model has not learned yet pays more); the weights are an exploration floor plus a softmax of the
importance-weighted, exponentially averaged rewards. The loop calls ``update`` with the per-source
losses of each step and hands the weights it returns to ``loader.set_weights`` on every rank.

NumPy only (torch tensors are used through their own methods): importing it loads no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .errors import ConfigError

__all__ = ["ODMExp3", "SourceLosses", "per_source_loss"]


class SourceLosses(NamedTuple):
    """Per source of the blend: the sum of its rows' losses and its number of rows (NumPy
    arrays, or torch tensors on the loss's device). Sum both over ranks, then take ``mean``."""

    sum: Any
    count: Any

    @property
    def mean(self) -> Any:
        """The mean loss per source (NaN for a source without rows)."""
        if isinstance(self.sum, np.ndarray):
            with np.errstate(invalid="ignore", divide="ignore"):
                return self.sum / self.count
        return self.sum / self.count.to(self.sum.dtype)  # torch: 0/0 is NaN


def per_source_loss(loss_per_row: Any, dataset_id: Any, num_sources: int) -> SourceLosses:
    """The sum and count of ``loss_per_row`` (one loss per row of the micro-batch, e.g. the mean
    over its tokens) per source, from the batch's ``dataset_id``; ``num_sources``: the blend's
    sources (``len(loader.set_weights``'s weights)). NumPy arrays in, NumPy out; torch tensors in,
    torch tensors out, on the loss's device (no host copy; detach the loss first unless the
    gradient should flow)."""
    if isinstance(num_sources, bool) or not isinstance(num_sources, int) or num_sources < 1:
        raise ConfigError(
            f"num_sources is {num_sources!r}; expected the blend's number of sources (>= 1)",
            hint="pass len(weights) of the blend",
        )
    shape, ids_shape = tuple(loss_per_row.shape), tuple(dataset_id.shape)
    if len(shape) != 1 or shape != ids_shape:
        raise ConfigError(
            f"loss_per_row has shape {shape}, dataset_id {ids_shape}; expected one loss per row",
            hint="reduce the per-token loss over each row first (e.g. (loss * mask).sum(1) /"
            " mask.sum(1)), and pass batch['dataset_id']",
        )
    if isinstance(loss_per_row, np.ndarray):
        ids = np.asarray(dataset_id, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= num_sources):
            raise ConfigError(
                f"dataset_id holds {int(ids.min())}..{int(ids.max())}; the blend has"
                f" {num_sources} sources",
                hint="pass the blend's number of sources",
            )
        loss = np.asarray(loss_per_row, dtype=np.float64)
        return SourceLosses(
            np.bincount(ids, weights=loss, minlength=num_sources),
            np.bincount(ids, minlength=num_sources),
        )
    ids = dataset_id.to(device=loss_per_row.device).long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_sources):
        raise ConfigError(
            f"dataset_id holds {int(ids.min())}..{int(ids.max())}; the blend has {num_sources}"
            " sources",
            hint="pass the blend's number of sources",
        )
    total = loss_per_row.new_zeros(num_sources).index_add_(0, ids, loss_per_row)
    return SourceLosses(total, ids.bincount(minlength=num_sources))


class ODMExp3:
    """Online Data Mixing's Exp3 rule (module docstring), one ``update`` per training step.

    With K sources, at step t: ``eps_t = min(1/K, sqrt(ln K / (K t)))`` and the weights are
    ``pi_i = (1 - K eps_t) * softmax(eps_{t-1} R)_i + eps_t``; after the step each source i
    that had rows updates its reward ``R_i <- alpha R_i + (1 - alpha) L_i / pi_i`` with its
    mean loss ``L_i`` (ODM draws one source per batch; a mixed batch updates every source it
    holds, each importance-weighted by the weight it was drawn with). ``alpha``: the reward's
    smoothing (ODM: 0.9)."""

    def __init__(self, num_sources: int, *, alpha: float = 0.9) -> None:
        if isinstance(num_sources, bool) or not isinstance(num_sources, int) or num_sources < 2:
            raise ConfigError(
                f"num_sources is {num_sources!r}; expected 2 or more (a mixture to steer)",
                hint="pass the blend's number of sources",
            )
        if not 0 <= alpha < 1:
            raise ConfigError(f"alpha is {alpha!r}; expected 0 <= alpha < 1", hint="use 0.9")
        self.k = num_sources
        self.alpha = float(alpha)
        self.rewards = np.zeros(num_sources)
        self.step = 0
        self.weights = np.full(num_sources, 1.0 / num_sources)
        """The weights in force: uniform before the first update."""

    def _epsilon(self, t: int) -> float:
        return min(1.0 / self.k, math.sqrt(math.log(self.k) / (self.k * t)))

    def update(self, losses: Sequence[float] | np.ndarray) -> list[float]:
        """Take the step's mean loss per source (NaN or None for a source without rows: its
        reward is kept) and return the next step's weights (for ``loader.set_weights``)."""
        mean = np.array([np.nan if x is None else float(x) for x in losses], dtype=np.float64)
        if mean.shape != (self.k,):
            raise ConfigError(
                f"{mean.size} losses for {self.k} sources", hint="pass one loss per source"
            )
        seen = ~np.isnan(mean)
        r = self.rewards
        r[seen] = self.alpha * r[seen] + (1 - self.alpha) * mean[seen] / self.weights[seen]
        self.step += 1
        scaled = self._epsilon(self.step) * r  # eps_{t-1} of the next step t + 1
        soft = np.exp(scaled - scaled.max())
        eps = self._epsilon(self.step + 1)
        self.weights = (1 - self.k * eps) * soft / soft.sum() + eps
        weights: list[float] = self.weights.tolist()
        return weights
