"""What a preprocess job is: the tokenizer to use and the job's inputs, outputs and policies.

Both are frozen keyword-only dataclasses validated on construction, so a bad value fails before any
file is read. The CLI maps its flags onto exactly these objects; a library caller builds them
directly. Everything that changes output bytes is here; the number of workers and the executor are
too, but they never change a byte (the pipeline guarantees it).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from ..errors import ConfigError
from .hf import is_dataset_object

#: Canonical tokenizer kinds, then the Megatron-LM / GPT-NeoX names accepted for each.
TOKENIZER_KINDS = ("byte", "huggingface", "gpt2", "tiktoken", "sentencepiece")
_KIND_ALIASES = {
    "bytes": "byte",
    "ByteTokenizer": "byte",
    "hf": "huggingface",
    "HuggingFaceTokenizer": "huggingface",
    "HFTokenizer": "huggingface",
    "GPT2BPETokenizer": "gpt2",
    "HFGPT2Tokenizer": "gpt2",
    "gpt2-bpe": "gpt2",
    "TikTokenizer": "tiktoken",
    "TiktokenTokenizer": "tiktoken",
    "GPTSentencePieceTokenizer": "sentencepiece",
    "Llama2Tokenizer": "sentencepiece",
    "SPMTokenizer": "sentencepiece",
}
TIKTOKEN_PATTERNS = ("gpt2", "r50k", "p50k", "cl100k", "o200k")
INPUT_FORMATS = ("auto", "jsonl", "parquet", "arrow", "text", "lines")
EXECUTORS = ("auto", "threads", "processes", "ray")
ENGINES = ("auto", "gigatoken", "native")
BAD_RECORD_POLICIES = ("error", "skip")


def canonical_kind(name: str) -> str:
    """The canonical tokenizer kind for ``name`` (a kind or a Megatron/NeoX tokenizer type)."""
    kind = _KIND_ALIASES.get(name, name)
    if kind not in TOKENIZER_KINDS:
        known = ", ".join(TOKENIZER_KINDS + tuple(_KIND_ALIASES))
        raise ConfigError(
            f"unknown tokenizer type {name!r}",
            hint=f"use one of: {known}"
            + (
                " (Megatron's SentencePieceTokenizer adds its own <EOD> token; use"
                " GPTSentencePieceTokenizer for a .model whose EOS ends documents)"
                if name == "SentencePieceTokenizer"
                else ""
            ),
        )
    return kind


@dataclass(frozen=True, kw_only=True)
class TokenizerSpec:
    """Which tokenizer to load; picklable, so worker processes rebuild the same tokenizer."""

    kind: str
    """One of TOKENIZER_KINDS or a Megatron name (HuggingFaceTokenizer, GPT2BPETokenizer,
    ByteTokenizer, ...); required, as Megatron requires --tokenizer-type."""
    model: str | None = None
    """tokenizer.json or local HF model folder (huggingface), .tiktoken file, or .model file."""
    vocab_file: str | None = None
    """GPT-2 vocab.json (gpt2)."""
    merge_file: str | None = None
    """GPT-2 merges.txt (gpt2)."""
    tiktoken_pattern: str | None = None
    """Split regex of a tiktoken file: gpt2/r50k/p50k/cl100k/o200k; None: from the file name."""
    eod_token: str | None = None
    """Token text ending each document (overrides the kind's default, e.g. ``</s>``)."""
    eod_id: int | None = None
    """Token id ending each document (overrides eod_token and the kind's default)."""
    add_special_tokens: bool = True
    """huggingface: apply the tokenizer's post-processor (BOS etc.), as Megatron does by default."""
    engine: str = "auto"
    """auto: gigatoken where it gives the same ids; gigatoken: require it; native: never use it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", canonical_kind(self.kind))
        _check_choice("engine", self.engine, ENGINES)
        if self.kind == "gpt2":
            if not (self.vocab_file and self.merge_file):
                raise ConfigError(
                    "the gpt2 tokenizer needs both a vocab file and a merge file",
                    hint="pass `vocab_file='vocab.json'` and `merge_file='merges.txt'`",
                )
        elif self.kind in ("huggingface", "tiktoken", "sentencepiece") and not self.model:
            what = {
                "huggingface": "a tokenizer.json or a local model folder",
                "tiktoken": "a .tiktoken file",
                "sentencepiece": "a SentencePiece .model file",
            }
            raise ConfigError(
                f"the {self.kind} tokenizer needs {what[self.kind]}",
                hint="pass it as `model=PATH`",
            )
        if self.tiktoken_pattern is not None:
            _check_choice("tiktoken pattern", self.tiktoken_pattern, TIKTOKEN_PATTERNS)
        if self.eod_id is not None and self.eod_id < 0:
            raise ConfigError(
                f"eod_id is {self.eod_id}, expected a non-negative token id", field="eod_id"
            )


def _default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, kw_only=True)
class PreprocessConfig:
    """One preprocess job: inputs -> ``{output_prefix}_{key}_document.bin/.idx`` per JSON key."""

    inputs: tuple[str, ...]
    """Files, folders, globs or fsspec URLs; expanded in the order given, globs/folders sorted.
    A Hugging Face dataset folder (``save_to_disk`` output, or a Hub snapshot on disk) reads its
    data files; a ``datasets.Dataset`` or ``IterableDataset`` object is read in row order (not
    with ``executor="ray"``)."""
    output_prefix: str
    """Output prefix; each key writes ``{output_prefix}_{key}_document`` (Megatron's naming). A
    URL (``s3://bucket/path/name``) is written in a local staging folder (``TOKENLOAD_STAGING_DIR``)
    and uploaded, each index last, once the whole run has succeeded."""
    tokenizer: TokenizerSpec | None = None
    """The tokenizer; required (``TokenizerSpec(kind="byte")`` is the built-in byte-level one,
    which needs no files)."""
    json_keys: tuple[str, ...] = ("text",)
    """Keys (JSONL) or columns (parquet) to tokenize; one output per key. Text inputs use one."""
    input_format: str = "auto"
    """auto (from the extension), jsonl, parquet, text (one document per file), lines."""
    append_eod: bool = False
    """Append the EOD token to every non-empty document (Megatron's --append-eod)."""
    workers: int = field(default_factory=_default_workers)
    """Encoding workers (threads or processes; with ray, the CPUs of the local cluster it starts
    when it connects to none); never changes the output."""
    executor: str = "auto"
    """auto: threads when the tokenizer releases the GIL, processes otherwise; ray: tasks on a Ray
    cluster (one per input file and per byte range of a large file; needs tokenload[ray])."""
    ray_address: str | None = None
    """ray: the cluster to join (as ``ray.init(address=...)``); None: RAY_ADDRESS, else a local
    cluster of ``workers`` CPUs started for the run. The work folder must be on a filesystem
    every node sees (next to the output), or the output a URL: the parts then go under a work
    prefix in object storage (``{output_prefix}.tokenload-work/``)."""
    ray_cpus_per_task: float = 1.0
    """ray: CPUs Ray reserves for each task."""
    ray_tasks_in_flight: int | None = None
    """ray: most tasks submitted and unfinished at once; None: twice the tasks the cluster's CPUs
    run at once. Bounds the driver's bookkeeping, not the data: tasks read their own bytes."""
    range_bytes: int = 256 << 20
    """ray: uncompressed JSONL/lines files larger than this are split into byte ranges of this
    size, each a task (cuts fall on line starts, found by the task itself). Any executor: a
    ``datasets.Dataset`` input is cut into row ranges of about this many bytes, each resumable."""
    on_bad_record: str = "error"
    """error: stop at the first bad record with file:line; skip: skip and count by reason."""
    num_shards: int = 1
    """Split the input files into this many contiguous shards (one per machine)."""
    shard_index: int = 0
    """Which shard this job writes."""
    chunk_bytes: int = 4 << 20
    """Input bytes per work item; bounds memory at about 3 x workers x chunk_bytes."""
    resume: bool = True
    """Reuse finished per-file parts from an interrupted run of the same job."""

    def __post_init__(self) -> None:
        if isinstance(self.inputs, (str, os.PathLike)) or is_dataset_object(self.inputs):
            object.__setattr__(self, "inputs", (self.inputs,))
        object.__setattr__(
            self, "inputs", tuple(i if is_dataset_object(i) else os.fspath(i) for i in self.inputs)
        )
        object.__setattr__(self, "json_keys", tuple(self.json_keys))
        object.__setattr__(self, "output_prefix", os.fspath(self.output_prefix))
        if not self.inputs:
            raise ConfigError(
                "no input given",
                hint="pass files, folders, globs or URLs as `inputs=` (one or more)",
            )
        if not self.output_prefix or self.output_prefix.endswith(("/", os.sep)):
            raise ConfigError(
                f"output prefix {self.output_prefix!r} names a folder, not a file prefix",
                hint="use e.g. `output_prefix='data/corpus'`"
                " (writes data/corpus_text_document.bin)",
            )
        if not isinstance(self.tokenizer, TokenizerSpec):
            raise ConfigError(
                f"tokenizer is {self.tokenizer!r}, expected a TokenizerSpec",
                hint="pass tokenizer=TokenizerSpec(kind=...), e.g. kind='huggingface' with"
                " model='tokenizer.json', or kind='byte' for UTF-8 bytes (no files)",
            )
        _check_keys(self.json_keys)
        _check_choice("input format", self.input_format, INPUT_FORMATS)
        _check_choice("executor", self.executor, EXECUTORS)
        _check_choice("on_bad_record", self.on_bad_record, BAD_RECORD_POLICIES)
        if self.workers < 1:
            raise ConfigError(
                f"workers is {self.workers}, expected at least 1",
                field="workers",
                hint=f"leave out `workers=` to use every usable CPU ({_default_workers()} here),"
                " or give a positive count",
            )
        if self.num_shards < 1 or not 0 <= self.shard_index < self.num_shards:
            raise ConfigError(
                f"shard index {self.shard_index} of {self.num_shards} shards is out of range",
                hint="`shard_index=` must be in [0, `num_shards=`)",
            )
        if self.chunk_bytes < 1024:
            raise ConfigError(
                f"chunk_bytes is {self.chunk_bytes}, expected at least 1 KiB (1024 bytes)",
                field="chunk_bytes",
                hint="leave out `chunk_bytes=` for the default of 4 MB (2**22 bytes) per work item",
            )
        _check_ray(self)
        if self.input_format in ("text", "lines") and len(self.json_keys) != 1:
            raise ConfigError(
                "plain text inputs have a single text field, but several keys were given",
                hint="give one key in `json_keys=` (it names the output file) for text inputs",
            )

    @property
    def shard_prefix(self) -> str:
        """The prefix this shard writes: the output prefix, or with ``-{i:05d}-of-{n:05d}``."""
        return shard_prefix(self.output_prefix, self.shard_index, self.num_shards)

    def output_for(self, key: str) -> str:
        """Token file prefix written for ``key``."""
        return output_name(self.shard_prefix, key)

    @property
    def outputs(self) -> dict[str, str]:
        return {key: self.output_for(key) for key in self.json_keys}


def shard_prefix(output_prefix: str, index: int, count: int) -> str:
    """Shard ``index`` of ``count``'s prefix: the output prefix itself when there is one shard."""
    return output_prefix if count == 1 else f"{output_prefix}-{index:05d}-of-{count:05d}"


def output_name(prefix: str, key: str) -> str:
    """Token file prefix for JSON key ``key`` (Megatron's ``{prefix}_{key}_document``)."""
    return f"{prefix}_{key}_document"


def _check_ray(config: PreprocessConfig) -> None:
    if not (math.isfinite(config.ray_cpus_per_task) and config.ray_cpus_per_task > 0):
        raise ConfigError(
            f"ray_cpus_per_task is {config.ray_cpus_per_task}, expected a positive number",
            field="ray_cpus_per_task",
            hint="leave out `ray_cpus_per_task=` for one CPU per task",
        )
    if config.ray_tasks_in_flight is not None and config.ray_tasks_in_flight < 1:
        raise ConfigError(
            f"ray_tasks_in_flight is {config.ray_tasks_in_flight}, expected at least 1",
            field="ray_tasks_in_flight",
            hint="leave out `ray_tasks_in_flight=` for twice the tasks the cluster's CPUs run"
            " at once",
        )
    if config.range_bytes < config.chunk_bytes:
        raise ConfigError(
            f"`range_bytes={config.range_bytes}` is smaller than"
            f" `chunk_bytes={config.chunk_bytes}`",
            hint="a byte range holds whole chunks: raise `range_bytes=` or lower `chunk_bytes=`",
        )
    if config.ray_address is not None and config.executor != "ray":
        raise ConfigError(
            f"a Ray address ({config.ray_address!r}) was given, but the executor is"
            f" {config.executor!r}",
            hint="add `executor='ray'`, or drop `ray_address=`",
        )


def _check_keys(keys: tuple[str, ...]) -> None:
    if not keys:
        raise ConfigError(
            "no JSON key given", hint="name at least one key in `json_keys=`, e.g. text"
        )
    if len(set(keys)) != len(keys):
        raise ConfigError(f"JSON keys {list(keys)} repeat a key", hint="list each key once")
    for key in keys:
        if not key or "/" in key or os.sep in key:
            raise ConfigError(
                f"JSON key {key!r} cannot name an output file",
                hint="keys become part of the output file name; use plain names such as 'text'",
            )


def _check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{what} is {value!r}, expected one of {', '.join(choices)}")


def shard_from_environment(environ: dict[str, str] | None = None) -> tuple[int, int] | None:
    """(index, count) from a torchrun (RANK/WORLD_SIZE) or SLURM launch, or None outside one."""
    env = os.environ if environ is None else environ
    for rank_var, size_var in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if rank_var in env and size_var in env:
            try:
                index, count = int(env[rank_var]), int(env[size_var])
            except ValueError:
                raise ConfigError(
                    f"{rank_var}={env[rank_var]!r} / {size_var}={env[size_var]!r} are not integers",
                    hint="pass `num_shards=` and `shard_index=` explicitly",
                ) from None
            return index, count
    return None
