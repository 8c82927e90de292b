"""``tokenload preprocess`` (raw text -> token files) and ``tokenload corpus`` (sample corpus):
the commands' bodies, the flags -> ``PreprocessConfig`` translation and the run's summary.

The preprocess flags (Megatron-LM's names, its and GPT-NeoX's other flags accepted or refused
with the reason) and their checks are ``preprocess_flags.py``'s.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from typing import TYPE_CHECKING

from .args import positive

if TYPE_CHECKING:
    from ..preprocess import PreprocessConfig, PreprocessResult
from .preprocess_flags import add_preprocess_flags, check_preprocess_flags

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    register_preprocess(sub)
    register_corpus(sub)


def register_preprocess(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "preprocess",
        help="tokenize JSONL/parquet/text into Megatron token files (parallel, resumable)",
        description="Writes {output_prefix}_{key}_document.bin/.idx/.json per --json-keys key."
        " As in Megatron-LM's preprocess_data.py, each JSON line (parquet row, text line or text"
        " file) is one document and its text one sequence (a list of strings: one sequence each);"
        " an empty text stays a document with no sequence and gets no EOD; blank lines are no"
        " documents. --tokenizer-type is required (ByteTokenizer needs no files). A killed or"
        " failed run rerun with the same command resumes without redoing finished input files"
        " and writes the same bytes; --restart discards such a run's work instead.",
    )
    add_preprocess_flags(p)
    p.set_defaults(func=run_preprocess)


def config_from_args(args: argparse.Namespace) -> PreprocessConfig:
    """The PreprocessConfig the flags describe."""
    from ..errors import ConfigError
    from ..preprocess import PreprocessConfig, TokenizerSpec, shard_from_environment

    check_preprocess_flags(args)
    spec = TokenizerSpec(
        kind=args.tokenizer_type,
        model=args.tokenizer_model,
        vocab_file=args.vocab_file,
        merge_file=args.merge_file,
        tiktoken_pattern=args.tiktoken_pattern,
        eod_token=args.eod_token,
        eod_id=args.eod_id,
        add_special_tokens=not args.tokenizer_hf_no_include_special_tokens,
        engine="gigatoken" if args.use_gigatoken else args.engine,
    )
    shard_index, num_shards = args.shard_index, args.num_shards
    if (shard_index is None) != (num_shards is None):
        env = shard_from_environment()
        if env is None:
            raise ConfigError(
                "--num-shards and --shard-index go together", hint="pass both, or neither"
            )
        shard_index = env[0] if shard_index is None else shard_index
        num_shards = env[1] if num_shards is None else num_shards
    elif shard_index is None:
        shard_index, num_shards = shard_from_environment() or (0, 1)
    extra = {} if args.workers is None else {"workers": args.workers}
    return PreprocessConfig(
        inputs=tuple(args.input),
        output_prefix=args.output_prefix,
        tokenizer=spec,
        json_keys=tuple(args.json_keys),
        input_format=args.input_format,
        append_eod=args.append_eod,
        executor=args.executor,
        on_bad_record=args.on_bad_record,
        num_shards=num_shards,
        shard_index=shard_index,
        chunk_bytes=_bytes("--chunk-mb", args.chunk_mb, 4),
        resume=not args.restart,
        ray_address=args.ray_address,
        ray_cpus_per_task=args.ray_cpus_per_task,
        ray_tasks_in_flight=args.ray_tasks_in_flight,
        range_bytes=_bytes("--range-mb", args.range_mb, 256),
        **extra,
    )


def _bytes(flag: str, mb: float, default: int) -> int:
    """A size in MB (MiB) as bytes; a value that is no size at all (inf, nan) is refused here,
    the range of a size by ``PreprocessConfig`` (its errors name the field; ``main`` prints the
    flag)."""
    from ..errors import ConfigError

    if not math.isfinite(mb):
        raise ConfigError(
            f"{flag} is {mb:g}, expected a finite size",
            hint=f"omit {flag} for the default of {default} MB",
        )
    return int(mb * (1 << 20))


def run_preprocess(args: argparse.Namespace) -> int:
    from ..preprocess import preprocess

    config = config_from_args(args)
    _short_skip_warnings()
    if config.num_shards > 1:
        log.info("shard %d of %d", config.shard_index, config.num_shards)
    result = preprocess(config, progress=args.progress)
    print(summary_text(config, result))
    return 0


def _short_skip_warnings() -> None:
    """Print each skipped record as one short line (``tokenload preprocess: skipped FILE:LINE:
    reason: detail``) instead of under the full logging prefix."""
    from ..preprocess.pipeline import skip_log

    if not any(getattr(h, "_tokenload_short", False) for h in skip_log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("tokenload preprocess: %(message)s"))
        handler._tokenload_short = True  # type: ignore[attr-defined]
        skip_log.addHandler(handler)
    skip_log.propagate = False


def _speed(result: PreprocessResult, mb: float) -> str:
    """This run's encoding speed; a run that only resumed finished files encoded nothing, and a
    rate of 0 tokens/s would read as a stall."""
    if result.files_resumed and not result.encoded_tokens and not result.input_bytes:
        return "nothing left to encode (every input file was finished by an earlier run)"
    mb_per_s = mb / max(result.seconds, 1e-9)
    speed = f"{result.tokens_per_second / 1e6:.2f}M tokens/s, {mb_per_s:.1f} MB/s"
    if not result.files_resumed:
        return speed
    return f"{speed} (the {result.files - result.files_resumed} file(s) encoded now)"


def summary_text(config: PreprocessConfig, result: PreprocessResult) -> str:
    """The run's final summary: documents, tokens, speed, skipped records by reason, outputs."""
    from ..preprocess.config import output_name, shard_prefix

    tokens = sum(result.tokens.values())
    mb = result.input_bytes / 1e6
    lines = [
        f"preprocess: {result.documents:,} documents, {tokens:,} tokens"
        f" from {result.files} input file(s)"
        + (f" ({result.files_resumed} resumed)" if result.files_resumed else ""),
        f"  time     {result.seconds:.2f} s: {_speed(result, mb)}"
        f"  [{result.engine}, "
        + ("ray" if config.executor == "ray" else f"{config.workers} worker(s)")
        + "]",
        "  skipped  " + (", ".join(f"{r} {n:,}" for r, n in result.skipped.items()) or "none"),
    ]
    for key, prefix in result.outputs.items():
        lines.append(f"  output   {prefix}.bin/.idx/.json  ({key}: {result.tokens[key]:,} tokens)")
    if config.num_shards > 1:
        key = config.json_keys[0]
        shards = [
            output_name(shard_prefix(config.output_prefix, i, config.num_shards), key)
            for i in range(config.num_shards)
        ]
        listing = " ".join(shards) if len(shards) <= 16 else f"{shards[0]} ... {shards[-1]}"
        lines.append(
            f"  shard    {config.shard_index} of {config.num_shards}; when every shard is done:"
            f" tokenload merge {listing} --output-prefix {output_name(config.output_prefix, key)}"
            + (" (and likewise per key)" if len(config.json_keys) > 1 else "")
        )
    return "\n".join(lines)


