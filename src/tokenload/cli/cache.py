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
from dataclasses import asdict
from typing import Any

from ..errors import ConfigError
from ..format.sequences import counts_of, write_sequences
from ..index import Blend
from ..megatron_args import (
    LEGACY_SPLIT,
    Batches,
    batch_flags,
    batches,
    blend_flags,
    blends_of,
    check_provider_flags,
    fast_load,
    item_flags,
    json_or_file,
    loader_flags,
    positive,
    tokenizer_flags,
    tokenizer_identity,
    tokenload_flags,
)
from .cache_build import (
    build_caches,
    check_packing_flags,
    open_all,
    packing_flags,
    prefixes_of,
    report_result,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    register_prepare_cache(sub)
    register_sequences(sub)


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
    prefixes = prefixes_of(*blends_of(args))
    entries = {prefix: counts_of(tf) for prefix, tf in open_all(prefixes, "reading headers")}
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


def run_prepare_cache(args: argparse.Namespace) -> int:
    if args.neox_config:  # a module of its own: its flags' rules and the NeoX import
        from .cache_neox import prepare_neox

        return prepare_neox(args)
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
    fast_load(args)  # the job's fast-load flags, checked as its load checks them
    check_provider_flags(args)  # and the provider's flags, as the importer checks them
    check_packing_flags(args)
    schedule = _schedule_from(args.weights_schedule)  # a malformed one is refused before any work
    blend, per_split = blends_of(args)
    counts = _counts(args)
    identity = tokenizer_identity(args)
    split = (args.split or LEGACY_SPLIT) if blend is not None else None
    config = _config(args, blend, per_split, split, identity, schedule)  # checked: nothing made
    _report_plan(args, counts, identity, split, schedule)
    prefixes = prefixes_of(blend, per_split)
    datasets, written = build_caches(config, list(counts.samples), prefixes, args.data_cache_path)
    result = _result(args, counts, identity, datasets, written)
    report_result(args, result, len(prefixes))
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
    packing = getattr(args, "packing", None) or "concat"
    if packing != "concat":  # packed rows: other caches (PackedGPTDataset), named so
        cap = getattr(args, "max_documents_per_row", None)
        per_row = "" if cap is None else f", at most {cap} documents per row"
        print(f"  packing             {packing} (PackedGPTDataset caches{per_row})")
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
