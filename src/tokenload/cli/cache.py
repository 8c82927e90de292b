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
from dataclasses import asdict, dataclass

from ..errors import ConfigError
from ..format import TokenFile
from ..format.sequences import counts_of, unique_prefixes, write_sequences
from ..index import Blend, parse_blend, read_data_args_file, read_per_split_data_args
from .args import positive

#: Megatron's ``--split`` when ``--data-path`` comes without one (it warns and uses this).
LEGACY_SPLIT = "969, 30, 1"
#: The class of megatron-core's NullTokenizer, as its ``unique_identifiers`` name it.
NULL_TOKENIZER_CLASS = "megatron.core.tokenizers.text.models.default_tokenizer.DefaultTokenizerText"
#: The launcher variables ``World.detect`` reads: prepare-cache is one process whatever the shell.
_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "SLURM_PROCID",
                  "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID")


def register(sub) -> None:
    register_prepare_cache(sub)
    register_sequences(sub)


# -- the blend flags both commands share ----------------------------------------------------------
def _blend_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data (Megatron's flags)")
    g.add_argument("--data-path", nargs="*", metavar="W_OR_PREFIX",
                   help="one prefix, prefixes, or weight/prefix pairs 'W1 P1 W2 P2 ...', split by --split")
    g.add_argument("--data-args-path", metavar="FILE", help="a file holding the --data-path list")
    for split in ("train", "valid", "test"):
        g.add_argument(f"--{split}-data-path", nargs="*", metavar="W_OR_PREFIX",
                       help=f"the {split} split's own blend (instead of --data-path)")
    g.add_argument("--per-split-data-args-path", metavar="JSON",
                   help='a JSON {"train": ..., "valid": ..., "test": ...} of per-split blends')


def blends_of(args: argparse.Namespace) -> tuple[Blend | None, list[Blend | None] | None]:
    """``(blend, blend_per_split)`` from the data flags, as Megatron's
    ``get_blend_and_blend_per_split`` reads them; exactly one of the two is not None."""
    single = [f for f in ("data_path", "data_args_path") if getattr(args, f) is not None]
    split_flags = [f"{s}_data_path" for s in ("train", "valid", "test")]
    per_split = [f for f in (*split_flags, "per_split_data_args_path") if getattr(args, f) is not None]
    given = single + per_split
    if not given:
        raise ConfigError(
            "no data: expected --data-path, --data-args-path, --train/valid/test-data-path or"
            " --per-split-data-args-path",
            hint="pass the training job's data flags (Megatron's --mock-data has no token files)",
        )
    if len(single) > 1 or (single and per_split) or ("per_split_data_args_path" in per_split and len(per_split) > 1):
        names = ", ".join("--" + f.replace("_", "-") for f in given)
        raise ConfigError(f"{names} are given together; expected one way of naming the data",
                          hint="use --data-path (with --split) or the per-split flags, as Megatron")
    if args.data_args_path is not None:
        return read_data_args_file(args.data_args_path), None
    if args.data_path is not None:
        return _blend("--data-path", args.data_path), None
    if args.per_split_data_args_path is not None:
        return None, list(read_per_split_data_args(args.per_split_data_args_path))
    return None, [None if getattr(args, f) is None else _blend(f"--{f.replace('_', '-')}", getattr(args, f))
                  for f in split_flags]


def _blend(flag: str, items: list[str]) -> Blend:
    if not items:
        raise ConfigError(f"{flag} is given without prefixes",
                          hint=f"write {flag} PREFIX or {flag} W1 PREFIX1 W2 PREFIX2 ...")
    blend = parse_blend(items)
    assert blend is not None
    return blend


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
        token_file.header  # opens now: a missing or damaged file fails here, named
        yield prefix, token_file


# -- tokenload sequences --------------------------------------------------------------------------
def register_sequences(sub) -> None:
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
    _blend_flags(p)
    p.add_argument("--per-dataset-sequences-path", required=True, metavar="OUT.json",
                   help="the JSON file to write (atomically)")
    p.set_defaults(func=run_sequences)


def run_sequences(args: argparse.Namespace) -> int:
    prefixes = _prefixes(*blends_of(args))
    entries = {prefix: counts_of(tf) for prefix, tf in _open_all(prefixes, "reading headers")}
    write_sequences(args.per_dataset_sequences_path, entries)
    print(f"wrote {len(entries)} prefixes to {args.per_dataset_sequences_path}")
    return 0


# -- tokenload prepare-cache ----------------------------------------------------------------------
def register_prepare_cache(sub) -> None:
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
    _blend_flags(p)
    g = p.add_argument_group("caches and order")
    g.add_argument("--data-cache-path", help="the cache folder the job will use (required, as in Megatron)")
    g.add_argument("--split", help=f"the --data-path split string (Megatron's default: {LEGACY_SPLIT!r})")
    g.add_argument("--seq-length", type=positive(int), help="tokens per sample (required)")
    g.add_argument("--seed", type=int, default=1234, help="the shuffles' seed")
    g.add_argument("--order", choices=("megatron", "computed"), default="megatron",
                   help="the job's sample order: 'computed' needs no cache")
    g.add_argument("--per-dataset-sequences-path", metavar="JSON",
                   help="open the token files with this sequences JSON's counts")
    g.add_argument("--mock-data", action="store_true", help="refused: mock data has no caches to prepare")
    g.add_argument("--neox-config", nargs="+", metavar="YML",
                   help="a GPT-NeoX config instead of Megatron's flags (several files merge as NeoX"
                   " merges them): its data keys are checked and its datasets built once")
    _batch_flags(p.add_argument_group("batch and length (Megatron's arithmetic)"))
    _item_flags(p.add_argument_group("items"))
    _tokenizer_flags(p.add_argument_group("tokenizer identity (part of every cache name)"))
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=run_prepare_cache)