def register_corpus(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "corpus",
        help="write a sample JSONL corpus from this Python's standard library sources",
        description='Writes one JSON line {"text": SOURCE} per standard library .py file of this'
        " Python, in sorted path order, so the corpus is the same on every run of one Python"
        " version: sample data for trying preprocess without downloading anything.",
    )
    p.add_argument("--output", required=True, help="JSONL file to write")
    p.add_argument(
        "--max-mb",
        type=positive(float),
        default=None,
        help="stop before the file exceeds this size",
    )
    p.add_argument(
        "--min-mb",
        type=positive(float),
        default=None,
        help="repeat the sources (records marked with 'pass') until at least this size",
    )
    p.set_defaults(func=run_corpus)


def run_corpus(args: argparse.Namespace) -> int:
    from ..preprocess import write_stdlib_corpus

    def to_bytes(mb: float | None) -> int | None:
        return None if mb is None else int(mb * 1_000_000)

    s = write_stdlib_corpus(
        args.output, max_bytes=to_bytes(args.max_mb), min_bytes=to_bytes(args.min_mb)
    )
    print(
        f"wrote {s.path}: {s.documents:,} documents from {s.source_files:,} standard library files,"
        f" {s.bytes / 1e6:.1f} MB",
        file=sys.stdout,
    )
    return 0
