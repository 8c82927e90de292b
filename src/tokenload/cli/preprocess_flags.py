"""The flags of ``tokenload preprocess`` and the checks argparse cannot express, apart from the
command (``preprocess.py``), whose body turns them into a ``PreprocessConfig``: the flag list is
long and changes for other reasons (a peer tool's new flag) than the command does.

Flag names follow Megatron-LM's tools/preprocess_data.py where it has them (--input,
--output-prefix, --json-keys, --append-eod, --workers, --tokenizer-type, --tokenizer-model,
--vocab-file, --merge-file, --use-gigatoken, --tokenizer-hf-no-include-special-tokens). Its other
flags and GPT-NeoX's are accepted too: those with no effect on the bytes (--partitions with
--keep-sequential-samples, --log-interval, --num-docs, --dataset-impl mmap, --jsonl-keys) run, those
whose output tokenload does not reproduce (sentence splitting, round-robin partitions, ftfy) fail
with the reason.
"""

from __future__ import annotations

import argparse


def add_preprocess_flags(p: argparse.ArgumentParser) -> None:
    """Add every flag of ``tokenload preprocess`` to ``p``, in its help's groups."""
    _input_flags(p.add_argument_group("input and output"))
    _tokenizer_flags(p.add_argument_group("tokenizer"))
    _runtime_flags(p.add_argument_group("runtime"))
    _peer_flags(
        p.add_argument_group(
            "Megatron-LM and GPT-NeoX flags",
            "accepted so their commands run unchanged; those that would change the output in a way"
            " tokenload does not reproduce are refused with the reason",
        )
    )


def check_preprocess_flags(args: argparse.Namespace) -> None:
    """ConfigError for refused peer flags and a missing tokenizer type (the values' ranges are
    ``PreprocessConfig``'s to check: its errors name the fields, which ``main`` prints as flags)."""
    _check_peer_flags(args)
    _check_runtime_flags(args)


def _input_flags(io: argparse._ArgumentGroup) -> None:
    io.add_argument(
        "--input",
        nargs="+",
        action="extend",
        required=True,
        metavar="PATH",
        help="files, folders, globs or fsspec URLs (.jsonl/.json/.ndjson[.gz|.zst], .parquet,"
        " .arrow, .txt), or Hugging Face dataset folders (save_to_disk, Hub snapshot);"
        " repeatable; order kept, each glob/folder sorted",
    )
    io.add_argument(
        "--output-prefix",
        required=True,
        help="output prefix: a local path (its folder must exist) or a URL such as s3://bucket/path/name"
        " (made in a local staging folder, TOKENLOAD_STAGING_DIR, and uploaded when the run"
        " succeeds)",
    )
    io.add_argument(
        "--json-keys",
        "--jsonl-keys",  # GPT-NeoX's name
        nargs="+",
        default=["text"],
        metavar="KEY",
        help="keys (JSONL) or columns (parquet) to tokenize, one output each (default: text)",
    )
    io.add_argument(
        "--input-format",
        default="auto",
        choices=("auto", "jsonl", "parquet", "arrow", "text", "lines"),
        help="auto: from the extension; text: one document per file; lines: one per line",
    )
    io.add_argument(
        "--append-eod", action="store_true", help="end every non-empty document with the EOD token"
    )
    io.add_argument(
        "--on-bad-record",
        default="error",
        choices=("error", "skip"),
        help="error: stop at the first bad record (file:line); skip: skip and count by reason",
    )


def _tokenizer_flags(tk: argparse._ArgumentGroup) -> None:
    from ..preprocess.config import _KIND_ALIASES, TIKTOKEN_PATTERNS, TOKENIZER_KINDS

    tk.add_argument(
        "--tokenizer-type",
        default=None,
        metavar="TYPE",
        help=f"required, as in Megatron: {', '.join(TOKENIZER_KINDS)} or a Megatron name"
        f" ({', '.join(_KIND_ALIASES)}); ByteTokenizer is UTF-8 bytes with EOD 256 and needs"
        " no files",
    )
    tk.add_argument(
        "--tokenizer-model",
        default=None,
        metavar="PATH",
        help="tokenizer.json or local HF model folder, .tiktoken file, or SentencePiece .model",
    )
    tk.add_argument("--vocab-file", default=None, help="GPT-2 vocab.json (tokenizer type gpt2)")
    tk.add_argument("--merge-file", default=None, help="GPT-2 merges.txt (tokenizer type gpt2)")
    tk.add_argument(
        "--tiktoken-pattern",
        default=None,
        choices=TIKTOKEN_PATTERNS,
        help="split regex of a .tiktoken file (default: from the file name)",
    )
    tk.add_argument(
        "--eod-token",
        default=None,
        help="token text that ends documents (default: the tokenizer's)",
    )
    tk.add_argument("--eod-id", type=int, default=None, help="token id that ends documents")
    tk.add_argument(
        "--tokenizer-hf-no-include-special-tokens",
        action="store_true",
        help="huggingface: do not add the post-processor's special tokens (BOS/EOS)",
    )
    tk.add_argument(
        "--engine",
        default="auto",
        choices=("auto", "gigatoken", "native"),
        help="auto: gigatoken where it gives identical ids; native: the reference encoder",
    )
    tk.add_argument("--use-gigatoken", action="store_true", help="same as --engine gigatoken")


