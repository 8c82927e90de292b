"""``tokenload prepare-cache --neox-config``: a GPT-NeoX job's caches. NeoX's own order builds its
indices in memory in every process (nothing to prepare); with ``--order megatron`` the Megatron
order's caches of the NeoX data are prepared, as ``imported.config(order="megatron", ...)`` builds
them. Every other prepare-cache flag is either defined by the NeoX config or does not apply to a
NeoX job, and is refused by name (``NEOX_REFUSES``) rather than ignored.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from ..errors import ConfigError
from ..megatron_args import TOKENIZER_VALUE_FLAGS
from .cache_build import (
    LAUNCHER_VARS,
    build_caches,
    check_packing_flags,
    prefixes_of,
    report_result,
)

__all__ = ["NEOX_MEGATRON_ORDER", "NEOX_REFUSES", "NEOX_TAKES", "prepare_neox"]


# -- the flags' rules ------------------------------------------------------------------
NEOX_TAKES = (
    "--neox-config",
    "--json",
    "--prepare-cache-world-size",
    "--per-dataset-sequences-path",
)
"""The flags ``--neox-config`` takes in either order: the result's form, the job's GPUs (NeoX's
``global_num_gpus``, which the config may lack) and the sequences JSON the job opens its files
with (``sequences_path=``), none of which the NeoX config gives."""

NEOX_MEGATRON_ORDER = ("--order", "--packing", "--max-documents-per-row", "--data-cache-path")
"""The flags ``--neox-config`` takes with ``--order megatron``: the overrides of
``imported.config(order="megatron", packing=..., max_documents_per_row=..., path_to_cache=...)``,
the Megatron order's own fields, which the NeoX order (built in memory, unpacked) does not read."""

_DATA = "the data (data_path and split, or train/valid/test_data_paths and their weights)"
_LENGTHS = (
    "the batch and the training length (train_batch_size or train_micro_batch_size_per_gpu,"
    " gradient_accumulation_steps, train_iters or train_epochs, eval_iters, eval_interval), from"
    " which NeoX's arithmetic gives the samples per split"
)
_PARALLEL = "the parallel sizes (pipe_parallel_size, model_parallel_size)"
_TOKENIZER = (
    "the tokenizer (tokenizer_type, vocab_file, merge_file); the caches of an imported NeoX"
    " config are named without a tokenizer identity, as imported.config(order='megatron')"
    " builds them"
)
_JOB_LINE = (
    "a flag of a Megatron training command, and no cache depends on it: with --neox-config the"
    " NeoX config is the job's"
)

