"""Megatron-LM's training flags that decide a job's data, as argparse groups, and their
arithmetic: the blend flags (``--data-path``, per-split paths, args files), the batch and length
flags with Megatron's sample counts (``validate_args`` + ``update_train_iters`` +
``get_train_valid_test_num_samples`` of megatron-core 0.19.2, a ``--step-batch-size-schedule``
included; ``--rampup-batch-size`` accepted and ignored, as there), the item flags,
and the tokenizer identity that enters every cache name. Shared by ``tokenload prepare-cache`` and
``MegatronDataConfig.from_megatron_args`` (a leaf of the package: it imports only ``errors`` and
``index``).

Its messages name Megatron's flags (``--seq-length``): they are the vocabulary of its input, a
training job's command line, for a Python caller as for ``prepare-cache``. The one setting that
is tokenload's own, the job's world size, is named as the field `` `world_size=` `` (the command
line prints its flag, ``--prepare-cache-world-size``).
"""

from __future__ import annotations

import argparse
import bisect
import functools
import itertools
import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from .index import Blend

logger = logging.getLogger(__name__)


def positive(kind: Callable[[str], int | float]) -> Callable[[str], int | float]:
    """An argparse ``type`` that parses with ``kind`` and refuses zero, negative and non-finite
    values (``inf``, ``nan``, ``1e999``)."""
    return _bounded(kind, 0, inclusive=False, label="positive")


def at_least(kind: Callable[[str], int | float], low: int | float) -> Callable[[str], int | float]:
    """An argparse ``type`` that parses with ``kind`` and refuses values below ``low`` and
    non-finite ones."""
    return _bounded(kind, low, inclusive=True, label=f">= {low}")


def _bounded(
    kind: Callable[[str], int | float], low: float, *, inclusive: bool, label: str
) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        noun = "an integer" if kind is int else "a number"
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number")
        if not (value >= low if inclusive else value > low):
            relation = "at least" if inclusive else "greater than"
            raise argparse.ArgumentTypeError(f"{text} must be {relation} {low}")
        return value

    parse.__name__ = f"{label} {kind.__name__}"
    return parse


#: Megatron's ``--split`` when ``--data-path`` comes without one (it warns and uses this).
LEGACY_SPLIT = "969, 30, 1"
#: The class of megatron-core's NullTokenizer, as its ``unique_identifiers`` name it.
NULL_TOKENIZER_CLASS = "megatron.core.tokenizers.text.models.default_tokenizer.DefaultTokenizerText"


