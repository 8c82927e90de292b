"""``tokenload prepare-cache`` and ``tokenload sequences``: a training job's startup work, done
once, offline, before the job starts.

``prepare-cache`` is megatron-core's ``tools/prepare_cache.py``: from the training job's own
flags (Megatron's names) it computes the sample counts by Megatron's arithmetic and builds every
index cache of the job in this one process, with the file names and bytes Megatron writes, plus
tokenload's build manifest, so that the job loads them with ``build_policy="none"`` (or Megatron
with ``--dataloader-fast-cache-load``) and nobody builds or waits at startup.

``sequences`` is ``tools/build_sequences_per_dataset.py``: the per-dataset sequences JSON of every
prefix of the blend(s), plus each file's dtype (``tokenload.format.sequences``).

Flags that Megatron reads but that change no cache (the item flags: EOD masking, position and
attention resets, attention masks) are accepted so that a training command line can be pasted,
and reported as having no effect on the caches.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from typing import Any

from ..errors import CacheError, ConfigError
from ..format import TokenFile
from ..format.sequences import counts_of, unique_prefixes, write_sequences
from ..index import Blend
from ..megatron_args import (
    LEGACY_SPLIT,
    TOKENIZER_VALUE_FLAGS,
    Batches,
    batch_flags,
    batches,
    blend_flags,
    blends_of,
    item_flags,
    json_or_file,
    loader_flags,
    positive,
    tokenizer_flags,
    tokenizer_identity,
    tokenload_flags,
)
from ..storage import is_url
from ..storage.upload import list_objects

#: The launcher variables ``World.detect`` reads: prepare-cache is one process whatever the shell.
_LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_NODEID",
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    register_prepare_cache(sub)
    register_sequences(sub)


# -- the blend flags both commands share ----------------------------------------------------------
def _prefixes(blend: Blend | None, per_split: list[Blend | None] | None) -> list[str]:
    blends = [blend] if blend is not None else list(per_split or [])
    return unique_prefixes(b.prefixes if b is not None else None for b in blends)


def _progress(items: list[str], what: str) -> Iterable[str]:
    """A tqdm bar over ``items`` on a terminal; the plain list elsewhere (logs, pipes, tests)."""
    if not sys.stderr.isatty():
        return items
    from tqdm import tqdm

    return tqdm(items, desc=what, unit="prefix", file=sys.stderr)


def _open_all(prefixes: list[str], what: str) -> Iterator[tuple[str, TokenFile]]:
    """Each prefix's token file, opened (header read, sizes checked), under a progress bar."""
    for prefix in _progress(prefixes, what):
        token_file = TokenFile(prefix)
        _ = token_file.header  # opens now: a missing or damaged file fails here, named
        yield prefix, token_file


# -- tokenload sequences --------------------------------------------------------------------------
def register_sequences(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sequences",
        help="write the per-dataset sequences JSON (Megatron's --per-dataset-sequences-path)",
        description="Write {prefix: [sequence_count, document_count]} for every unique prefix of"
        " the blend(s), in order, as megatron-core's tools/build_sequences_per_dataset.py does"
        " (document_count is the header's: documents + 1), plus each file's dtype under the key"
        " __tokenload_dtypes__, which Megatron ignores. A job given this file"
        " (--per-dataset-sequences-path, MegatronDataConfig(sequences_path=...)) reads no .idx"
        " header, and tokenload takes each dtype from the file instead of guessing it from the"
        " vocabulary size (Megatron's guess misreads vocabularies of 65,500-65,536).",
    )
    blend_flags(p)
    p.add_argument(
        "--per-dataset-sequences-path",
        required=True,
        metavar="OUT.json",
        help="the JSON file to write (atomically)",
    )
    p.set_defaults(func=run_sequences)


def run_sequences(args: argparse.Namespace) -> int:
    prefixes = _prefixes(*blends_of(args))
    entries = {prefix: counts_of(tf) for prefix, tf in _open_all(prefixes, "reading headers")}
    write_sequences(args.per_dataset_sequences_path, entries)
    print(f"wrote {len(entries)} prefixes to {args.per_dataset_sequences_path}")
    return 0