#: ``--neox-config``'s refusals: the flag -> (what the NeoX config defines instead, or None;
#: why the flag does not apply, or None; what to do besides dropping the flag, or ""). Every
#: flag of prepare-cache is here, in NEOX_TAKES or in NEOX_MEGATRON_ORDER
#: (tests/cli/test_prepare_cache_neox_flags.py).
NEOX_REFUSES: dict[str, tuple[str | None, str | None, str]] = {
    **{
        flag: (
            _DATA,
            None,
            "edit the NeoX config's data keys, or give Megatron's data flags without --neox-config",
        )
        for flag in (
            "--data-path",
            "--data-args-path",
            "--train-data-path",
            "--valid-data-path",
            "--test-data-path",
            "--per-split-data-args-path",
            "--mock-data",
        )
    },
    "--split": ("split", None, "edit split in the NeoX config"),
    "--seq-length": ("seq_length", None, "edit seq_length in the NeoX config"),
    "--seed": ("seed", None, "edit seed in the NeoX config"),
    **{
        flag: (
            _LENGTHS,
            None,
            "edit those keys in the NeoX config; --prepare-cache-world-size N"
            " gives the job's GPUs where the config does not count them",
        )
        for flag in (
            "--global-batch-size",
            "--micro-batch-size",
            "--train-iters",
            "--train-samples",
            "--step-batch-size-schedule",
            "--rampup-batch-size",
            "--eval-iters",
            "--eval-interval",
            "--start-eval-at-iter",
            "--eval-global-batch-size",
            "--eval-micro-batch-size",
            "--skip-train",
            "--full-validation",
            "--train-valid-test-num-samples",
        )
    },
    **{
        flag: (
            _PARALLEL,
            None,
            "edit those keys in the NeoX config; --prepare-cache-world-size N gives the job's GPUs",
        )
        for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size")
    },
    "--context-parallel-size": (
        None,
        "GPT-NeoX has no context parallelism: its data-parallel size is the job's GPUs over"
        " pipe_parallel_size x model_parallel_size",
        "--prepare-cache-world-size N gives the job's GPUs",
    ),
    "--weights-schedule": (
        None,
        "the NeoX config's data weights blend its data for the whole run (GPT-NeoX has no"
        " weights schedule)",
        "edit the data weights in the NeoX config to change the blend",
    ),
    "--mid-level-dataset-surplus": (
        None,
        "an imported NeoX config keeps NeoX's blend surplus (0.005: its 1.005), in either order",
        "",
    ),
    "--no-add-extra-token": (
        None,
        "NeoX's samples hold seq_length + 1 tokens (its text), in either order",
        "",
    ),
    "--no-drop-last-partial-validation-sequence": (
        None,
        "the NeoX import does not read it: an imported config keeps its default, in either order",
        "",
    ),
    "--eod-mask-loss": ("eod_mask_loss", None, "edit eod_mask_loss in the NeoX config"),
    **{
        flag: (
            None,
            "Megatron's item flags: a NeoX job has none, and no cache depends on them",
            "",
        )
        for flag in (
            "--no-create-attention-mask-in-dataloader",
            "--reset-position-ids",
            "--reset-attention-mask",
        )
    },
    **{
        flag: (_TOKENIZER, None, "")
        for flag in (
            "--tokenizer-identity",
            "--tokenizer-type",
            "--vocab-size",
            "--null-tokenizer-eod-id",
            "--null-tokenizer-pad-id",
            *TOKENIZER_VALUE_FLAGS,
        )
    },
    "--num-workers": ("num_workers", None, "edit num_workers in the NeoX config"),
    **{
        flag: (None, _JOB_LINE, "")
        for flag in (
            "--dataloader-fast-cache-load",
            "--dataloader-defer-npy-index-mmap",
            "--no-mmap-bin-files",
            "--dataloader-inter-document-masking",
            "--dataloader-type",
            "--tokenload-dataloader-type",
        )
    },
    "--tokenload-packing": (
        None,
        _JOB_LINE,
        "--order megatron --packing is the packing of prepared caches",
    ),
}

_NEOX_ORDER_ONLY = (
    "NeoX's order builds its indices in memory on every rank: it reads and writes no cache and"
    " packs no rows"
)


def _neox_refusal(flag: str, megatron: bool) -> ConfigError | None:
    """The error for ``flag`` given with ``--neox-config`` (``megatron``: with ``--order
    megatron``), or None where it is taken."""
    if flag in NEOX_TAKES or (megatron and flag in NEOX_MEGATRON_ORDER):
        return None
    if flag in NEOX_MEGATRON_ORDER:
        return ConfigError(
            f"{flag} does not apply to --neox-config in NeoX's order: {_NEOX_ORDER_ONLY}",
            hint=f"add --order megatron to prepare the Megatron order's caches of this config"
            f" (imported.config(order='megatron', ...)), or drop {flag}",
        )
    defined, why, advice = NEOX_REFUSES.get(flag, (None, "not a flag of a NeoX job", ""))
    hint = f"drop {flag}; {advice}" if advice else f"drop {flag}"
    if defined is not None:
        return ConfigError(
            f"{flag} is refused with --neox-config: the NeoX config defines {defined}", hint=hint
        )
    return ConfigError(f"{flag} does not apply with --neox-config: {why}", hint=hint)


def _check_neox_flags(args: argparse.Namespace) -> bool:
    """The flags given with ``--neox-config`` (``args.given_flags``), each taken or refused with
    what the NeoX config defines instead, or why it does not apply; True for ``--order megatron``
    (the Megatron order's caches), False for NeoX's order (nothing to prepare)."""
    given = list(args.given_flags)
    if "--order" in given and args.order == "computed":
        raise ConfigError(
            "--order computed with --neox-config: the computed order uses no index cache, so"
            " there is nothing to prepare",
            hint="drop --order (the config is checked and built once in NeoX's order), or pass"
            " --order megatron to prepare the Megatron order's caches",
        )
    megatron = "--order" in given
    refused = [(f, e) for f in given if (e := _neox_refusal(f, megatron)) is not None]
    if refused:
        error = refused[0][1]
        if len(refused) > 1:
            others = ", ".join(f for f, _ in refused[1:])
            error = ConfigError(f"{error.message} (also refused: {others})", hint=error.hint)
        raise error
    return megatron


