"""torchtitan 0.3.0: tokenload's loader as a ``BaseDataLoader`` its trainer builds and checkpoints.

Read from torchtitan 0.3.0's ``Trainer.__init__``, ``batch_generator`` and checkpointer
(``components/checkpointer/dcp.py``):

* The trainer builds ``config.dataloader.build(dp_world_size=, dp_rank=, tokenizer=,
  seq_len=, local_batch_size=, snapshot_every_n_steps=)``; ``TokenloadTitanDataLoader.Config`` is
  a ``BaseDataLoader.Config`` (keyword-only, slotted: torchtitan's ``Configurable`` checks both),
  so a config registry function sets ``config.dataloader = TokenloadTitanDataLoader.Config(
  data_path=[...])`` and the command line overrides its fields (``--dataloader.data_path``).
* Each batch is ``({"input": tokens, "positions": position_ids}, labels)``:
  ``local_batch_size`` rows of ``seq_len`` tokens and their next-token labels, int64, with
  ``IGNORE_INDEX`` (-100) where the sample's loss mask is 0 (padding, or EOD with
  ``eod_mask_loss``). The rows are Megatron's samples of ``seq_len + 1`` tokens, so
  ``labels[:, :-1] == input[:, 1:]``. ``positions`` restart at 0 at every document of the token
  files (``document_positions``, the default; the boundaries are megatron-core's
  ``inter_document_masking`` ones, from the documents' lengths): torchtitan 0.3.0 finds documents
  only where ``positions == 0`` (``get_document_mask_mod``, ``create_varlen_metadata_for_document``
  in ``models/common/attention.py``), so its flex and varlen attention mask each document, and
  RoPE sees per-document positions, as with torchtitan's own text loader. With
  ``document_positions=False`` they are ``0..seq_len-1`` on every row (one document per row),
  except with ``packing="best-fit"``, whose rows' positions restart at every document always.
* The checkpointer saves ``{"dataloader": this}`` with ``torch.distributed.checkpoint``, which
  calls ``state_dict()`` on every rank and keeps one copy of a key that several ranks save (it
  assumes replicated values), and on load asks every rank for the keys its own ``state_dict()``
  has. torchtitan's own loader saves one key per data-parallel rank (``dp_rank_{r}``) and refuses
  another ``dp_world_size``. This loader's state is global instead (samples consumed by all ranks
  together, the data's fingerprint, the blend's cursors): one key, ``"tokenload"``, the same on
  every rank, so a checkpoint saved on N ranks loads on any M whose ``local_batch_size x M``
  divides the samples consumed (always, when the global batch is unchanged). The loader's
  per-rank metrics are not in the checkpoint: ``metrics()`` counts from the resume.
* ``snapshot_every_n_steps`` is accepted and unused: the state is exact at every step.

Data: ``data_path`` is Megatron's ``--data-path`` (prefixes, or weights and prefixes), read in
Megatron's order (``order="megatron"``, caches in ``data_cache_path``) or the computed order
(``order="computed"``: no index build); ``num_samples`` samples are built for training (None: one
epoch of the training split). CPU-only notes: ``torchtitan.trainer`` itself imports ``triton``
(not on CPU), so the tests build this loader as the trainer does and checkpoint it with
torchtitan's ``CheckpointManager``, without the trainer object.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, StateError, require

if TYPE_CHECKING:
    from ..loader.report import MetricsReport

require("torchtitan", "torchtitan", "TokenloadTitanDataLoader")
from torchtitan.components.dataloader import BaseDataLoader  # noqa: E402

__all__ = ["TokenloadTitanDataLoader", "IGNORE_INDEX"]

IGNORE_INDEX = -100
"""torchtitan's ``components.loss.IGNORE_INDEX``: labels the loss skips."""
_KEY = "tokenload"