# -- tokenload prepare-cache ----------------------------------------------------------------------
def register_prepare_cache(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "prepare-cache",
        help="build a training job's index caches offline (Megatron's tools/prepare_cache.py)",
        description="Build every index cache of a future training job in this one process, from"
        " the job's own flags (Megatron's names): the sample counts follow Megatron's arithmetic"
        " (train = iters x global batch or --train-samples; valid = (train_iters // eval_interval"
        " + 1) x eval_iters x global batch; test = eval_iters x global batch), and the files are"
        " the ones megatron-core's prepare_cache.py writes, plus tokenload's build manifest. The"
        " job then loads them with build_policy='none' (Megatron: --dataloader-fast-cache-load)."
        " Pass the same tokenizer identity as the job, or the cache names differ.",
    )
    blend_flags(p)
    g = p.add_argument_group("caches and order")
    g.add_argument(
        "--data-cache-path",
        help="the cache folder the job will use (created when missing); without it, Megatron's"
        " default folder beside each token file (PREFIX/cache/GPTDataset_indices), as a job"
        " without --data-cache-path reads",
    )
    g.add_argument(
        "--split", help=f"the --data-path split string (Megatron's default: {LEGACY_SPLIT!r})"
    )
    g.add_argument("--seq-length", type=positive(int), help="tokens per sample (required)")
    g.add_argument("--seed", type=int, default=1234, help="the shuffles' seed")
    g.add_argument(
        "--order",
        choices=("megatron", "computed"),
        default="megatron",
        help="the job's sample order (default: %(default)s): 'computed' needs no cache; with"
        " --neox-config, NeoX's own unless 'megatron' is given, which prepares the caches of the"
        " NeoX data in the Megatron order",
    )
    g.add_argument(
        "--per-dataset-sequences-path",
        metavar="JSON",
        help="open the token files with this sequences JSON's counts",
    )
    g.add_argument(
        "--weights-schedule",
        metavar="JSON_OR_FILE",
        help="the job's MegatronDataConfig(weights_schedule=...) as JSON, [[start, [w1, w2,"
        " ...]], ...] with one weight per --data-path prefix (or a file holding it): the sources"
        " the first entry leaves out and every entry's blending arrays (one cache) are prepared"
        " too",
    )
    packing_flags(g)
    g.add_argument(
        "--mock-data", action="store_true", help="refused: mock data has no caches to prepare"
    )
    g.add_argument(
        "--neox-config",
        nargs="+",
        metavar="YML",
        help="a GPT-NeoX config instead of Megatron's flags (several files merge as NeoX"
        " merges them): its data keys are checked and its datasets built once in NeoX's order,"
        " which needs no cache; with --order megatron (and --packing, --max-documents-per-row,"
        " --data-cache-path) the Megatron order's caches of its data are prepared. The config"
        " defines the data, lengths and batch: the flags that would give them again are refused",
    )
    lengths = p.add_argument_group("batch and length (Megatron's arithmetic)")
    batch_flags(lengths)
    lengths.add_argument(
        "--train-valid-test-num-samples",
        nargs=3,
        metavar=("TRAIN", "VALID", "TEST"),
        help="the samples per split outright, instead of the batch and length flags ('epoch':"
        " one epoch of that split); what build_datasets' sizes are, and what a missing-cache"
        " error prints when Megatron's arithmetic cannot give the job's counts",
    )
    item_flags(p.add_argument_group("items"))
    tokenizer_flags(p.add_argument_group("tokenizer identity (part of every cache name)"))
    job = p.add_argument_group(
        "the rest of the job's command line",
        "accepted so that the training command can be passed as it is: Megatron's loading flags"
        " (--num-workers, --dataloader-*, --no-mmap-bin-files, tokenizer files), the Megatron-LM"
        " provider's --tokenload-* flags (--tokenload-packing is --packing), and Megatron's"
        " model, optimizer, parallelism and logging flags; none changes a cache",
    )
    loader_flags(job)
    tokenload_flags(job)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    # given_flags: the flags on the command line (SubcommandParser), which --neox-config checks
    p.set_defaults(func=run_prepare_cache, megatron_job_flags=True, given_flags=())


def packing_flags(g: argparse._ArgumentGroup) -> None:
    """``--packing`` and ``--max-documents-per-row``: the job's packing (prepare-cache, explain,
    where)."""
    g.add_argument(
        "--packing",
        choices=("concat", "best-fit"),
        default=None,  # concat (check_packing_flags): None tells the flag was not given
        help="the job's MegatronDataConfig(packing=...): 'best-fit' reads rows of whole"
        " documents (its own plan and caches) instead of Megatron's concatenated samples",
    )
    g.add_argument(
        "--max-documents-per-row",
        type=positive(int),
        default=None,
        metavar="N",
        help="the job's max_documents_per_row (with --packing best-fit)",
    )