def _runtime_flags(rt: argparse._ArgumentGroup) -> None:
    rt.add_argument(
        "--workers",
        type=int,
        default=None,
        help="encoding workers, at least 1; never changes the output (default: usable CPUs)",
    )
    rt.add_argument(
        "--executor",
        default="auto",
        choices=("auto", "threads", "processes", "ray"),
        help="auto: threads for Rust encoders, processes for Python ones; ray: tasks on a Ray"
        " cluster (RAY_ADDRESS or --ray-address, else a local one of --workers CPUs; needs"
        " tokenload[ray]; the output folder must be on a filesystem every node sees, or the output"
        " an s3:// prefix: parts then go under a work prefix in the bucket)",
    )
    rt.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDRESS",
        help="with --executor ray: the cluster to join, e.g. HEAD_IP:6379 (default: RAY_ADDRESS)",
    )
    rt.add_argument(
        "--ray-cpus-per-task",
        type=float,
        default=1.0,
        help="with --executor ray: CPUs reserved per task (default 1)",
    )
    rt.add_argument(
        "--ray-tasks-in-flight",
        type=int,
        default=None,
        help="with --executor ray: most unfinished tasks at once"
        " (default: twice the cluster's CPUs)",
    )
    rt.add_argument(
        "--range-mb",
        type=float,
        default=256.0,
        help="with --executor ray: uncompressed JSONL/lines files above this size are split into"
        " byte ranges of this size, one task each (default 256)",
    )
    rt.add_argument(
        "--num-shards",
        type=int,
        default=None,
        help="split the input files across N machines (default: WORLD_SIZE/SLURM_NTASKS or 1)",
    )
    rt.add_argument(
        "--shard-index",
        type=int,
        default=None,
        help="this machine's shard (default: RANK/SLURM_PROCID or 0)",
    )
    rt.add_argument(
        "--chunk-mb",
        type=float,
        default=4.0,
        help="most input MB per work item (default 4; smaller while a slow tokenizer is measured,"
        " so progress moves); memory is about 3 x workers x this",
    )
    rt.add_argument(
        "--restart",
        "--no-resume",
        dest="restart",
        action="store_true",
        help="discard the work folder an earlier, unfinished run left on this output prefix and"
        " start over (by default a rerun resumes it, reusing its finished input files)",
    )
    rt.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="always show a progress bar",
    )
    rt.add_argument(
        "--no-progress", dest="progress", action="store_false", help="never show a progress bar"
    )


def _peer_flags(pf: argparse._ArgumentGroup) -> None:
    pf.add_argument(
        "--partitions",
        type=int,
        default=1,
        help="Megatron: split the input in N parts processed apart, then merged. tokenload is"
        " parallel without it (--workers) and ignores it; N > 1 needs --keep-sequential-samples",
    )
    pf.add_argument(
        "--keep-sequential-samples",
        action="store_true",
        help="Megatron: partitions keep the input order (tokenload always does)",
    )
    pf.add_argument(
        "--log-interval", type=int, default=None, help="Megatron/NeoX: ignored (see --progress)"
    )
    pf.add_argument(
        "--num-docs", type=int, default=None, help="GPT-NeoX: ignored (progress estimate)"
    )
    pf.add_argument(
        "--dataset-impl",
        default="mmap",
        help="GPT-NeoX: only mmap (Megatron's .bin/.idx) is written",
    )
    pf.add_argument(
        "--split-sentences", action="store_true", help="Megatron: refused (see the error)"
    )
    pf.add_argument(
        "--keep-newlines", action="store_true", help="Megatron: refused (with --split-sentences)"
    )
    pf.add_argument("--lang", default=None, help="Megatron: sentence-splitting language; refused")
    pf.add_argument("--ftfy", action="store_true", help="GPT-NeoX: refused (see the error)")


def _check_peer_flags(args: argparse.Namespace) -> None:
    """ConfigError for Megatron/NeoX flags whose output tokenload does not reproduce."""
    from ..errors import ConfigError

    if args.split_sentences or args.keep_newlines or args.lang is not None:
        raise ConfigError(
            "--split-sentences/--keep-newlines/--lang ask for one sequence per sentence"
            " (NLTK punkt,"
            " BERT-style data); tokenload writes one sequence per document",
            hint="drop these flags for GPT pretraining data (Megatron's default); split sentences"
            " beforehand and pass each document's sentences as a JSON list to get one sequence"
            " each",
        )
    if args.partitions < 1:
        raise ConfigError(f"--partitions is {args.partitions}, expected >= 1", hint="omit it")
    if args.partitions > 1 and not args.keep_sequential_samples:
        raise ConfigError(
            f"--partitions {args.partitions} deals the input lines round-robin to partitions and"
            " merges them in partition order, so Megatron's documents come out reordered; tokenload"
            " keeps the input order",
            hint="add --keep-sequential-samples (Megatron then keeps the input order, as tokenload"
            " does) or drop --partitions; use --workers for parallelism",
        )
    if args.dataset_impl != "mmap":
        raise ConfigError(
            f"--dataset-impl {args.dataset_impl}: only mmap (Megatron's .bin/.idx) is written",
            hint="drop --dataset-impl or pass mmap; lazy and cached are GPT-NeoX's legacy formats",
        )
    if args.ftfy:
        raise ConfigError(
            "--ftfy repairs text with the ftfy package before tokenizing, which tokenload does"
            " not do",
            hint="run ftfy over the input first, or drop --ftfy",
        )


def _check_runtime_flags(args: argparse.Namespace) -> None:
    """ConfigError for a missing tokenizer type (required here, as in Megatron; a library caller
    must give a ``TokenizerSpec``, which has no default kind either)."""
    from ..errors import ConfigError

    if args.tokenizer_type is None:
        raise ConfigError(
            "no --tokenizer-type given (required, as in Megatron's preprocess_data.py)",
            hint="pass e.g. --tokenizer-type HuggingFaceTokenizer --tokenizer-model tokenizer.json,"
            " GPT2BPETokenizer --vocab-file --merge-file, TikTokenizer or GPTSentencePieceTokenizer"
            " --tokenizer-model FILE, or ByteTokenizer (UTF-8 bytes, EOD 256, no files)",
        )