class TokenloadTitanDataLoader(BaseDataLoader):
    """Megatron-order (or computed-order) batches for torchtitan's trainer; resumable on another
    data-parallel size."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        data_path: list[str] = field(default_factory=list)
        """Megatron's --data-path: token file prefixes, or weights and prefixes (``30 a 70 b``);
        empty: ``dataset_path`` as the one prefix."""
        split: str = "100,0,0"
        """Megatron's --split; this loader serves the training split."""
        seed: int = 1234
        """Megatron's --seed (the order's shuffles)."""
        order: str = "megatron"
        """megatron (index caches, bit-identical to megatron-core) or computed (no index build)."""
        num_samples: int | None = None
        """Training samples to build (steps x global batch); None: one epoch."""
        data_cache_path: str | None = None
        """Megatron's --data-cache-path, read by order megatron (a job config names it once for
        either order: the computed order, which keeps no index cache, is built without it)."""
        eod_mask_loss: bool = False
        """Megatron's --eod-mask-loss: no loss on EOD tokens."""
        document_positions: bool = True
        """``positions`` restart at every document (the token files' document lengths), so
        torchtitan's flex/varlen attention masks documents; False: 0..seq_len-1 on every row
        (not with ``packing="best-fit"``: packed rows' positions restart at every document)."""
        packing: str = "concat"
        """How rows are made of documents (``MegatronDataConfig.packing``): ``concat``
        (Megatron's samples) or ``best-fit`` (whole documents, padded)."""
        num_workers: int = 2
        """tokenload worker processes (0 reads in the training process)."""
        prefetch_factor: int | None = None
        """Micro-batches each worker makes ahead (None: 4)."""
        pin_memory: bool = False
        """Pin batches in page-locked memory."""
        kind: str = "single"
        """Megatron's sampler: single (resumes on any data-parallel size) or cyclic."""

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        seq_len: int,
        local_batch_size: int,
        tokenizer: Any = None,
        snapshot_every_n_steps: int | None = None,
        token_dataset: Any = None,
        **_: Any,
    ) -> None:
        """The arguments torchtitan's trainer passes to ``config.dataloader.build``;
        ``token_dataset`` (a tokenload dataset built elsewhere) replaces the one ``config``
        describes."""
        from ..loader import build_dataloader

        self.config = config
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        self.seq_len = seq_len
        self.dataset = (
            token_dataset
            if token_dataset is not None
            else _build_dataset(config, seq_len, tokenizer)
        )
        self.loader = build_dataloader(
            self.dataset,
            micro_batch_size=local_batch_size,
            dp_rank=dp_rank,
            dp_size=dp_world_size,
            kind=config.kind,
            num_workers=config.num_workers,
            prefetch_factor=config.prefetch_factor,
            pin_memory=config.pin_memory,
        )

    def __iter__(self) -> Iterator[tuple[dict[str, Any], Any]]:
        for batch in self.loader:
            if batch["tokens"].shape[-1] != self.seq_len:
                raise ConfigError(
                    f"the dataset's samples hold {batch['tokens'].shape[-1]} input tokens,"
                    f" expected training.seq_len = {self.seq_len}",
                    hint="build the dataset with sequence_length=training.seq_len, or set"
                    " training.seq_len to the dataset's",
                )
            yield _titan_batch(batch)

    def __len__(self) -> int:
        return len(self.loader)

    def metrics(self) -> MetricsReport:
        """The loader's metrics (``TokenloadDataLoader.metrics``), counted since this process
        built or resumed it."""
        return self.loader.metrics()

    def state_dict(self) -> dict[str, Any]:
        """One key, identical on every rank (see the module doc)."""
        state = {k: v for k, v in self.loader.state_dict().items() if k != "metrics"}
        return {_KEY: json.dumps(state, sort_keys=True)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:  # torchtitan passes an empty state when nothing was saved
            return
        if _KEY not in state_dict:
            found = ", ".join(sorted(map(str, state_dict))) or "nothing"
            raise StateError(
                f"the checkpoint's dataloader state has no {_KEY!r} entry (found {found})",
                hint="it was saved by another dataloader (torchtitan's own saves dp_rank_N keys):"
                " resume with the loader that saved it, or leave 'dataloader' out of loading"
                " (checkpoint.exclude_from_loading) to start the data order from scratch",
            )
        try:
            state = json.loads(state_dict[_KEY])
        except (TypeError, ValueError) as exc:
            raise StateError(
                f"the checkpoint's tokenload state is not the JSON this loader saves ({exc})",
                hint="pass the state saved by TokenloadTitanDataLoader.state_dict(), unchanged",
            ) from None
        self.loader.load_state_dict(state)

    def close(self) -> None:
        """Stop the worker processes now."""
        self.loader.close()


def _titan_batch(batch: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """tokenload's batch (tokens, labels, loss_mask, position_ids, ...) as torchtitan's
    (input_dict, labels)."""
    tokens, labels = batch["tokens"], batch["labels"]
    mask = batch.get("loss_mask")
    if mask is not None and not bool(mask.all()):
        labels = labels.masked_fill(mask == 0, IGNORE_INDEX)
    inputs = {"input": tokens.long()}
    if "position_ids" in batch:  # a map-style dataset passed as token_dataset may have none
        inputs["positions"] = batch["position_ids"].long()
    return inputs, labels.long()


def _build_dataset(config: Any, seq_len: int, tokenizer: Any) -> Any:
    from ..datasets import MegatronDataConfig, build_datasets
    from ..datasets.config import fields_for_order

    blend = list(config.data_path) or ([config.dataset_path] if config.dataset_path else [])
    if not blend:
        raise ConfigError(
            "no data: the tokenload dataloader config has no data_path",
            hint="set dataloader.data_path (Megatron's --data-path: prefixes, or weights and"
            " prefixes), e.g. --dataloader.data_path /data/corpus_text_document",
        )
    eod = getattr(tokenizer, "eos_id", None)
    fields: dict[str, Any] = dict(
        sequence_length=seq_len,
        random_seed=config.seed,
        blend=blend,
        split=config.split,
        path_to_cache=config.data_cache_path,
        order=config.order,
        eod_mask_loss=config.eod_mask_loss,
        eod_id=eod if isinstance(eod, int) else None,
        inter_document_masking=config.document_positions,
        packing=config.packing,
    )
    data_config = MegatronDataConfig(**fields_for_order(fields))
    train, _, _ = build_datasets(data_config, [config.num_samples, 0, 0])
    if train is None:
        raise ConfigError(
            f"split {config.split!r} gives the training split no data",
            hint="give the first --split weight a positive value, e.g. dataloader.split '100,0,0'",
        )
    return train