def blend_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data (Megatron's flags)")
    g.add_argument(
        "--data-path",
        nargs="*",
        metavar="W_OR_PREFIX",
        help="one prefix, prefixes, or weight/prefix pairs 'W1 P1 W2 P2 ...', split by --split",
    )
    g.add_argument("--data-args-path", metavar="FILE", help="a file holding the --data-path list")
    for split in ("train", "valid", "test"):
        g.add_argument(
            f"--{split}-data-path",
            nargs="*",
            metavar="W_OR_PREFIX",
            help=f"the {split} split's own blend (instead of --data-path)",
        )
    g.add_argument(
        "--per-split-data-args-path",
        metavar="JSON",
        help='a JSON {"train": ..., "valid": ..., "test": ...} of per-split blends',
    )


def blends_of(args: argparse.Namespace) -> tuple[Blend | None, list[Blend | None] | None]:
    """``(blend, blend_per_split)`` from the data flags, as Megatron's
    ``get_blend_and_blend_per_split`` reads them; exactly one of the two is not None."""
    single = [f for f in ("data_path", "data_args_path") if getattr(args, f) is not None]
    split_flags = [f"{s}_data_path" for s in ("train", "valid", "test")]
    per_split = [
        f for f in (*split_flags, "per_split_data_args_path") if getattr(args, f) is not None
    ]
    given = single + per_split
    if not given:
        raise ConfigError(
            "no data: expected --data-path, --data-args-path, --train/valid/test-data-path or"
            " --per-split-data-args-path",
            hint="pass the training job's data flags (Megatron's --mock-data has no token files)",
        )
    if (
        len(single) > 1
        or (single and per_split)
        or ("per_split_data_args_path" in per_split and len(per_split) > 1)
    ):
        names = ", ".join("--" + f.replace("_", "-") for f in given)
        raise ConfigError(
            f"{names} are given together; expected one way of naming the data",
            hint="use --data-path (with --split) or the per-split flags, as Megatron",
        )
    if per_split and getattr(args, "split", None) is not None:
        names = ", ".join("--" + f.replace("_", "-") for f in per_split)
        raise ConfigError(
            f"--split {args.split!r} is given with {names}; a split string divides one blend,"
            " and per-split data has none to divide (megatron-core asserts that split and"
            " blend_per_split are incompatible)",
            hint="drop --split, or name the data with --data-path and keep --split",
        )
    if args.data_args_path is not None:
        from .index import read_data_args_file

        return read_data_args_file(args.data_args_path), None
    if args.data_path is not None:
        return _blend("--data-path", args.data_path), None
    if args.per_split_data_args_path is not None:
        from .index import read_per_split_data_args

        return None, list(read_per_split_data_args(args.per_split_data_args_path))
    return None, [
        None if getattr(args, f) is None else _blend(f"--{f.replace('_', '-')}", getattr(args, f))
        for f in split_flags
    ]


def _blend(flag: str, items: list[str]) -> Blend:
    if not items:
        raise ConfigError(
            f"{flag} is given without prefixes",
            hint=f"write {flag} PREFIX or {flag} W1 PREFIX1 W2 PREFIX2 ...",
        )
    from .index import parse_blend  # the index package (and NumPy) only when a blend is parsed

    blend = parse_blend(items)
    assert blend is not None
    return blend


TOKENIZER_TYPES = (
    "BertWordPieceLowerCase",
    "BertWordPieceCase",
    "GPT2BPETokenizer",
    "SentencePieceTokenizer",
    "GPTSentencePieceTokenizer",
    "HuggingFaceTokenizer",
    "Llama2Tokenizer",
    "TikTokenizer",
    "MultimodalTokenizer",
    "NullTokenizer",
    "NullMultimodalTokenizer",
    "SFTTokenizer",
)
"""megatron-core 0.19.2's ``--tokenizer-type`` choices (``training_config.py``)."""

TOKENIZER_VALUE_FLAGS = (
    "--tokenizer-model",
    "--vocab-file",
    "--merge-file",
    "--tiktoken-pattern",
    "--tokenizer-metadata",
    "--vocab-extra-ids",
    "--tiktoken-num-special-tokens",
    "--chat-template",
)
"""Megatron's tokenizer flags with a value, read by the importer and accepted by prepare-cache
(whose cache names take the tokenizer's identity, ``--tokenizer-identity``, instead)."""


def loader_flags(g: argparse._ActionsContainer) -> None:
    """Megatron's data-loading flags that change no index cache (how files are read, the items'
    layout, the loader): the importer maps them; prepare-cache accepts them from the job's
    command line."""
    g.add_argument("--dataloader-fast-cache-load", action="store_true")
    g.add_argument("--dataloader-defer-npy-index-mmap", action="store_true")
    g.add_argument("--no-mmap-bin-files", dest="mmap_bin_files", action="store_false")
    g.add_argument("--dataloader-inter-document-masking", action="store_true")
    g.add_argument("--num-workers", type=int, default=2)
    g.add_argument("--dataloader-type", choices=("single", "cyclic", "external"))
    for flag in TOKENIZER_VALUE_FLAGS:
        g.add_argument(flag)


def tokenload_flags(g: argparse._ActionsContainer) -> None:
    """The flags tokenload's Megatron-LM provider adds to Megatron's (``integrations.megatron``),
    which the flag importer also reads, so that the provider's training command imports as is."""
    g.add_argument(
        "--tokenload-dataloader-type",
        choices=("single", "cyclic"),
        default=None,
        help="the order of tokenload's loader under --dataloader-type external: Megatron's"
        " single (default) or cyclic sampler",
    )
    g.add_argument(
        "--tokenload-packing",
        choices=("concat", "best-fit"),
        default=None,  # concat; None tells a command that does not give the flag
        help="how a sample is made: Megatron's concatenated samples (default) or rows of whole"
        " documents, best-fit, with position ids (and cu_seqlens under"
        " --dataloader-inter-document-masking) per document",
    )


def batch_flags(g: argparse._ActionsContainer) -> None:
    g.add_argument("--global-batch-size", type=positive(int), help="samples per iteration")
    g.add_argument(
        "--micro-batch-size",
        type=positive(int),
        help="without --global-batch-size: global = micro x data-parallel size",
    )
    g.add_argument(
        "--prepare-cache-world-size",
        type=positive(int),
        default=1,
        help="the job's number of processes, for the data-parallel size",
    )
    g.add_argument("--tensor-model-parallel-size", type=positive(int), default=1)
    g.add_argument("--pipeline-model-parallel-size", type=positive(int), default=1)
    g.add_argument("--context-parallel-size", type=positive(int), default=1)
    g.add_argument("--train-iters", type=at_least(int, 0), help="training iterations")
    g.add_argument(
        "--train-samples",
        type=at_least(int, 0),
        help="training samples (iterations = samples // global batch, or by the schedule)",
    )
    g.add_argument(
        "--step-batch-size-schedule",
        metavar="'THRESHOLD:BS ...'",
        help="the global batch per step from a count of consumed tokens (samples without a"
        " sequence length), e.g. '0:256 1B:512' (megatron-core's; replaces --global-batch-size)",
    )
    g.add_argument(
        "--rampup-batch-size",
        nargs=3,
        type=int,
        metavar=("START", "INCREMENT", "SAMPLES"),
        help="deprecated and ignored, as in megatron-core 0.19 (use --step-batch-size-schedule)",
    )
    g.add_argument(
        "--eval-iters", type=at_least(int, 0), default=100, help="iterations per evaluation"
    )
    g.add_argument("--eval-interval", type=positive(int), help="iterations between evaluations")
    g.add_argument(
        "--start-eval-at-iter", type=at_least(int, 0), help="no evaluation before this iteration"
    )
    g.add_argument(
        "--eval-global-batch-size", type=positive(int), help="evaluation batch (default: global)"
    )
    g.add_argument(
        "--eval-micro-batch-size",
        type=positive(int),
        help="evaluation micro-batch (default: --micro-batch-size); sizes no split",
    )
    g.add_argument(
        "--skip-train", action="store_true", help="evaluation only: valid = eval_iters x batch"
    )
    g.add_argument(
        "--full-validation", action="store_true", help="one full epoch of the valid split"
    )


def item_flags(g: argparse._ActionsContainer) -> None:
    g.add_argument(
        "--mid-level-dataset-surplus",
        type=at_least(float, 0),
        default=0.005,
        help="extra samples built per blended dataset (enters the sizes)",
    )
    g.add_argument(
        "--no-add-extra-token",
        dest="add_extra_token",
        action="store_false",
        help="samples of S tokens, not S + 1 (tokenload's option)",
    )
    g.add_argument(
        "--no-drop-last-partial-validation-sequence",
        dest="drop_last_partial_validation_sequence",
        action="store_false",
        help="keep the valid split's last partial sample",
    )
    for flag in (
        "--eod-mask-loss",
        "--no-create-attention-mask-in-dataloader",
        "--reset-position-ids",
        "--reset-attention-mask",
    ):
        g.add_argument(
            flag, action="store_true", help="accepted; changes no cache (not in Megatron's hash)"
        )


def tokenizer_flags(g: argparse._ActionsContainer) -> None:
    g.add_argument(
        "--tokenizer-identity",
        metavar="JSON_OR_FILE",
        help="the 'tokenizer' object of one of Megatron's ...-description.txt files, or"
        " a file holding it or a whole description",
    )
    g.add_argument(
        "--tokenizer-type",
        choices=TOKENIZER_TYPES,
        help="NullTokenizer: its identity is derived (with --vocab-size)",
    )
    g.add_argument("--vocab-size", type=positive(int), help="NullTokenizer's vocabulary size")
    g.add_argument(
        "--null-tokenizer-eod-id", type=int, help="NullTokenizer's eod id, when the job sets it"
    )
    g.add_argument("--null-tokenizer-pad-id", type=int, default=-1, help="NullTokenizer's pad id")


_SCHEDULE_FLAG = "--step-batch-size-schedule"
_SCHEDULE_FORM = (
    "space- or comma-separated THRESHOLD:BATCH entries, the first at threshold 0, thresholds"
    " strictly increasing, numbers with an optional K, M, B or T suffix (e.g. '0:256 2.5B:512')"
)
_SUFFIXES = (("T", 1_000_000_000_000), ("B", 1_000_000_000), ("M", 1_000_000), ("K", 1_000))


@dataclass(frozen=True)
class StepBatchSchedule:
    """megatron-core 0.19.2's ``--step-batch-size-schedule "THRESHOLD:BS ..."``
    (``StepBatchsizeNumMicroBatchesCalculator``): the global batch of a step is the batch of the
    last entry whose threshold is at most the samples consumed before the step. Thresholds are
    tokens when the job has a sequence length (megatron.training passes ``--seq-length``:
    ``threshold // seq_length`` samples), samples otherwise. ``update_num_microbatches`` sets the
    batch before every step from ``consumed_train_samples``; the schedule changes how many
    micro-batches a step takes, never which sample comes next (the order is a function of the
    samples consumed).

    ``steps`` holds ``(threshold in samples, global batch)`` pairs as megatron-core parses and
    sorts them. Walking the steps goes one entry at a time (however many steps), with whole-number
    arithmetic that gives the step-by-step loop's counts."""

    text: str
    """The flag's value as given."""
    seq_length: int | None
    """Thresholds are tokens (converted with ``//``) when set, samples when None."""
    steps: tuple[tuple[int, int], ...]

    @classmethod
    def parse(cls, text: str, seq_length: int | None = None) -> StepBatchSchedule:
        """megatron-core's ``_parse_schedule`` and ``_validate_schedule``; where it raises
        (``ValueError``, ``OverflowError``, ``AssertionError``, ``ZeroDivisionError``), a
        ConfigError that says which entry and why."""
        flag = f"{_SCHEDULE_FLAG} {text!r}"
        if seq_length is not None and seq_length <= 0:
            raise ConfigError(
                f"{flag} with --seq-length {seq_length}: token thresholds need a positive"
                " sequence length",
                hint="pass the job's --seq-length",
            )
        steps = []
        for entry in text.strip().replace(",", " ").split():
            if ":" not in entry:
                raise ConfigError(
                    f"{flag}: entry {entry!r} has no ':'; expected {_SCHEDULE_FORM}",
                    hint="write each entry as THRESHOLD:BATCH, e.g. '0:256 2.5B:512'",
                )
            threshold_text, batch_text = entry.split(":", 1)
            threshold = _schedule_number(threshold_text, "threshold", entry, flag)
            batch = _schedule_number(batch_text, "batch", entry, flag)
            if seq_length is not None:
                threshold = threshold // seq_length
            steps.append((threshold, batch))
        steps.sort(key=lambda step: step[0])
        unit = "samples" if seq_length is None else f"samples: tokens // --seq-length {seq_length}"
        if not steps:
            raise ConfigError(
                f"{flag} has no entry; expected {_SCHEDULE_FORM}",
                hint="give at least '0:BATCH', or drop the flag and pass --global-batch-size",
            )
        if steps[0][0] != 0:
            raise ConfigError(
                f"{flag}: the smallest threshold is {steps[0][0]} ({unit}); expected 0"
                " (megatron-core asserts the schedule starts at 0)",
                hint="begin the schedule with an entry '0:BATCH'",
            )
        for (before, _), (after, _) in itertools.pairwise(steps):
            if after <= before:
                raise ConfigError(
                    f"{flag}: two thresholds are both {after} ({unit}); expected strictly"
                    " increasing thresholds (megatron-core asserts them)",
                    hint="give every entry its own threshold (token thresholds less than"
                    " --seq-length apart fall on the same sample)",
                )
        for threshold, batch in steps:
            if batch <= 0:
                raise ConfigError(
                    f"{flag}: the batch at threshold {threshold} ({unit}) is {batch}; expected"
                    " a positive batch (megatron-core asserts it; a fraction is truncated)",
                    hint="give every entry a batch of at least 1",
                )
        return cls(text, seq_length, tuple(steps))

    @property
    def global_batch_size(self) -> int:
        """The last entry's batch (megatron-core's calculator's ``global_batch_size``)."""
        return self.steps[-1][1]

    def batch_at(self, consumed: int) -> int:
        """The global batch of the step that starts after ``consumed`` samples
        (``update_num_microbatches(consumed)`` + ``get_current_global_batch_size()``)."""
        at = bisect.bisect_right([t for t, _ in self.steps], consumed) - 1
        return self.steps[max(at, 0)][1]

    @functools.cached_property
    def segments(self) -> tuple[tuple[int, int, int], ...]:
        """``(first step, samples consumed before it, global batch)`` of each run of steps of
        one batch, walked one entry at a time: a step's batch is the last entry's at or below
        the samples consumed before it, so a run ends at the first step that starts at or past
        the next threshold (the last run goes on for ever)."""
        thresholds = [t for t, _ in self.steps]
        out: list[tuple[int, int, int]] = []
        step = consumed = 0
        while True:
            at = bisect.bisect_right(thresholds, consumed) - 1
            batch = self.steps[at][1]
            out.append((step, consumed, batch))
            if at + 1 == len(self.steps):
                return tuple(out)
            n = -(-(thresholds[at + 1] - consumed) // batch)  # >= 1: the threshold is ahead
            step, consumed = step + n, consumed + n * batch

    def consumed_samples(self, iterations: int) -> int:
        """The samples consumed by ``iterations`` training steps: Megatron's
        ``consumed_train_samples`` then (what a resume from that iteration passes as
        ``consumed_samples``), as long as every step's batch is a multiple of micro batch x
        data-parallel size (Megatron's training loop asserts it at each step)."""
        runs = self.segments
        first, before, batch = runs[bisect.bisect_right(runs, (iterations, 1 << 62, 0)) - 1]
        return before + (iterations - first) * batch

    def step_ending_at(self, consumed: int) -> int | None:
        """The steps done when exactly ``consumed`` samples are consumed, or None when
        ``consumed`` falls inside a step (the inverse of ``consumed_samples``)."""
        if consumed < 0:
            return None
        runs = self.segments
        at = bisect.bisect_right([before for _, before, _ in runs], consumed) - 1
        first, before, batch = runs[at]
        done, into = divmod(consumed - before, batch)
        return first + done if into == 0 else None

    def batch_of_step(self, iteration: int) -> int:
        """The global batch of training step ``iteration`` (counted from 0)."""
        return self.batch_at(self.consumed_samples(iteration))

    def train_iters(self, train_samples: int) -> int:
        """megatron-core 0.19.2's ``update_train_iters`` with a schedule: steps while fewer than
        ``train_samples`` are consumed (the last one may go past it)."""
        if train_samples <= 0:
            return 0
        runs = self.segments
        at = bisect.bisect_left([before for _, before, _ in runs], train_samples) - 1
        first, before, batch = runs[at]
        return first + -(-(train_samples - before) // batch)


def _schedule_number(text: str, what: str, entry: str, flag: str) -> int:
    """megatron-core's ``_parse_numeric_value``: ``int(float(number) * suffix)``."""
    value = text.strip().upper()
    multiplier = 1
    for suffix, factor in _SUFFIXES:
        if value.endswith(suffix):
            multiplier, value = factor, value[:-1]
            break
    try:
        return int(float(value) * multiplier)
    except (ValueError, OverflowError):
        raise ConfigError(
            f"{flag}: the {what} {text!r} of entry {entry!r} is not a finite number; expected"
            f" {_SCHEDULE_FORM}",
            hint="write numbers such as 0, 512, 2.5B or 100M",
        ) from None


@dataclass(frozen=True)
class Batches:
    """The batch and length arithmetic of Megatron's training arguments."""

    world_size: int
    data_parallel_size: int
    global_batch_size: int
    train_iters: int
    samples: tuple[int | None, int | None, int | None]
    """(train, valid, test); valid None with --full-validation (one epoch)."""
    step_batch_size_schedule: StepBatchSchedule | None = None
    """``--step-batch-size-schedule``: the global batch per step, and the samples consumed by a
    step (``global_batch_size`` is then Megatron's ``micro x data-parallel size``, which sizes
    the valid and test splits and a ``--train-iters`` job's train split)."""


def batches(args: argparse.Namespace) -> Batches:
    """megatron-core 0.19.2's ``validate_args`` + ``update_train_iters`` +
    ``get_train_valid_test_num_samples``."""
    model = (
        args.tensor_model_parallel_size
        * args.pipeline_model_parallel_size
        * args.context_parallel_size
    )
    world = args.prepare_cache_world_size
    if world < 1:
        raise ConfigError(
            f"world size {world}; expected 1 or more", hint="pass the job's number of processes"
        )
    cp = args.context_parallel_size
    if cp > 1 and args.seq_length is not None and args.seq_length % (2 * cp):
        raise ConfigError(
            f"sequence length {args.seq_length} is not a multiple of 2 x context-parallel size"
            f" {cp} (megatron-core asserts it)",
            hint="check the job's --seq-length and --context-parallel-size",
        )
    if world % model:
        raise ConfigError(
            f"world size {world} is not divisible by the model-parallel size {model} (tensor x"
            " pipeline x context)",
            hint="pass the job's `world_size=` and parallel sizes",
        )
    dp = world // model
    _warn_rampup(args)
    schedule = _schedule(args)
    gbs = args.global_batch_size
    if gbs is None:
        if args.micro_batch_size is None:
            raise ConfigError(
                "no batch size: expected --global-batch-size or --micro-batch-size",
                hint="pass the job's --global-batch-size (or --micro-batch-size and `world_size=`)",
            )
        gbs = args.micro_batch_size * dp
    elif args.micro_batch_size is not None and gbs % (args.micro_batch_size * dp):
        raise ConfigError(
            f"global batch size {gbs} is not a multiple of micro batch size"
            f" {args.micro_batch_size} x data-parallel size {dp}",
            hint="check the job's batch flags",
        )
    _check_lengths(args)
    if args.train_iters:  # megatron-core's update_train_iters: a count of 0 reads the samples
        iters = args.train_iters
    elif schedule is not None:
        iters = schedule.train_iters(args.train_samples)
    else:
        iters = args.train_samples // gbs
    # megatron-core's get_train_valid_test_num_samples: ``if args.train_samples`` (0 is unset)
    train = args.train_samples if args.train_samples else iters * gbs
    if schedule is not None and args.train_iters is not None:
        consumed = schedule.consumed_samples(iters)
        if consumed > train:
            logger.warning(
                "%s with --train-iters %d: megatron-core sizes the train split as iterations x"
                " micro batch x data-parallel size = %d samples (and so does tokenload), but the"
                " schedule's %d steps consume %d; Megatron's train data ends first. Pass"
                " --train-samples to size the split for the schedule",
                _SCHEDULE_FLAG,
                iters,
                train,
                iters,
                consumed,
            )
    eval_gbs = args.eval_global_batch_size or gbs
    eval_mbs = getattr(args, "eval_micro_batch_size", None) or args.micro_batch_size
    if eval_mbs is not None and eval_gbs % (eval_mbs * dp):
        raise ConfigError(
            f"evaluation batch {eval_gbs} is not a multiple of evaluation micro-batch {eval_mbs}"
            f" x data-parallel size {dp} (megatron-core asserts it)",
            hint="check the job's --eval-global-batch-size and --eval-micro-batch-size (their"
            " defaults: --global-batch-size and --micro-batch-size)",
        )
    return Batches(
        world,
        dp,
        gbs,
        iters,
        (train, _valid_samples(args, iters, eval_gbs), args.eval_iters * eval_gbs),
        schedule,
    )


def _check_lengths(args: argparse.Namespace) -> None:
    """``--train-iters`` and ``--train-samples`` as megatron-core 0.19.2 takes them: one of the
    two (both only with ``--skip-train``, where the samples size the train split), and a train
    length it can count (``--train-iters 0`` alone fails there: no samples to count)."""
    iters, samples = args.train_iters, args.train_samples
    both = iters is not None and samples is not None
    if both and not args.skip_train and (iters or samples):
        raise ConfigError(
            f"--train-iters {iters} and --train-samples {samples} are given together; megatron-core"
            " asserts one of them (both only with --skip-train)",
            hint="pass the job's one training length",
        )
    if not iters and samples is None:
        raise ConfigError(
            "no training length: --train-iters is 0 and --train-samples is not given"
            if iters == 0
            else "no training length: expected --train-iters or --train-samples",
            hint="pass the job's --train-iters (at least 1) or --train-samples (megatron-core"
            " fails without one)",
        )


def _warn_rampup(args: argparse.Namespace) -> None:
    """megatron-core 0.19 accepts ``--rampup-batch-size``, warns that it is deprecated and
    ignores it: every count is the one without it."""
    given = getattr(args, "rampup_batch_size", None)
    if given is not None:
        logger.warning(
            "--rampup-batch-size %s is ignored, as in megatron-core 0.19 (deprecated there: it"
            " accepts the flag and trains constant batches); the counts are those without it. For"
            " a batch that grows during training use --step-batch-size-schedule",
            " ".join(map(str, given)),
        )


def _schedule(args: argparse.Namespace) -> StepBatchSchedule | None:
    """``--step-batch-size-schedule`` checked as ``validate_args`` checks it, parsed with the
    job's sequence length as megatron.training's ``set_global_variables`` passes it."""
    text = getattr(args, "step_batch_size_schedule", None)
    if text is None:
        return None
    if args.global_batch_size is not None:
        raise ConfigError(
            f"{_SCHEDULE_FLAG} and --global-batch-size are given together; megatron-core refuses"
            " the pair (the schedule gives each step's global batch)",
            hint=f"drop --global-batch-size, or drop {_SCHEDULE_FLAG} for a constant batch",
        )
    if args.micro_batch_size is None:
        raise ConfigError(
            f"{_SCHEDULE_FLAG} needs --micro-batch-size (megatron-core asserts it): the valid and"
            " test splits are sized with micro batch x data-parallel size",
            hint="pass the job's --micro-batch-size",
        )
    return StepBatchSchedule.parse(text, getattr(args, "seq_length", None))


def _valid_samples(args: argparse.Namespace, iters: int, eval_gbs: int) -> int | None:
    if args.full_validation:
        return None
    if args.skip_train:
        samples: int = args.eval_iters * eval_gbs
        return samples
    if args.eval_interval is None:
        raise ConfigError(
            "no --eval-interval: Megatron sizes the valid split as"
            " (train_iters // eval_interval + 1)"
            " x eval_iters x global batch",
            hint="pass the job's --eval-interval, as megatron.training needs it too (it fails"
            " without one unless --skip-train, which is evaluation only); a job that never"
            " evaluates passes --eval-iters 0 with any --eval-interval",
        )
    points: int = iters // args.eval_interval + 1
    if args.start_eval_at_iter is not None:
        points = max(0, points - args.start_eval_at_iter // args.eval_interval)
    eval_iters: int = args.eval_iters
    return points * eval_iters * eval_gbs


def tokenizer_identity(args: argparse.Namespace) -> dict[str, Any] | None:
    """The tokenizer's ``unique_identifiers`` as Megatron writes them into every description:
    ``--tokenizer-identity`` (copied from one), else derived from NullTokenizer's flags. With
    both, the job's ``--tokenizer-type`` (its command line passed as it is) is one tokenload
    derives nothing from, or a NullTokenizer whose identity is the one given."""
    if args.tokenizer_identity is not None:
        given = _identity_from(args.tokenizer_identity)
        if args.tokenizer_type == "NullTokenizer" and args.vocab_size is not None:
            derived = _null_identity(args)
            if derived != given:
                raise ConfigError(
                    f"--tokenizer-identity {given} is not the identity of the job's"
                    f" NullTokenizer flags, {derived}",
                    hint="give one: the identity copied from Megatron, or NullTokenizer's flags",
                )
        return given
    if args.tokenizer_type is None:
        return None
    if args.tokenizer_type != "NullTokenizer":
        raise ConfigError(
            f"--tokenizer-type {args.tokenizer_type}: tokenload derives only NullTokenizer's"
            " identity",
            hint='copy the "tokenizer" object of one of Megatron\'s ...-description.txt files into'
            " --tokenizer-identity",
        )
    if args.vocab_size is None:
        raise ConfigError(
            "--tokenizer-type NullTokenizer needs --vocab-size", hint="pass the job's --vocab-size"
        )
    return _null_identity(args)


def _null_identity(args: argparse.Namespace) -> dict[str, Any]:
    """NullTokenizer's identity from the job's ``--vocab-size`` and its ids."""
    # megatron-core's build_tokenizer passes these keyword arguments, in this order, as strings.
    identity = {
        "class": NULL_TOKENIZER_CLASS,
        "tokenizer_path": None,
        "vocab_size": str(args.vocab_size),
    }
    if args.null_tokenizer_eod_id is not None:
        identity["eod_id"] = str(args.null_tokenizer_eod_id)
    identity["pad_id"] = str(args.null_tokenizer_pad_id)
    return identity


def json_or_file(text: str, flag: str, opening: str, hint: str) -> tuple[Any, str]:
    """A flag's JSON value given inline or as a file of it (text not starting with ``opening``
    that names a file), and where it came from (the flag or the file) for error messages."""
    source = flag
    if not text.lstrip().startswith(opening) and os.path.isfile(text):
        source = text
        with open(text, encoding="utf-8") as f:
            text = f.read()
    try:
        return json.loads(text), source
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source} is not JSON ({exc})", hint=hint) from None


def _identity_from(text: str) -> dict[str, Any]:
    """JSON text or a file of it; a whole description (with a "tokenizer" key) gives its part."""
    value, source = json_or_file(
        text,
        "--tokenizer-identity",
        "{",
        'pass the "tokenizer" object of a Megatron description, or its file',
    )
    if isinstance(value, dict) and isinstance(value.get("tokenizer"), dict):
        value = value["tokenizer"]
    if not isinstance(value, dict) or "class" not in value:
        raise ConfigError(
            f"{source} holds {str(value)[:80]!r}, expected a tokenizer identity object with a"
            ' "class"',
            hint='copy the "tokenizer" object of one of Megatron\'s ...-description.txt files',
        )
    return value


def fast_load(args: argparse.Namespace) -> bool:
    """Whether a Megatron job's flags ask for the fast cache load (``build_policy="none"``:
    ``--dataloader-fast-cache-load`` or ``--dataloader-defer-npy-index-mmap``), with the checks
    megatron-core's ``BlendedMegatronDatasetConfig`` makes of them, so that the importer, the
    provider and prepare-cache take or refuse one command line alike: a cache folder is needed,
    and the fast cache load refuses ``--data-path`` (the splits' own paths only)."""
    fast = [
        flag
        for flag, on in (
            ("--dataloader-fast-cache-load", getattr(args, "dataloader_fast_cache_load", False)),
            (
                "--dataloader-defer-npy-index-mmap",
                getattr(args, "dataloader_defer_npy_index_mmap", False),
            ),
        )
        if on
    ]
    if not fast:
        return False
    if getattr(args, "data_cache_path", None) is None:
        raise ConfigError(
            f"{fast[0]} needs --data-cache-path (Megatron asserts it too)",
            hint="pass the folder that tokenload prepare-cache filled",
        )
    blend_flag = next(
        (
            f
            for f, a in (("--data-path", "data_path"), ("--data-args-path", "data_args_path"))
            if getattr(args, a, None)
        ),
        None,
    )  # either gives megatron-core's blend, which the fast cache load refuses
    if getattr(args, "dataloader_fast_cache_load", False) and blend_flag is not None:
        raise ConfigError(
            f"--dataloader-fast-cache-load and {blend_flag} cannot be used together"
            " (megatron-core's BlendedMegatronDatasetConfig asserts it)",
            hint="give the splits' data with --train-data-path, --valid-data-path and"
            " --test-data-path (or --per-split-data-args-path), or drop the fast load",
        )
    return True


def check_provider_flags(args: argparse.Namespace) -> None:
    """The Megatron-LM provider's own flags (``--tokenload-dataloader-type``,
    ``--tokenload-packing``) belong to a job under ``--dataloader-type external`` (the provider
    runs there): elsewhere a ``ConfigError``, from the importer and prepare-cache alike."""
    tokenload_type = getattr(args, "tokenload_dataloader_type", None)
    if getattr(args, "dataloader_type", None) == "external":
        return
    if tokenload_type is None and getattr(args, "tokenload_packing", None) is None:
        return
    flag = "--tokenload-dataloader-type" if tokenload_type is not None else "--tokenload-packing"
    raise ConfigError(
        f"{flag} with --dataloader-type {getattr(args, 'dataloader_type', None) or 'single'}: it"
        " is a flag of tokenload's Megatron-LM provider, which runs under --dataloader-type"
        " external",
        hint=f"drop {flag}, or give --dataloader-type external (another loop reading"
        " these flags: imported.config(packing='best-fit'))",
    )
