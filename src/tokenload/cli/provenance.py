"""``tokenload explain`` and ``tokenload where``: the documents of a training step, and the steps
of a document (``tokenload.provenance``), from the job's data flags (those ``prepare-cache``
takes) and optionally its loader state (``--state``: skips, schedule, set_weights changes, the
micro-batch and data-parallel sizes)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shlex
from collections.abc import Iterator
from typing import Any

from ..errors import CacheError, ConfigError, ForeignStateError, require
from ..megatron_args import (
    batch_flags,
    blend_flags,
    blends_of,
    item_flags,
    tokenizer_flags,
    tokenizer_identity,
)
from .args import at_least, positive
from .cache_build import packing_flags


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "explain",
        help="the documents (source, document, token range) of every row of a training step",
        description="Print, for each row of global step --step in rank order (rank, micro-batch,"
        " row), the pieces of its input tokens: the source (the blend member, 0-based, and its"
        " prefix), the document (its index in the source's token file) and the token range in"
        " it. Direct: the step's samples are a function of the step.",
    )
    p.add_argument("--step", type=at_least(int, 0), required=True, help="the global step, from 0")
    p.add_argument(
        "--text",
        action="store_true",
        help="print each piece's text too (needs --tokenizer)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="byte|TOKENIZER_JSON",
        help="decodes --text: 'byte' (tokenload's byte tokenizer) or a tokenizer.json file",
    )
    _data_flags(p)
    p.set_defaults(func=run_explain)
    w = sub.add_parser(
        "where",
        help="every training step whose rows hold a token of a document",
        description="Print every global step (with rank, micro-batch and row) whose input tokens"
        " hold a token of --document of --source, by inverting the order (no scan of the steps);"
        " 'note:' lines say what the state cannot answer (the steps before a mixture change at a"
        " resume; the rank of rows served before the first topology the state records).",
    )
    w.add_argument("--source", type=at_least(int, 0), default=0, help="the blend member, 0-based")
    w.add_argument(
        "--document",
        type=at_least(int, 0),
        required=True,
        help="the document's index in that source's token file (Megatron's sequence id)",
    )
    _data_flags(w)
    w.set_defaults(func=run_where)


def _data_flags(p: argparse.ArgumentParser) -> None:
    blend_flags(p)
    g = p.add_argument_group("order")
    g.add_argument("--seq-length", type=positive(int), help="tokens per sample (required)")
    g.add_argument("--seed", type=int, default=1234, help="the shuffles' seed")
    g.add_argument("--split", help="the --data-path split string (default: '969, 30, 1')")
    g.add_argument("--order", choices=("megatron", "computed"), default="megatron")
    g.add_argument(
        "--data-cache-path",
        help="the job's index cache folder (Megatron's order): its prepared caches are loaded,"
        " never written; without them (or it) the indices are built in memory",
    )
    g.add_argument("--per-dataset-sequences-path", metavar="JSON")
    packing_flags(g)
    g.add_argument("--weights-schedule", metavar="JSON_OR_FILE", help="the job's weights_schedule")
    g.add_argument("--mixture-change", choices=("refuse", "continue"), default="refuse")
    g.add_argument(
        "--state",
        metavar="FILE",
        help="the loader state the job saved (JSON or a torch checkpoint holding it): its skips,"
        " mixture changes, micro-batch and data-parallel sizes",
    )
    g.add_argument("--state-key", help="which state of a checkpoint that holds several")
    g.add_argument(
        "--data-parallel-size",
        type=positive(int),
        help="the job's data-parallel ranks (default: the state's, step by step, else 1); with"
        " a state, it and --micro-batch-size place only the samples before the state's topology"
        " history; it also gives Megatron's arithmetic its data-parallel size (world size"
        " dp x tensor x pipeline x context) unless --prepare-cache-world-size is given",
    )
    lengths = p.add_argument_group("batch and length (Megatron's arithmetic)")
    batch_flags(lengths)
    lengths.add_argument(
        "--train-valid-test-num-samples",
        nargs=3,
        metavar=("TRAIN", "VALID", "TEST"),
        help="the samples per split outright ('epoch': one epoch), as prepare-cache takes them",
    )
    items = p.add_argument_group(
        "items (the loader state's fingerprint covers them: give the job's, as it gave them)"
    )
    item_flags(items)
    tokenizer_flags(
        p.add_argument_group(
            "tokenizer identity (Megatron's order: part of every cache name and of the loader"
            " state's fingerprint; give the job's, as prepare-cache takes it)"
        )
    )
    items.add_argument(
        "--eod-id",
        type=at_least(int, 0),
        metavar="N",
        help="the job's eod_id (MegatronDataConfig(eod_id=...); the tokenizer's end of document)",
    )
    items.add_argument(
        "--dataloader-inter-document-masking",
        action="store_true",
        help="the job's inter_document_masking (cu_seqlens per document)",
    )


def _dataset(args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None, Any]:
    """The train dataset, the loader state, and the job's sample counts."""
    from ..datasets import MegatronDataConfig, build_datasets
    from .cache import _counts, _schedule_from
    from .cache_build import check_packing_flags
    from .state import find_state, read

    if args.seq_length is None:
        raise ConfigError("--seq-length is missing", hint="pass the training job's --seq-length")
    scheduled = getattr(args, "step_batch_size_schedule", None) is not None
    if args.global_batch_size is None and not scheduled:
        raise ConfigError(
            "--global-batch-size is missing",
            hint="pass the training job's --global-batch-size (or its --step-batch-size-schedule)",
        )
    if scheduled and args.train_valid_test_num_samples is not None:
        raise ConfigError(
            "--train-valid-test-num-samples and --step-batch-size-schedule both give the sizes",
            hint="give the job's batch and length flags (the schedule's steps need them)",
        )
    if (args.train_iters, args.train_samples, args.train_valid_test_num_samples) == (None,) * 3:
        raise ConfigError(
            "no training length: expected --train-iters or --train-samples",
            hint="pass the training job's flag (the order depends on the samples built)",
        )
    check_packing_flags(args)
    if args.data_parallel_size is not None and args.prepare_cache_world_size == 1:
        # the job's ranks, for Megatron's arithmetic (its checks of the batch sizes) too
        args.prepare_cache_world_size = (
            args.data_parallel_size
            * args.tensor_model_parallel_size
            * args.pipeline_model_parallel_size
            * args.context_parallel_size
        )
    blend, per_split = blends_of(args)
    state = None
    if args.state is not None:
        state = find_state(read(args.state), args.state, args.state_key)
    counts = _counts(args)
    identity = tokenizer_identity(args)
    options: dict[str, Any] = {}
    if identity is not None and args.order == "megatron":
        # the Megatron order's caches are named for it (another order reads none, as the
        # Megatron-LM provider gives it)
        options["tokenizer"] = identity
    if args.order == "megatron" and args.data_cache_path is not None:
        # read-only: the job's prepared caches are loaded, never written (a query whose flags
        # name another order, e.g. another packing, must not add that order's caches there)
        options.update(path_to_cache=args.data_cache_path, build_policy="none")
    elif args.data_cache_path is not None:
        options["path_to_cache"] = args.data_cache_path
    elif args.order == "megatron":
        options["cache"] = "off"
    config = MegatronDataConfig(
        sequence_length=args.seq_length,
        random_seed=args.seed,
        blend=blend,
        blend_per_split=per_split,
        split=(args.split or "969, 30, 1") if blend is not None else None,
        add_extra_token=args.add_extra_token,
        drop_last_partial_validation_sequence=args.drop_last_partial_validation_sequence,
        mid_level_dataset_surplus=args.mid_level_dataset_surplus,
        eod_id=args.eod_id,
        eod_mask_loss=args.eod_mask_loss,
        reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask,
        create_attention_mask=not args.no_create_attention_mask_in_dataloader,  # as Megatron
        inter_document_masking=args.dataloader_inter_document_masking,
        sequences_path=args.per_dataset_sequences_path,
        weights_schedule=_schedule_from(args.weights_schedule),
        mixture_change=args.mixture_change,
        order=args.order,
        packing=args.packing,
        max_documents_per_row=args.max_documents_per_row,
        **options,
    )
    try:
        train = build_datasets(config, list(counts.samples))[0]
    except CacheError:  # none prepared for these flags: built in memory, nothing written
        if config.build_policy != "none":
            raise
        memory = dataclasses.replace(config, path_to_cache=None, build_policy="auto", cache="off")
        train = build_datasets(memory, list(counts.samples))[0]
    if train is None:
        raise ConfigError("the train split is empty", hint="check --split and --data-path")
    return train, state, counts


