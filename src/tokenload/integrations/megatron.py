"""Megatron-LM's ``pretrain()`` fed by tokenload's loader (``--dataloader-type external``).

``train_valid_test_datasets_provider`` replaces the provider of ``pretrain_gpt.py``. Megatron
calls it on every rank (``is_distributed``) after restoring its checkpoint; it reads Megatron's
own ``args`` and tokenizer and returns three iterators of micro-batches that Megatron passes
through untouched (read from megatron-core 0.19.2's ``megatron/training``):

* ``build_pretraining_data_loader`` returns an external "dataset" as it is, and
  ``build_train_valid_test_data_iterators`` wraps it in a ``RerunDataIterator``, which calls
  ``next()`` on it: so each object returned here is an iterator (``__next__``).
* The data: ``--data-path`` (weights and prefixes), ``--data-args-path``, the per-split paths or
  ``--per-split-data-args-path``, ``--split``, ``--seq-length``, ``--seed``, ``--data-cache-path``
  (Megatron's cache names, so either tool loads the other's caches), ``--mock-data``, the EOD,
  position and mask flags, ``--no-mmap-bin-files``, ``--dataloader-fast-cache-load`` and
  ``--per-dataset-sequences-path``; the tokenizer's identity, EOD, pad and vocabulary come from
  Megatron's tokenizer (``get_tokenizer()``), as ``pretrain_gpt.py``'s come from it.
* The samples per split are the ones Megatron passes in (its own arithmetic); the train loader
  starts at ``args.consumed_train_samples``, the valid loader at ``args.consumed_valid_samples``
  (both restored from the checkpoint by ``load_checkpoint`` before the provider runs), the test
  loader at 0, as Megatron's own loaders do. Megatron's default ("single") order is a function of
  the global sample index alone, so a resume on another data-parallel size is exact.
* The sampler meaning: ``--dataloader-type`` must be ``external`` for Megatron to pass the loaders
  through, so the order is chosen by ``--tokenload-dataloader-type single|cyclic`` (added by
  ``add_arguments``, Megatron's ``extra_args_provider``; default ``single``). ``cyclic`` is
  Megatron's random sampler (``--no-data-sharding`` honoured) and repeats its epochs forever.
* Micro-batches are ``micro_batch_size`` samples (``eval_micro_batch_size`` for valid and test)
  for this data-parallel rank (``mpu.get_data_parallel_rank()``/``..._world_size()``), with
  ``--num-workers`` worker processes, pinned memory. They hold the fields ``pretrain_gpt.py``'s
  ``get_batch`` reads: ``tokens``, ``labels``, ``loss_mask``, ``position_ids``, plus
  ``attention_mask`` unless ``--no-create-attention-mask-in-dataloader``, ``cu_seqlens`` and
  ``max_seqlen`` with ``--dataloader-inter-document-masking`` (the documents' boundaries, from
  their lengths as megatron-core's ``GPTDataset`` takes them, padded to ``seq_length + 1``
  entries: the layout its ``get_batch`` broadcasts and merges for the THD path), and
  ``dataset_id`` for a blend.
* Ranks that hold no data in Megatron (tensor-parallel rank > 0, middle pipeline stages without
  multi-token-prediction layers: they receive the batch by broadcast) get ``None``, as
  ``pretrain_gpt.py``'s provider gives them; with ``--dataloader-inter-document-masking`` the
  middle stages get loaders too (their ``get_batch`` reads ``cu_seqlens`` from the iterator).

Metrics: the train iterator writes the loader's ``metrics()`` (data wait share and mean, samples
and tokens per second, per-source samples and tokens, epochs, worker restarts) to Megatron's
TensorBoard writer and W&B writer, when it holds them (Megatron makes them on the last rank only),
every ``--tensorboard-log-interval`` iterations, under ``tokenload/...``, at Megatron's
iteration: ``consumed_samples // global_batch_size``, or under a ``--step-batch-size-schedule``
the steps whose batches add up to ``consumed_samples``.

Not supported, and refused with a ``ConfigError`` naming the flag: ``--sft``, ``--fim-data``,
``--full-validation``, ``--multiple-validation-sets``, ``--hybrid-context-parallel`` and
``--phase-transition-iterations``. Importing this module imports no Megatron code; the provider
imports ``megatron.training`` when Megatron calls it.
"""