def check_packing_flags(args: argparse.Namespace) -> None:
    """A cap on documents per row without packed rows is refused in the flags' words, before
    anything is read or created. The provider's ``--tokenload-packing`` (prepare-cache) is
    ``--packing``."""
    provider = getattr(args, "tokenload_packing", None)
    if args.packing is not None and provider is not None and args.packing != provider:
        raise ConfigError(
            f"--packing {args.packing} and --tokenload-packing {provider} disagree",
            hint="give one of them (--tokenload-packing is the job's, from its command line)",
        )
    args.packing = args.packing or provider or "concat"
    if args.max_documents_per_row is not None and args.packing != "best-fit":
        raise ConfigError(
            f"--max-documents-per-row {args.max_documents_per_row} applies to --packing"
            f" best-fit only; --packing is {args.packing}",
            hint="add --packing best-fit (the job's packing), or drop --max-documents-per-row",
        )


def run_prepare_cache(args: argparse.Namespace) -> int:
    if args.neox_config:
        return _prepare_neox(args)
    if args.order == "computed":
        print(
            "--order computed: the computed order uses no index cache; there is nothing to prepare"
        )
        return 0
    if args.mock_data:
        raise ConfigError(
            "--mock-data has no token files and no caches to prepare",
            hint="pass the job's --data-path (Megatron's prepare_cache.py refuses it too)",
        )
    _require(args)
    check_packing_flags(args)
    schedule = _schedule_from(args.weights_schedule)  # a malformed one is refused before any work
    blend, per_split = blends_of(args)
    counts = _counts(args)
    identity = tokenizer_identity(args)
    split = (args.split or LEGACY_SPLIT) if blend is not None else None
    config = _config(args, blend, per_split, split, identity, schedule)  # checked: nothing made
    _report_plan(args, counts, identity, split, schedule)
    prefixes = _prefixes(blend, per_split)
    for _ in _open_all(prefixes, "checking token files"):
        pass
    # without --data-cache-path, Megatron's folder beside each token file, as the job's build
    from ..datasets.megatron.built import default_folder

    folders = (
        [args.data_cache_path]
        if args.data_cache_path is not None
        else sorted({str(default_folder(None, p)) for p in prefixes})
    )
    if args.data_cache_path is not None:
        _check_cache_folder(args.data_cache_path)  # the build makes it when it writes a file
    before = _listings(folders)
    datasets = _build(config, list(counts.samples))
    result = _result(args, counts, identity, datasets, sorted(_listings(folders) - before))
    _report_result(args, result, len(prefixes))
    return 0


# -- prepare-cache --neox-config ------------------------------------------------------------------
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


def _prepare_neox(args: argparse.Namespace) -> int:
    """A NeoX job's data: in NeoX's order, checked (the YAML's data keys become a configuration
    whose indices tokenload builds in memory on every rank, no cache file to prepare; the build
    runs once here so that a wrong path, split or key fails now rather than on every rank); with
    ``--order megatron``, the Megatron order's caches of that data, prepared."""
    import time

    from ..datasets import build_datasets
    from ..datasets.neox.neox_yaml import neox_config_from_yaml

    megatron = _check_neox_flags(args)
    for name in _LAUNCHER_VARS:  # one process (a world of 1 unless the config names its own)
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
    prefixes = _prefixes(data.blend, per_split)
    if not args.json:
        print(
            f"GPT-NeoX config {' '.join(args.neox_config)}, in the Megatron order (packing"
            f" {args.packing}): samples (train, valid, test) {list(imported.sizes)}"
        )
        folder = args.data_cache_path or "Megatron's default: PREFIX/cache/GPTDataset_indices"
        print(f"  cache folder        {folder}")
        if imported.fields.get("weight_by_num_documents"):
            print(
                "  note                weight_by_num_documents is NeoX's order's: the Megatron"
                " order blends by the config's data weights"
            )
    for _ in _open_all(prefixes, "checking token files"):
        pass
    from ..datasets.megatron.built import default_folder

    folders = (
        [args.data_cache_path]
        if args.data_cache_path is not None
        else sorted({str(default_folder(None, p)) for p in prefixes})
    )
    if args.data_cache_path is not None:
        _check_cache_folder(args.data_cache_path)
    before = _listings(folders)
    datasets = _build(config, list(imported.sizes))
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
        "files_written": sorted(_listings(folders) - before),
    }
    _report_result(args, result, len(prefixes))
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