def _batch_flags(g) -> None:
    g.add_argument("--global-batch-size", type=positive(int), help="samples per iteration")
    g.add_argument("--micro-batch-size", type=positive(int),
                   help="without --global-batch-size: global = micro x data-parallel size")
    g.add_argument("--prepare-cache-world-size", type=positive(int), default=1,
                   help="the job's number of processes, for the data-parallel size")
    g.add_argument("--tensor-model-parallel-size", type=positive(int), default=1)
    g.add_argument("--pipeline-model-parallel-size", type=positive(int), default=1)
    g.add_argument("--context-parallel-size", type=positive(int), default=1)
    length = g.add_mutually_exclusive_group()
    length.add_argument("--train-iters", type=int, help="training iterations")
    length.add_argument("--train-samples", type=int, help="training samples (iterations = samples // global batch)")
    g.add_argument("--eval-iters", type=int, default=100, help="iterations per evaluation")
    g.add_argument("--eval-interval", type=positive(int), help="iterations between evaluations")
    g.add_argument("--start-eval-at-iter", type=int, help="no evaluation before this iteration")
    g.add_argument("--eval-global-batch-size", type=positive(int), help="evaluation batch (default: global)")
    g.add_argument("--skip-train", action="store_true", help="evaluation only: valid = eval_iters x batch")
    g.add_argument("--full-validation", action="store_true", help="one full epoch of the valid split")


def _item_flags(g) -> None:
    g.add_argument("--mid-level-dataset-surplus", type=float, default=0.005,
                   help="extra samples built per blended dataset (enters the sizes)")
    g.add_argument("--no-add-extra-token", dest="add_extra_token", action="store_false",
                   help="samples of S tokens, not S + 1 (tokenload's option)")
    g.add_argument("--no-drop-last-partial-validation-sequence", dest="drop_last_partial_validation_sequence",
                   action="store_false", help="keep the valid split's last partial sample")
    for flag in ("--eod-mask-loss", "--no-create-attention-mask-in-dataloader", "--reset-position-ids",
                 "--reset-attention-mask"):
        g.add_argument(flag, action="store_true", help="accepted; changes no cache (not in Megatron's hash)")