from __future__ import annotations

import argparse
import logging
import math
import numbers
from collections.abc import Callable, Iterator
from typing import Any

from ..datasets import MegatronDataConfig, build_datasets
from ..datasets.config import fields_for_order
from ..errors import ConfigError
from ..loader import TokenloadDataLoader, build_dataloader
from ..loader.report import MetricsReport
from ..megatron_args import (
    LEGACY_SPLIT,
    StepBatchSchedule,
    blends_of,
    fast_load,
    tokenload_flags,
)

__all__ = [
    "MegatronLoader",
    "add_arguments",
    "data_config_from_args",
    "loaders_from_args",
    "metric_scalars",
    "train_valid_test_datasets_provider",
]

logger = logging.getLogger(__name__)

_UNSUPPORTED = (
    ("sft", "--sft"),
    ("fim_data", "--fim-data"),
    ("full_validation", "--full-validation"),
    ("multiple_validation_sets", "--multiple-validation-sets"),
    ("hybrid_context_parallel", "--hybrid-context-parallel"),
    ("phase_transition_iterations", "--phase-transition-iterations"),
)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Megatron's ``extra_args_provider``: adds ``--tokenload-dataloader-type single|cyclic`` and
    ``--tokenload-packing concat|best-fit`` (``megatron_args.tokenload_flags``)."""
    tokenload_flags(parser.add_argument_group("tokenload"))
    return parser


def data_config_from_args(
    args: argparse.Namespace, tokenizer: Any = None, **overrides: Any
) -> MegatronDataConfig:
    """The ``MegatronDataConfig`` of Megatron's parsed ``args`` (what ``pretrain_gpt.py``'s
    ``core_gpt_dataset_config_from_args`` builds). ``tokenizer``: Megatron's tokenizer object
    (its ``unique_identifiers``, ``eod``, ``pad``, ``vocab_size``); ``overrides``: further
    ``MegatronDataConfig`` fields (e.g. ``build_policy``, ``order``)."""
    for name, flag in _UNSUPPORTED:
        if getattr(args, name, None):
            raise ConfigError(
                f"{flag} is set; tokenload's Megatron provider serves GPT pretraining data only",
                hint=f"drop {flag}, or use pretrain_gpt.py's own provider for it",
            )
    fields: dict[str, Any] = {
        "sequence_length": args.seq_length,
        "random_seed": args.seed,
        "path_to_cache": getattr(args, "data_cache_path", None),
        "eod_mask_loss": bool(getattr(args, "eod_mask_loss", False)),
        "reset_position_ids": bool(getattr(args, "reset_position_ids", False)),
        "reset_attention_mask": bool(getattr(args, "reset_attention_mask", False)),
        "create_attention_mask": bool(getattr(args, "create_attention_mask_in_dataloader", True)),
        "inter_document_masking": bool(getattr(args, "dataloader_inter_document_masking", False)),
        "mid_level_dataset_surplus": getattr(args, "mid_level_dataset_surplus", 0.005),
        "packing": getattr(args, "tokenload_packing", None) or "concat",
    }
    if getattr(args, "mock_data", False):
        fields["split"] = args.split or LEGACY_SPLIT
    else:
        blend, per_split = blends_of(args)
        fields.update(blend=blend, blend_per_split=per_split)
        if blend is not None:
            fields["split"] = args.split or LEGACY_SPLIT
    if not getattr(args, "mmap_bin_files", True):
        fields["read_mode"] = "pread"
    if fast_load(args):  # checked as megatron-core and the importer check it
        fields["build_policy"] = "none"
    if getattr(args, "per_dataset_sequences_path", None) is not None:
        fields["sequences_path"] = args.per_dataset_sequences_path
    fields.update(_tokenizer_fields(tokenizer))
    # the job's flags fill the Megatron order's fields too (its cache folder, tokenizer identity):
    # not read under another order; an override the order does not read is still a ConfigError
    fields = fields_for_order({**fields, "order": overrides.get("order", "megatron")})
    fields.update(overrides)
    return MegatronDataConfig(**fields)


def _tokenizer_fields(tokenizer: Any) -> dict[str, Any]:
    """Identity (cache names), EOD, pad and vocabulary of Megatron's tokenizer object."""
    if tokenizer is None:
        return {}
    out: dict[str, Any] = {}
    identity = getattr(tokenizer, "unique_identifiers", None)
    if identity is not None:
        out["tokenizer"] = dict(identity)
    for name, attr in (("eod_id", "eod"), ("vocab_size", "vocab_size")):
        value = _integer(_attr(tokenizer, attr))
        if value is not None:
            out[name] = value
    pad = _integer(_attr(tokenizer, "pad"))  # Megatron uses -1 when the tokenizer has none
    out["pad_id"] = -1 if pad is None else pad
    return out