def _require(args: argparse.Namespace) -> None:
    """The flags without which there is nothing to build: one line each, as every user error."""
    if args.seq_length is None:
        raise ConfigError("--seq-length is missing", hint="pass the training job's --seq-length")
    explicit = args.train_valid_test_num_samples is not None
    given = (
        [
            f
            for f in (
                "train_iters",
                "train_samples",
                "eval_interval",
                "global_batch_size",
                "micro_batch_size",
                "step_batch_size_schedule",
                "rampup_batch_size",
                "full_validation",
                "skip_train",
            )
            if getattr(args, f)
        ]
        if explicit
        else []
    )
    if given:
        raise ConfigError(
            f"--train-valid-test-num-samples and --{given[0].replace('_', '-')} both give the"
            " sizes",
            hint="give the counts outright or the job's batch and length flags, not both",
        )
    if args.train_iters is None and args.train_samples is None and not explicit:
        raise ConfigError(
            "no training length: expected --train-iters or --train-samples",
            hint="pass the training job's flag",
        )


def _num_samples(text: str) -> int | None:
    """A split's sample count: a number >= 0, or ``epoch`` (None: one epoch)."""
    if text == "epoch":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(
            f"--train-valid-test-num-samples holds {text!r}, expected a number >= 0 or 'epoch'",
            hint="write the train, valid and test sample counts, e.g. 8000 epoch 80",
        )
    return value


def _counts(args: argparse.Namespace) -> Batches:
    """The job's samples per split: given outright, or by Megatron's arithmetic."""
    if args.train_valid_test_num_samples is None:
        return batches(args)
    train, valid, test = map(_num_samples, args.train_valid_test_num_samples)
    return Batches(
        world_size=args.prepare_cache_world_size,
        data_parallel_size=args.prepare_cache_world_size,
        global_batch_size=1,
        train_iters=train or 0,
        samples=(train, valid, test),
    )


def _config(
    args: argparse.Namespace,
    blend: Blend | None,
    per_split: list[Blend | None] | None,
    split: str | None,
    identity: dict[str, Any] | None,
    schedule: list[Any] | None,
) -> Any:
    """The job's configuration, checked (a bad value fails here, before anything is created)."""
    from ..datasets import MegatronDataConfig
    from ..index.splits import parse_split

    if split is not None:
        parse_split(split)  # the build reads it after the folder is made
    return MegatronDataConfig(
        sequence_length=args.seq_length,
        random_seed=args.seed,
        blend=blend,
        blend_per_split=per_split,
        split=split,
        tokenizer=identity,
        add_extra_token=args.add_extra_token,
        drop_last_partial_validation_sequence=args.drop_last_partial_validation_sequence,
        mid_level_dataset_surplus=args.mid_level_dataset_surplus,
        path_to_cache=args.data_cache_path,
        sequences_path=args.per_dataset_sequences_path,
        weights_schedule=schedule,
        packing=args.packing,
        max_documents_per_row=args.max_documents_per_row,
        build_policy="rank0",
    )


def _build(config: Any, samples: list[int | None]) -> tuple[Any, Any, Any]:
    from ..datasets import build_datasets

    # one process of rank 0, whatever launcher started it (as Megatron's tool)
    for name in _LAUNCHER_VARS:
        os.environ.pop(name, None)
    try:
        return build_datasets(config, samples)
    except CacheError as exc:
        if not exc.message.startswith("cannot write the index cache"):
            raise
        # the library's hint offers an in-memory build: no way out for a command that writes
        raise CacheError(
            exc.message,
            path=exc.path,
            hint="free space on that filesystem, or pass another --data-cache-path (the"
            " training job's, which reads the caches there)",
        ) from None


def _schedule_from(text: str | None) -> list[Any] | None:
    """``--weights-schedule``: JSON text, or a file of it (checked by the config)."""
    if text is None:
        return None
    hint = "pass [[0, [w1, w2, ...]], [start, [...]], ...] as the job's weights_schedule"
    value, source = json_or_file(text, "--weights-schedule", "[", hint)
    if not isinstance(value, list):
        raise ConfigError(
            f"{source} holds {str(value)[:80]!r}; expected a list of [start, weights] pairs",
            hint=hint,
        )
    from ..index.schedule import check_schedule

    return list(check_schedule(value, what=source))