def _tokenizer_flags(g) -> None:
    g.add_argument("--tokenizer-identity", metavar="JSON_OR_FILE",
                   help="the 'tokenizer' object of one of Megatron's ...-description.txt files, or"
                   " a file holding it or a whole description")
    g.add_argument("--tokenizer-type", help="NullTokenizer: its identity is derived (with --vocab-size)")
    g.add_argument("--vocab-size", type=positive(int), help="NullTokenizer's vocabulary size")
    g.add_argument("--null-tokenizer-eod-id", type=int, help="NullTokenizer's eod id, when the job sets it")
    g.add_argument("--null-tokenizer-pad-id", type=int, default=-1, help="NullTokenizer's pad id")


@dataclass(frozen=True)
class Batches:
    """The batch and length arithmetic of Megatron's training arguments."""

    world_size: int
    data_parallel_size: int
    global_batch_size: int
    train_iters: int
    samples: tuple[int, int | None, int]
    """(train, valid, test); valid None with --full-validation (one epoch)."""


def batches(args: argparse.Namespace) -> Batches:
    """Megatron's ``validate_args`` + ``update_train_iters`` + ``get_train_valid_test_num_samples``."""
    model = args.tensor_model_parallel_size * args.pipeline_model_parallel_size * args.context_parallel_size
    world = args.prepare_cache_world_size
    if world % model:
        raise ConfigError(
            f"world size {world} is not divisible by the model-parallel size {model} (tensor x"
            " pipeline x context)", hint="pass the job's --prepare-cache-world-size and parallel sizes",
        )
    dp = world // model
    gbs = args.global_batch_size
    if gbs is None:
        if args.micro_batch_size is None:
            raise ConfigError("no batch size: expected --global-batch-size or --micro-batch-size",
                              hint="pass the job's --global-batch-size (or --micro-batch-size and"
                              " --prepare-cache-world-size)")
        gbs = args.micro_batch_size * dp
    elif args.micro_batch_size is not None and gbs % (args.micro_batch_size * dp):
        raise ConfigError(f"global batch size {gbs} is not a multiple of micro batch size"
                          f" {args.micro_batch_size} x data-parallel size {dp}", hint="check the job's batch flags")
    iters = args.train_iters if args.train_iters is not None else args.train_samples // gbs
    train = args.train_samples if args.train_samples is not None else iters * gbs
    eval_gbs = args.eval_global_batch_size or gbs
    return Batches(world, dp, gbs, iters, (train, _valid_samples(args, iters, eval_gbs), args.eval_iters * eval_gbs))