def _integer(value: Any) -> int | None:
    """A tokenizer's id as an int, NumPy's included (a tokenizer may hold np.int64 ids, which
    were dropped as no id: a red-team finding); None for none or anything else."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def _attr(obj: Any, name: str) -> Any:
    try:  # Megatron's tokenizers raise (NotImplementedError, AttributeError) for a missing id
        return getattr(obj, name)
    except Exception:
        return None


def loaders_from_args(
    args: argparse.Namespace,
    sizes: list[int | None],
    *,
    tokenizer: Any = None,
    dp_rank: int,
    dp_size: int,
    kind: str | None = None,
    writers: Callable[[], tuple[Any, Any]] | None = None,
    config_overrides: dict[str, Any] | None = None,
    **loader_options: Any,
) -> tuple[MegatronLoader | None, MegatronLoader | None, MegatronLoader | None]:
    """Train, valid and test iterators for Megatron's ``args`` and ``sizes`` on one data-parallel
    rank: the provider's work, without Megatron's globals (``dp_rank``/``dp_size`` given here).
    ``kind`` defaults to ``args.tokenload_dataloader_type`` (else ``"single"``); ``writers``
    returns Megatron's (TensorBoard, W&B) writers for the train metrics; ``loader_options`` are
    further ``LoaderConfig`` fields."""
    kind = kind or getattr(args, "tokenload_dataloader_type", None) or "single"
    config = data_config_from_args(args, tokenizer, **(config_overrides or {}))
    datasets = build_datasets(config, sizes)
    options: dict[str, Any] = {
        "kind": kind,
        "dp_rank": dp_rank,
        "dp_size": dp_size,
        "num_workers": args.num_workers,
        "data_sharding": bool(getattr(args, "data_sharding", True)),
        "pin_memory": True,
        **loader_options,
    }
    eval_mbs = getattr(args, "eval_micro_batch_size", None) or args.micro_batch_size
    # Megatron's build_train_valid_test_data_loaders: --skip-train evaluates from sample 0
    valid_start = 0 if getattr(args, "skip_train", False) else args.consumed_valid_samples
    starts = (args.consumed_train_samples, valid_start, 0)
    out: list[MegatronLoader | None] = []
    for split, (dataset, start) in enumerate(zip(datasets, starts)):
        if dataset is None or (split and not len(dataset)):
            # an evaluation split asked for no sample (--eval-iters 0): no loader, so Megatron
            # runs no evaluation (its own sampler asserts "no sample to consume" there)
            out.append(None)
            continue
        mbs = args.micro_batch_size if split == 0 else eval_mbs
        loader = build_dataloader(dataset, consumed_samples=start, micro_batch_size=mbs, **options)
        out.append(
            MegatronLoader(
                loader,
                cyclic=kind == "cyclic",
                writers=writers if split == 0 else None,
                global_batch_size=args.global_batch_size,
                log_interval=getattr(args, "tensorboard_log_interval", None) or 1,
                schedule=_batch_schedule(args),
            )
        )
    return out[0], out[1], out[2]


def _batch_schedule(args: argparse.Namespace) -> StepBatchSchedule | None:
    """The job's ``--step-batch-size-schedule``, parsed as megatron.training parses it (with
    ``--seq-length``): its global batch then changes with the samples consumed (Megatron's
    ``args.global_batch_size`` is micro x data-parallel size)."""
    text = getattr(args, "step_batch_size_schedule", None)
    return None if text is None else StepBatchSchedule.parse(text, args.seq_length)


class MegatronLoader:
    """A ``TokenloadDataLoader`` as the iterator Megatron's training loop calls ``next()`` on.

    The single order ends with ``StopIteration`` when the dataset is used up (as Megatron's own
    loader); the cyclic order continues with its next epoch, for ever (Megatron's
    ``cyclic_iter``). ``loader`` is the tokenload loader (``state_dict()``, ``metrics()``)."""

    def __init__(
        self,
        loader: TokenloadDataLoader,
        *,
        cyclic: bool = False,
        writers: Callable[[], tuple[Any, Any]] | None = None,
        global_batch_size: int | None = None,
        log_interval: int = 1,
        schedule: StepBatchSchedule | None = None,
    ) -> None:
        self.loader = loader
        self._schedule = schedule  # a --step-batch-size-schedule: each step's batch
        self.cyclic = cyclic
        self._writers = writers
        self._gbs = global_batch_size
        self._interval = max(1, int(log_interval))
        self._batches: Iterator[dict[str, Any]] | None = None

    def __iter__(self) -> MegatronLoader:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._batches is None:
            self._batches = iter(self.loader)
        try:
            batch = next(self._batches)
        except StopIteration:
            self._batches = None
            if not self.cyclic:
                raise
            self._batches = iter(self.loader)  # the cyclic order's next epoch
            batch = next(self._batches)
        if self._writers is not None and (self._gbs or self._schedule is not None):
            step = self._step_done(self.loader.consumed_samples)
            if step is not None and step % self._interval == 0:
                self.write_metrics(step)
        return batch

    def _step_done(self, consumed: int) -> int | None:
        """Megatron's iteration when ``consumed`` samples end one, else None."""
        if self._schedule is not None:
            return self._schedule.step_ending_at(consumed)
        assert self._gbs
        return consumed // self._gbs if consumed % self._gbs == 0 else None

    def write_metrics(self, step: int) -> None:
        """Write ``metric_scalars`` to the writers Megatron holds on this rank (if any)."""
        tensorboard, wandb = self._writers() if self._writers is not None else (None, None)
        if tensorboard is None and wandb is None:
            return
        scalars = metric_scalars(self.loader.metrics())
        if tensorboard is not None:
            for tag, value in scalars.items():
                tensorboard.add_scalar(tag, value, step)
        if wandb is not None:
            wandb.log(scalars, step)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._batches = None
        self.loader.load_state_dict(state)

    def close(self) -> None:
        """Stop the worker processes (they also stop when the loader is collected)."""
        self._batches = None
        self.loader.close()