def _topology(args: argparse.Namespace, counts: Any) -> dict[str, Any]:
    """The global batch (a ``--step-batch-size-schedule``'s steps, else the constant one) and
    the sizes given."""
    schedule = counts.step_batch_size_schedule
    return {
        "global_batch_size": args.global_batch_size if schedule is None else schedule,
        "micro_batch_size": args.micro_batch_size,
        "dp_size": args.data_parallel_size,
    }


def _train_steps(args: argparse.Namespace, counts: Any, train: int | None) -> int | None:
    """The run's training steps: Megatron's iterations under a batch schedule, else its train
    samples over the global batch (None: every step the dataset holds)."""
    if counts.step_batch_size_schedule is not None:
        return int(counts.train_iters)
    return None if train is None else train // args.global_batch_size


def _names(dataset: Any) -> list[str]:
    return [m.name for m in dataset.describe_sources().members]


def run_explain(args: argparse.Namespace) -> int:
    from ..provenance import explain

    dataset, state, counts = _dataset(args)
    names = _names(dataset)
    decode = _decoder(args.tokenizer) if args.text else None
    with _refused_with_flags(state):
        rows = explain(dataset, step=args.step, state=state, **_topology(args, counts))
    print(f"step {args.step}: {len(rows)} rows")
    print("rank  micro  row  sample  source  document  tokens")
    for r in rows:
        for i, p in enumerate(r.pieces):
            where = (
                f"{r.rank:4d} {r.micro_batch:6d} {r.row:4d} {r.sample:7d}" if not i else " " * 24
            )
            line = (
                f"{where}  {p.source:2d} {names[p.source]}  {p.document:8d}  [{p.start}, {p.stop})"
            )
            print(line)
            if decode is not None:
                print(f"{'':26}text {json.dumps(decode(names[p.source], p))}")
    return 0