def prepare_neox(args: argparse.Namespace) -> int:
    """A NeoX job's data: in NeoX's order, checked (the YAML's data keys become a configuration
    whose indices tokenload builds in memory on every rank, no cache file to prepare; the build
    runs once here so that a wrong path, split or key fails now rather than on every rank); with
    ``--order megatron``, the Megatron order's caches of that data, prepared."""

    from ..datasets import build_datasets
    from ..datasets.neox.neox_yaml import neox_config_from_yaml

    megatron = _check_neox_flags(args)
    for name in LAUNCHER_VARS:  # one process (a world of 1 unless the config names its own)
        os.environ.pop(name, None)
    # without --prepare-cache-world-size: the config's global_num_gpus, else NeoX's launcher
    # count from its hostfile, num_nodes and num_gpus (neox_launch), where NeoX has one
    given = "--prepare-cache-world-size" in args.given_flags
    imported = neox_config_from_yaml(  # the job's GPUs: NeoX divides them by pipe x model
        args.neox_config, world_size=args.prepare_cache_world_size if given else None
    )
    overrides: dict[str, Any] = {}
    if args.per_dataset_sequences_path is not None:
        overrides["sequences_path"] = args.per_dataset_sequences_path
    if megatron:
        return _prepare_neox_megatron(args, imported, overrides)
    start = time.perf_counter()
    datasets = build_datasets(imported.config(**overrides), imported.sizes)
    lengths = {
        name: None if ds is None else len(ds)
        for name, ds in zip(("train", "valid", "test"), datasets)
    }
    result = {
        "order": "neox",
        "train_valid_test_num_samples": list(imported.sizes),
        **{f"{name}_dataset_length": n for name, n in lengths.items()},
        "build_seconds": round(time.perf_counter() - start, 3),
        "files_written": [],
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    print(
        f"GPT-NeoX config {' '.join(args.neox_config)}: samples (train, valid, test)"
        f" {list(imported.sizes)}"
    )
    print(
        "  "
        + ", ".join(
            f"{name} {n:,}" if n is not None else f"{name} none" for name, n in lengths.items()
        )
    )
    print(
        "nothing to prepare: tokenload builds NeoX's order in memory on every rank,"
        f" {result['build_seconds']} s"
        " here for this configuration (no cache file is read or written; --order megatron"
        " prepares the caches of this data in the Megatron order)"
    )
    return 0


def _prepare_neox_megatron(
    args: argparse.Namespace, imported: Any, overrides: dict[str, Any]
) -> int:
    """``--neox-config --order megatron``: the caches of ``imported.config(order="megatron",
    packing=..., max_documents_per_row=..., path_to_cache=...)``, which a job given the same
    overrides and ``build_policy="none"`` loads."""
    check_packing_flags(args)
    config = imported.config(
        order="megatron",
        packing=args.packing,
        max_documents_per_row=args.max_documents_per_row,
        path_to_cache=args.data_cache_path,
        build_policy="rank0",
        **overrides,
    )
    data = config.data_config()
    per_split = None if data.blend_per_split is None else list(data.blend_per_split)
    prefixes = prefixes_of(data.blend, per_split)
    if not args.json:
        print(
            f"GPT-NeoX config {' '.join(args.neox_config)}, in the Megatron order (packing"
            f" {args.packing}): samples (train, valid, test) {list(imported.sizes)}"
        )
        folder = args.data_cache_path or "Megatron's default: PREFIX/cache/GPTDataset_indices"
        print(f"  cache folder        {folder}")
        if imported.fields.get("weight_by_num_documents"):
            print(
                "  blend weights       NeoX's, from the files' document counts"
                " (weight_by_num_documents)"
            )
    datasets, written = build_caches(config, list(imported.sizes), prefixes, args.data_cache_path)
    lengths = {
        name: None if ds is None else len(ds)
        for name, ds in zip(("train", "valid", "test"), datasets)
    }
    result = {
        "order": "megatron",
        "packing": args.packing,
        "max_documents_per_row": args.max_documents_per_row,
        "train_valid_test_num_samples": list(imported.sizes),
        **{f"{name}_dataset_length": n for name, n in lengths.items()},
        "data_cache_path": args.data_cache_path,
        "files_written": written,
    }
    report_result(args, result, len(prefixes))
    if not args.json:
        keywords = [f"order='megatron', packing={args.packing!r}"]
        if args.max_documents_per_row is not None:
            keywords.append(f"max_documents_per_row={args.max_documents_per_row}")
        if args.data_cache_path is not None:
            keywords.append(f"path_to_cache={args.data_cache_path!r}")
        print(
            f"  the job loads them with imported.config({', '.join(keywords)}, build_policy='none')"
        )
    return 0