def metric_scalars(m: MetricsReport, prefix: str = "tokenload/") -> dict[str, float]:
    """The loader's ``metrics()`` as flat scalars for a training logger (finite numbers only)."""
    wait = m.get("data_wait", {})
    active = m.get("active_s") or 0.0
    out: dict[str, Any] = {
        "consumed-samples": m.get("consumed_samples"),
        "epoch": m.get("epoch"),
        "samples": m.get("samples"),
        "tokens": m.get("tokens"),
        "bytes-read": m.get("bytes_read"),
        "samples-per-s": m["samples"] / active if active > 0 else None,
        "tokens-per-s": m["tokens"] / active if active > 0 else None,
        "data-wait-share": wait.get("share"),
        "data-wait-mean-ms": _ms(wait.get("mean_s")),
        "data-wait-p99-ms": _ms(wait.get("p99_s")),
        "data-wait-max-ms": _ms(wait.get("max_s")),
        "repeating-sources": len(m.get("repeating", [])),
    }
    workers = m.get("workers")
    if isinstance(workers, dict):
        out["worker-restarts"] = workers.get("restarts")
    for source in m.get("sources", []):
        name = str(source.get("name", source.get("dataset_id")))
        for key in ("samples", "tokens", "epoch"):
            out[f"source/{name}/{key}"] = source.get(key)
    return {
        prefix + k: float(v)
        for k, v in out.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def _ms(seconds: Any) -> float | None:
    return None if seconds is None else seconds * 1e3


# -- Megatron's side: its globals, its ranks ------------------------------------------------------


def train_valid_test_datasets_provider(
    train_val_test_num_samples: list[int | None], vp_stage: int | None = None
) -> tuple[MegatronLoader | None, MegatronLoader | None, MegatronLoader | None]:
    """``pretrain()``'s provider: tokenload's train, valid and test iterators from Megatron's
    ``args``, tokenizer and parallel state (run with ``--dataloader-type external``)."""
    from megatron.core import parallel_state as mpu
    from megatron.training import get_args, get_tokenizer
    from megatron.training.global_vars import get_tensorboard_writer, get_wandb_writer

    args = get_args()
    if args.dataloader_type != "external":
        raise ConfigError(
            f"--dataloader-type {args.dataloader_type}: Megatron would wrap tokenload's loaders"
            " in its own sampler and DataLoader",
            hint="run with --dataloader-type external (the order is chosen by"
            " --tokenload-dataloader-type, see tokenload.integrations.megatron.add_arguments)",
        )
    if not _holds_data(args, mpu, vp_stage):
        return None, None, None
    return loaders_from_args(
        args,
        list(train_val_test_num_samples),
        tokenizer=get_tokenizer(),
        dp_rank=mpu.get_data_parallel_rank(),
        dp_size=mpu.get_data_parallel_world_size(),
        writers=lambda: (get_tensorboard_writer(), get_wandb_writer()),
    )


train_valid_test_datasets_provider.is_distributed = True  # type: ignore[attr-defined]


def _holds_data(args: Any, mpu: Any, vp_stage: int | None) -> bool:
    """pretrain_gpt.py's ``is_dataset_built_on_rank``: tensor-parallel rank 0 of the first or
    last pipeline stage, or of a stage holding multi-token-prediction layers; also of the middle
    stages with ``--dataloader-inter-document-masking``, whose ``get_batch`` reads ``cu_seqlens``
    from the iterator there too."""
    if mpu.get_tensor_model_parallel_rank() != 0:
        return False
    if getattr(args, "dataloader_inter_document_masking", False):
        return True
    from megatron.training.utils import is_first_or_last_pipeline_stage

    if is_first_or_last_pipeline_stage(vp_stage):
        return True
    if not getattr(args, "mtp_num_layers", None):
        return False
    from megatron.core.transformer.multi_token_prediction import mtp_on_this_rank
    from megatron.training.arguments import core_transformer_config_from_args

    config = core_transformer_config_from_args(args)
    return bool(
        mtp_on_this_rank(
            layout=config.pipeline_model_parallel_layout,
            mtp_num_layers=config.mtp_num_layers,
            ignore_virtual=False,
            vp_stage=vp_stage,
        )
    )