def run_where(args: argparse.Namespace) -> int:
    from ..provenance import where

    dataset, state, counts = _dataset(args)
    names = _names(dataset)
    train = counts.samples[0]  # the run's samples: its steps (None: the whole dataset)
    with _refused_with_flags(state):
        found = where(
            dataset,
            source=args.source,
            document=args.document,
            state=state,
            steps=_train_steps(args, counts, train),
            **_topology(args, counts),
        )
    name = names[args.source] if args.source < len(names) else "?"
    unplaced = f", {len(found.unplaced)} rows of unknown rank" if found.unplaced else ""
    covered = f" (from global sample {found.first_sample} on)" if found.first_sample else ""
    print(
        f"source {args.source} ({name}), document {args.document}: {len(found.steps)} steps,"
        f" {len(found.rows)} rows{unplaced}{covered}"
    )
    if found.rows or found.unplaced:
        print("step  rank  micro  row  sample")
    for step, r in found.rows:
        print(f"{step:4d} {r.rank:5d} {r.micro_batch:6d} {r.row:4d} {r.sample:7d}")
    for step, sample in found.unplaced:  # the state does not record their topology
        print(f"{step:4d} {'?':>5} {'?':>6} {'?':>4} {sample:7d}")
    if found.skipped:
        print(f"skipped (loader.skip, in no step): samples {found.skipped}")
    for note in found.notes:
        print(f"note: {note}")
    return 0


@contextlib.contextmanager
def _refused_with_flags(state: dict[str, Any] | None) -> Iterator[None]:
    """A state refused for what it read (``ForeignStateError``: another order, packing, S or
    item options) gets, in place of the loader's advice to a training script, the flags of this
    command that read as the saved run did."""
    try:
        yield
    except ForeignStateError as exc:
        flags = _read_flags(state.get("reads") if isinstance(state, dict) else None)
        if not flags:
            raise
        read = (exc.hint or "").split("; a state resumes", 1)[0]  # what this command read
        raise ForeignStateError(
            exc.message,
            path=exc.path,
            hint=f"{read}; give the flags the saved run read with: {shlex.join(flags)} (with"
            " the job's data, seed, split and length flags; tokenload state FILE prints what it"
            " read)",
        ) from None


_SET_FLAGS = (
    ("eod_mask_loss", "--eod-mask-loss"),
    ("reset_position_ids", "--reset-position-ids"),
    ("reset_attention_mask", "--reset-attention-mask"),
    ("inter_document_masking", "--dataloader-inter-document-masking"),
)


def _read_flags(reads: Any) -> list[str]:
    """The explain/where flags of a state's ``"reads"`` (``loader.state.reads``)."""
    if not isinstance(reads, dict):
        return []
    flags: list[str] = []
    for key, flag in (("order", "--order"), ("packing", "--packing")):
        if reads.get(key) is not None:
            flags += [flag, str(reads[key])]
    if reads.get("sequence_length") is not None:
        flags += ["--seq-length", str(reads["sequence_length"])]
    if reads.get("add_extra_token") is False:
        flags.append("--no-add-extra-token")
    if reads.get("eod_id") is not None:
        flags += ["--eod-id", str(reads["eod_id"])]
    flags += [flag for key, flag in _SET_FLAGS if reads.get(key)]
    if reads.get("create_attention_mask") is False:
        flags.append("--no-create-attention-mask-in-dataloader")
    return flags


def _decoder(tokenizer: str | None) -> Any:
    """A function (prefix, piece) -> the piece's text."""
    if tokenizer is None:
        raise ConfigError("--text needs --tokenizer", hint="pass --tokenizer byte or a file")
    from ..format import TokenFile

    files: dict[str, TokenFile] = {}

    def tokens(prefix: str, piece: Any) -> list[int]:
        if prefix not in files:
            files[prefix] = TokenFile(prefix)
        ids = files[prefix].get(piece.document, piece.start, piece.stop - piece.start)
        return [int(t) for t in ids]

    if tokenizer == "byte":
        return lambda prefix, piece: bytes(t for t in tokens(prefix, piece) if t < 256).decode(
            "utf-8", errors="replace"
        )
    tokenizers = require("tokenizers", "hf", "--text with a tokenizer.json")
    try:
        loaded = tokenizers.Tokenizer.from_file(tokenizer)
    except Exception as exc:  # the Rust library's own error: a plain Exception with its words
        raise ConfigError(
            f"--tokenizer {tokenizer!r} is not a readable tokenizer.json ({exc})",
            hint="give the tokenizer.json the token files were made with, or --tokenizer byte",
        ) from None
    return lambda prefix, piece: loaded.decode(tokens(prefix, piece))