def _valid_samples(args: argparse.Namespace, iters: int, eval_gbs: int) -> int | None:
    if args.full_validation:
        return None
    if args.skip_train:
        return args.eval_iters * eval_gbs
    if args.eval_interval is None:
        raise ConfigError(
            "no --eval-interval: Megatron sizes the valid split as (train_iters // eval_interval + 1)"
            " x eval_iters x global batch", hint="pass the job's --eval-interval (or --eval-iters 0"
            " --skip-train when it evaluates never)",
        )
    points = iters // args.eval_interval + 1
    if args.start_eval_at_iter is not None:
        points = max(0, points - args.start_eval_at_iter // args.eval_interval)
    return points * args.eval_iters * eval_gbs


def tokenizer_identity(args: argparse.Namespace) -> dict | None:
    """The tokenizer's ``unique_identifiers`` as Megatron writes them into every description."""
    if args.tokenizer_identity is not None:
        if args.tokenizer_type is not None:
            raise ConfigError("--tokenizer-identity and --tokenizer-type are given together",
                              hint="give one: the identity copied from Megatron, or NullTokenizer's flags")
        return _identity_from(args.tokenizer_identity)
    if args.tokenizer_type is None:
        return None
    if args.tokenizer_type != "NullTokenizer":
        raise ConfigError(
            f"--tokenizer-type {args.tokenizer_type}: tokenload derives only NullTokenizer's identity",
            hint="copy the \"tokenizer\" object of one of Megatron's ...-description.txt files into"
            " --tokenizer-identity",
        )
    if args.vocab_size is None:
        raise ConfigError("--tokenizer-type NullTokenizer needs --vocab-size", hint="pass the job's --vocab-size")
    # megatron-core's build_tokenizer passes these keyword arguments, in this order, as strings.
    identity = {"class": NULL_TOKENIZER_CLASS, "tokenizer_path": None, "vocab_size": str(args.vocab_size)}
    if args.null_tokenizer_eod_id is not None:
        identity["eod_id"] = str(args.null_tokenizer_eod_id)
    identity["pad_id"] = str(args.null_tokenizer_pad_id)
    return identity


def _identity_from(text: str) -> dict:
    """JSON text or a file of it; a whole description (with a "tokenizer" key) gives its part."""
    source = "--tokenizer-identity"
    if not text.lstrip().startswith("{") and os.path.isfile(text):
        source = text
        with open(text, encoding="utf-8") as f:
            text = f.read()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source} is not JSON ({exc})",
                          hint="pass the \"tokenizer\" object of a Megatron description, or its file") from None
    if isinstance(value, dict) and isinstance(value.get("tokenizer"), dict):
        value = value["tokenizer"]
    if not isinstance(value, dict) or "class" not in value:
        raise ConfigError(f"{source} holds {str(value)[:80]!r}, expected a tokenizer identity object with a \"class\"",
                          hint="copy the \"tokenizer\" object of one of Megatron's ...-description.txt files")
    return value


def run_prepare_cache(args: argparse.Namespace) -> int:
    if args.neox_config:
        return _prepare_neox(args)
    if args.order == "computed":
        print("--order computed: the computed order uses no index cache; there is nothing to prepare")
        return 0
    if args.mock_data:
        raise ConfigError("--mock-data has no token files and no caches to prepare",
                          hint="pass the job's --data-path (Megatron's prepare_cache.py refuses it too)")
    _require(args)
    blend, per_split = blends_of(args)
    counts = batches(args)
    identity = tokenizer_identity(args)
    split = (args.split or LEGACY_SPLIT) if blend is not None else None
    _report_plan(args, counts, identity, split)
    prefixes = _prefixes(blend, per_split)
    for _ in _open_all(prefixes, "checking token files"):
        pass
    before = _listing(args.data_cache_path)
    datasets = _build(args, blend, per_split, split, identity, counts)
    result = _result(args, counts, identity, datasets, sorted(_listing(args.data_cache_path) - before))
    _report_result(args, result, len(prefixes))
    return 0


def _prepare_neox(args: argparse.Namespace) -> int:
    """A NeoX job's data, checked: the YAML's data keys become a configuration in NeoX's order,
    whose indices tokenload builds in memory on every rank (no cache file to prepare); the build
    runs once here so that a wrong path, split or key fails now rather than on every rank."""
    import time

    from ..datasets import build_datasets
    from ..datasets.configs import neox_config_from_yaml

    mixed = [f for f in ("data_path", "train_data_path", "valid_data_path", "test_data_path") if getattr(args, f, None)]
    if mixed:
        raise ConfigError(f"--neox-config and --{mixed[0].replace('_', '-')} both describe the data",
                          hint="give either the NeoX config or Megatron's data flags")
    imported = neox_config_from_yaml(args.neox_config, data_parallel_size=args.prepare_cache_world_size)
    for name in _LAUNCHER_VARS:
        os.environ.pop(name, None)
    start = time.perf_counter()
    datasets = build_datasets(imported.config(), imported.sizes)
    lengths = {name: None if ds is None else len(ds) for name, ds in zip(("train", "valid", "test"), datasets)}
    result = {"order": "neox", "train_valid_test_num_samples": list(imported.sizes),
              **{f"{name}_dataset_length": n for name, n in lengths.items()},
              "build_seconds": round(time.perf_counter() - start, 3), "files_written": []}
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    print(f"GPT-NeoX config {' '.join(args.neox_config)}: samples (train, valid, test) {list(imported.sizes)}")
    print("  " + ", ".join(f"{name} {n:,}" if n is not None else f"{name} none" for name, n in lengths.items()))
    print(f"nothing to prepare: tokenload builds NeoX's order in memory on every rank, {result['build_seconds']} s"
          " here for this configuration (no cache file is read or written)")
    return 0