def _check_cache_folder(folder: str) -> None:
    """A local cache folder that exists is a folder; a missing one is made with its parents by
    the build, when it writes the first cache file (so a command that fails first makes none)."""
    if is_url(folder):
        return
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ConfigError(
            f"--data-cache-path {folder!r} is a file, not a folder",
            path=folder,
            hint="pass the training job's cache folder",
        )
    if os.path.isdir(folder):
        return
    above = os.path.dirname(os.path.abspath(folder))  # the folder it would be made in
    while not os.path.exists(above) and os.path.dirname(above) != above:
        above = os.path.dirname(above)
    if not os.path.isdir(above) or not os.access(above, os.W_OK | os.X_OK):
        what = "is a file" if not os.path.isdir(above) else "cannot be written"
        raise ConfigError(
            f"cannot write the cache folder {folder!r}: {above!r} {what}; expected a folder"
            " that can be made there",
            path=folder,
            hint="pass a --data-cache-path in a writable folder (the training job's)",
        )


def _listing(folder: str) -> set[str]:
    """Names of the files in ``folder``, local or in object storage."""
    if is_url(folder):
        return {url.rsplit("/", 1)[1] for url in list_objects(folder)}
    try:
        return set(os.listdir(folder))
    except FileNotFoundError:
        return set()


def _listings(folders: list[str]) -> set[str]:
    """The files of one folder by name, of several by path."""
    if len(folders) == 1:
        return _listing(folders[0])
    return {os.path.join(f, name) for f in folders for name in _listing(f)}


def _result(
    args: argparse.Namespace,
    counts: Batches,
    identity: dict[str, Any] | None,
    datasets: tuple[Any, Any, Any],
    written: list[str],
) -> dict[str, Any]:
    lengths = {
        name: None if ds is None else len(ds)
        for name, ds in zip(("train", "valid", "test"), datasets)
    }
    return {
        **{k: v for k, v in asdict(counts).items() if k != "samples"},
        "train_valid_test_num_samples": list(counts.samples),
        **{f"{name}_dataset_length": n for name, n in lengths.items()},
        "data_cache_path": args.data_cache_path,
        "tokenizer": identity,
        "files_written": written,
    }


def _report_plan(
    args: argparse.Namespace,
    counts: Batches,
    identity: dict[str, Any] | None,
    split: str | None,
    schedule: list[Any] | None,
) -> None:
    if args.json:
        return
    train, valid, test = counts.samples
    print("preparing index caches with these values (Megatron's arithmetic):")
    print(f"  world size          {counts.world_size}")
    print(f"  data-parallel size  {counts.data_parallel_size}")
    by_step = counts.step_batch_size_schedule
    if by_step is not None:  # each step's batch; Megatron sizes the other splits by micro x dp
        steps = ", ".join(f"{batch} from sample {start}" for start, batch in by_step.steps)
        print(f"  batch schedule      {steps}")
        print(f"  global batch size   {counts.global_batch_size} (valid and test: micro x dp)")
    else:
        print(f"  global batch size   {counts.global_batch_size}")
    print(f"  train iterations    {counts.train_iters}")
    shown = ["one epoch" if n is None else n for n in (train, valid, test)]
    print(f"  samples             train {shown[0]}, valid {shown[1]}, test {shown[2]}")
    if split is not None:
        note = "" if args.split else " (Megatron's default without --split)"
        print(f"  split               {split!r}{note}")
    folder = args.data_cache_path or "Megatron's default: PREFIX/cache/GPTDataset_indices per file"
    print(f"  cache folder        {folder}")
    if schedule is not None:
        starts = ", ".join(str(start) for start, _ in schedule[1:]) or "none"
        print(f"  weights schedule    {len(schedule)} entries; changes at samples {starts}")
    if identity is None:
        print(
            "  tokenizer identity  None: these caches are named for tokenload only; Megatron"
            " names its own after its tokenizer (pass --tokenizer-identity to share them)"
        )
    else:
        print(f"  tokenizer identity  {json.dumps(identity)}")
    ignored = [
        f
        for f in (
            "eod_mask_loss",
            "no_create_attention_mask_in_dataloader",
            "reset_position_ids",
            "reset_attention_mask",
        )
        if getattr(args, f)
    ]
    if ignored:
        names = ", ".join("--" + f.replace("_", "-") for f in ignored)
        print(f"  note                {names}: item flags, no effect on the caches")


def _report_result(args: argparse.Namespace, result: dict[str, Any], prefixes: int) -> None:
    if args.json:
        print(json.dumps(result))
        return
    print(f"finished: {prefixes} token files, {len(result['files_written'])} files written")
    for name in ("train", "valid", "test"):
        print(f"  {name + ' dataset length':<22}{result[f'{name}_dataset_length']}")
