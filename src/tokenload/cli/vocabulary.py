"""The command line's vocabulary for the library's: each configuration field a library message
names (`` `on_bad_record='skip'` ``, see ``tokenload.errors.FIELD``) and the flag that sets it
(``--on-bad-record skip``), in this one table.

``main`` prints every ``TokenloadError`` through ``error_in_flags``, so the user of a command
reads the flags they typed, while a Python caller of the same library reads the keywords it
passes. A field with no entry is printed as the library wrote it.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Callable

from ..errors import FIELD, TokenloadError


def _mib(value: str) -> str:
    """A byte count as the MB a ``--*-mb`` flag takes (a placeholder is kept)."""
    try:
        return f"{int(value) / (1 << 20):g}"
    except ValueError:
        return value


#: Field (or ``field=value``, for a value that is a flag of its own) -> flag, or (flag, the
#: value's spelling on the command line from the library's).
FLAGS: dict[str, str | tuple[str, Callable[[str], str]]] = {
    # PreprocessConfig (tokenload preprocess)
    "inputs": "--input",
    "output_prefix": "--output-prefix",
    "json_keys": "--json-keys",
    "input_format": "--input-format",
    "append_eod": "--append-eod",
    "append_eod=True": "--append-eod",
    "workers": "--workers",
    "executor": "--executor",
    "ray_address": "--ray-address",
    "ray_cpus_per_task": "--ray-cpus-per-task",
    "ray_tasks_in_flight": "--ray-tasks-in-flight",
    "range_bytes": ("--range-mb", _mib),
    "chunk_bytes": ("--chunk-mb", _mib),
    "on_bad_record": "--on-bad-record",
    "num_shards": "--num-shards",
    "shard_index": "--shard-index",
    "resume=False": "--restart",
    # TokenizerSpec (tokenload preprocess)
    "kind": "--tokenizer-type",
    "model": "--tokenizer-model",
    "vocab_file": "--vocab-file",
    "merge_file": "--merge-file",
    "tiktoken_pattern": "--tiktoken-pattern",
    "eod_token": "--eod-token",
    "eod_id": "--eod-id",
    "engine": "--engine",
    "add_special_tokens=False": "--tokenizer-hf-no-include-special-tokens",
    # write_stdlib_corpus (tokenload corpus)
    "max_bytes": "--max-mb",
    "min_bytes": "--min-mb",
    # DoctorConfig (tokenload doctor)
    "split": "--split",
    "compare": "--compare",
    "train_samples": "--train-samples",
    "train_iters": "--train-iters",
    "global_batch_size": "--global-batch-size",
    "eval_iters": "--eval-iters",
    "eval_interval": "--eval-interval",
    # megatron_config_from_args' world size (tokenload prepare-cache)
    "world_size": "--prepare-cache-world-size",
    # MegatronDataConfig (tokenload prepare-cache)
    "path_to_cache": "--data-cache-path",
    "mid_level_dataset_surplus": "--mid-level-dataset-surplus",
    # MegatronDataConfig (prepare-cache, explain, where, doctor)
    "sequence_length": "--seq-length",
    "random_seed": "--seed",
    "packing": "--packing",
    "max_documents_per_row": "--max-documents-per-row",
    # merge_token_files (tokenload merge) shares output_prefix with preprocess; check_file (verify)
    "vocab_size": "--vocab-size",
}


def to_flags(text: str) -> str:
    """``text`` with every field it names (``FIELD``) written as its flag; a message that gave
    both the field and its flag (`` `path_to_cache=`, `--data-cache-path` ``) names the flag
    once."""
    return _TWICE.sub(r"\1", FIELD.sub(_flag, text))


_TWICE = re.compile(r"(--[\w-]+(?: [^\s,()`]+)?), `\1`")


def error_in_flags(exc: TokenloadError) -> tuple[str, str | None]:
    """The error's message and hint with their fields written as flags, the field whose value
    the message states (``workers is 0, ...``) included."""
    message = to_flags(exc.message)
    entry = FLAGS.get(exc.field or "")
    if entry is not None and message.startswith(f"{exc.field} is "):
        flag, spell = (entry, _literal) if isinstance(entry, str) else entry
        value, sep, rest = message[len(f"{exc.field} is ") :].partition(",")
        message = f"{flag} is {spell(value)}{sep}{rest}"
    return message, None if exc.hint is None else to_flags(exc.hint)


def _flag(match: re.Match[str]) -> str:
    name, value = match.group(1), match.group(2)
    exact = FLAGS.get(f"{name}={value}")
    if isinstance(exact, str):
        return exact
    entry = FLAGS.get(name)
    if entry is None:
        return match.group(0)
    flag, spell = (entry, _literal) if isinstance(entry, str) else entry
    return f"{flag} {spell(value)}" if value else flag


def _literal(value: str) -> str:
    """A Python string literal as typed in a shell (``'skip'`` -> ``skip``, a glob quoted); any
    other value (a number, a placeholder) as it is."""
    if value[:1] in ("'", '"'):
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
        if isinstance(parsed, str):
            return shlex.quote(parsed)
    return value