def _require(args: argparse.Namespace) -> None:
    """The flags without which there is nothing to build: one line each, as every user error."""
    if args.data_cache_path is None:
        raise ConfigError("--data-cache-path is missing; the caches need a folder",
                          hint="pass the training job's --data-cache-path (Megatron's prepare_cache.py"
                          " requires it too)")
    if args.seq_length is None:
        raise ConfigError("--seq-length is missing", hint="pass the training job's --seq-length")
    if args.train_iters is None and args.train_samples is None:
        raise ConfigError("no training length: expected --train-iters or --train-samples",
                          hint="pass the training job's flag")
    for flag in ("train_iters", "train_samples", "eval_iters", "start_eval_at_iter"):
        value = getattr(args, flag)
        if value is not None and value < 0:
            raise ConfigError(f"--{flag.replace('_', '-')} is {value}, expected a number >= 0")


def _build(args, blend, per_split, split, identity, counts: Batches):
    from ..datasets import MegatronDataConfig, build_datasets

    for name in _LAUNCHER_VARS:  # one process of rank 0, whatever launcher started it (as Megatron's tool)
        os.environ.pop(name, None)
    config = MegatronDataConfig(
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
        build_policy="rank0",
    )
    return build_datasets(config, list(counts.samples))


def _listing(folder: str) -> set[str]:
    try:
        return set(os.listdir(folder))
    except FileNotFoundError:
        return set()


def _result(args, counts: Batches, identity, datasets, written: list[str]) -> dict:
    lengths = {name: None if ds is None else len(ds) for name, ds in zip(("train", "valid", "test"), datasets)}
    return {
        **{k: v for k, v in asdict(counts).items() if k != "samples"},
        "train_valid_test_num_samples": list(counts.samples),
        **{f"{name}_dataset_length": n for name, n in lengths.items()},
        "data_cache_path": args.data_cache_path,
        "tokenizer": identity,
        "files_written": written,
    }


def _report_plan(args, counts: Batches, identity, split: str | None) -> None:
    if args.json:
        return
    train, valid, test = counts.samples
    print("preparing index caches with these values (Megatron's arithmetic):")
    print(f"  world size          {counts.world_size}")
    print(f"  data-parallel size  {counts.data_parallel_size}")
    print(f"  global batch size   {counts.global_batch_size}")
    print(f"  train iterations    {counts.train_iters}")
    print(f"  samples             train {train}, valid {'one epoch' if valid is None else valid}, test {test}")
    if split is not None:
        note = "" if args.split else " (Megatron's default without --split)"
        print(f"  split               {split!r}{note}")
    print(f"  cache folder        {args.data_cache_path}")
    if identity is None:
        print("  tokenizer identity  None: these caches are named for tokenload only; Megatron names its"
              " own after its tokenizer (pass --tokenizer-identity to share them)")
    else:
        print(f"  tokenizer identity  {json.dumps(identity)}")
    ignored = [f for f in ("eod_mask_loss", "no_create_attention_mask_in_dataloader", "reset_position_ids",
                           "reset_attention_mask") if getattr(args, f)]
    if ignored:
        names = ", ".join("--" + f.replace("_", "-") for f in ignored)
        print(f"  note                {names}: item flags, no effect on the caches")


def _report_result(args, result: dict, prefixes: int) -> None:
    if args.json:
        print(json.dumps(result))
        return
    print(f"finished: {prefixes} token files, {len(result['files_written'])} files written")
    for name in ("train", "valid", "test"):
        print(f"  {name + ' dataset length':<22}{result[f'{name}_dataset_length']}")
