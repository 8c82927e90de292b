"""Megatron-LM's training flags that decide a job's data, as argparse groups, and their
arithmetic: the blend flags (``--data-path``, per-split paths, args files), the batch and length
flags with Megatron's sample counts (``validate_args`` + ``update_train_iters`` +
``get_train_valid_test_num_samples``, a ``--rampup-batch-size`` ramp included), the item flags,
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
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from .index import Blend


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
    length = g.add_mutually_exclusive_group()
    length.add_argument("--train-iters", type=at_least(int, 0), help="training iterations")
    length.add_argument(
        "--train-samples",
        type=at_least(int, 0),
        help="training samples (iterations = samples // global batch, or through the ramp)",
    )
    g.add_argument(
        "--rampup-batch-size",
        nargs=3,
        type=positive(int),
        metavar=("START", "INCREMENT", "SAMPLES"),
        help="the global batch grows from START by INCREMENT to --global-batch-size over SAMPLES"
        " samples (needs --train-samples; changes the iterations, never the order)",
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
        "--tokenizer-type", help="NullTokenizer: its identity is derived (with --vocab-size)"
    )
    g.add_argument("--vocab-size", type=positive(int), help="NullTokenizer's vocabulary size")
    g.add_argument(
        "--null-tokenizer-eod-id", type=int, help="NullTokenizer's eod id, when the job sets it"
    )
    g.add_argument("--null-tokenizer-pad-id", type=int, default=-1, help="NullTokenizer's pad id")


@dataclass(frozen=True)
class Ramp:
    """Megatron's ``--rampup-batch-size START INCREMENT SAMPLES``: the global batch of a step is
    ``START + INCREMENT x int(consumed / (SAMPLES / increments))`` while the samples consumed
    before it are at most ``SAMPLES``, then ``global_batch_size`` (megatron-core's
    ``RampupBatchsizeNumMicroBatchesCalculator.update``, which ``update_num_microbatches`` calls
    before every step with ``consumed_train_samples``). The ramp changes how many micro-batches a
    step takes, never which sample comes next: the order is a function of the samples consumed.

    Walking the steps goes one stage of constant batch at a time (a few hundred stages, however
    many steps), each stage's end found with Megatron's own float expression."""

    start: int
    increment: int
    samples: int
    global_batch_size: int

    @property
    def _per_increment(self) -> float:
        """Megatron's ``rampup_samples_per_increment`` (a float)."""
        return self.samples / ((self.global_batch_size - self.start) // self.increment)

    def batch_at(self, consumed: int) -> int:
        """The global batch of the step that starts after ``consumed`` samples."""
        if consumed > self.samples:
            return self.global_batch_size
        return self.start + int(consumed / self._per_increment) * self.increment

    def _stage_end(self, consumed: int) -> int:
        """The smallest count above ``consumed`` at which the batch changes or the ramp ends."""
        if consumed >= self.samples:
            return self.samples + 1
        per, stage = self._per_increment, int(consumed / self._per_increment)
        end = max(consumed + 1, math.ceil((stage + 1) * per))
        while int(end / per) <= stage:  # float rounding: Megatron's expression decides
            end += 1
        while end - 1 > consumed and int((end - 1) / per) > stage:
            end -= 1
        return min(end, self.samples + 1)

    def _walk(self, most: int | None) -> tuple[int, int]:
        """(steps, consumed) after the ramp's steps (those that start at or below ``samples``),
        or after ``most`` steps if fewer."""
        steps = consumed = 0
        while consumed <= self.samples and (most is None or steps < most):
            batch = self.batch_at(consumed)
            n = -(-(self._stage_end(consumed) - consumed) // batch)
            if most is not None:
                n = min(n, most - steps)
            steps, consumed = steps + n, consumed + n * batch
        return steps, consumed

    def ramp_end(self) -> tuple[int, int]:
        """(steps, samples consumed) of the ramp: its last step starts at or below ``samples``."""
        return self._walk(None)

    def consumed_samples(self, iterations: int) -> int:
        """Megatron's ``consumed_train_samples`` after ``iterations`` training steps (what a
        resume from an iteration passes as ``consumed_samples``)."""
        steps, consumed = self._walk(iterations)
        return consumed + (iterations - steps) * self.global_batch_size

    def train_iters(self, train_samples: int) -> int:
        """Megatron's ``update_train_iters``: the ramp's steps, then whole constant batches of
        what remains of ``train_samples`` (a last partial batch dropped)."""
        steps, consumed = self.ramp_end()
        return steps + (train_samples - consumed) // self.global_batch_size


@dataclass(frozen=True)
class Batches:
    """The batch and length arithmetic of Megatron's training arguments."""

    world_size: int
    data_parallel_size: int
    global_batch_size: int
    train_iters: int
    samples: tuple[int | None, int | None, int | None]
    """(train, valid, test); valid None with --full-validation (one epoch)."""
    rampup_batch_size: Ramp | None = None
    """``--rampup-batch-size``: the global batch per step, and the samples consumed by a step."""


def batches(args: argparse.Namespace) -> Batches:
    """Megatron's ``validate_args`` + ``update_train_iters`` +
    ``get_train_valid_test_num_samples``."""
    model = (
        args.tensor_model_parallel_size
        * args.pipeline_model_parallel_size
        * args.context_parallel_size
    )
    world = args.prepare_cache_world_size
    if world % model:
        raise ConfigError(
            f"world size {world} is not divisible by the model-parallel size {model} (tensor x"
            " pipeline x context)",
            hint="pass the job's `world_size=` and parallel sizes",
        )
    dp = world // model
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
    ramp = _ramp(args, gbs, dp)
    if ramp is not None:
        iters = ramp.train_iters(args.train_samples)
    elif args.train_iters is not None:
        iters = args.train_iters
    else:
        iters = args.train_samples // gbs
    train = args.train_samples if args.train_samples is not None else iters * gbs
    eval_gbs = args.eval_global_batch_size or gbs
    return Batches(
        world,
        dp,
        gbs,
        iters,
        (train, _valid_samples(args, iters, eval_gbs), args.eval_iters * eval_gbs),
        ramp,
    )


def _ramp(args: argparse.Namespace, gbs: int, dp: int) -> Ramp | None:
    """``--rampup-batch-size`` checked as Megatron checks it (``validate_args`` and the
    calculator's asserts), and as its training loop will (each step's batch a multiple of
    micro batch x data-parallel size)."""
    given = getattr(args, "rampup_batch_size", None)
    if given is None:
        return None
    start, increment, samples = given
    flag = f"--rampup-batch-size {start} {increment} {samples}"
    if args.train_samples is None:
        raise ConfigError(
            f"{flag} is given with --train-iters; Megatron expects no batch-size rampup for"
            " iteration-based training",
            hint="pass the job's --train-samples instead of --train-iters, as Megatron requires",
        )
    if start >= gbs or (gbs - start) % increment:
        raise ConfigError(
            f"{flag}: the ramp from {start} to the global batch size {gbs} is not a whole number"
            f" of increments of {increment} (Megatron asserts it)",
            hint="check the job's --rampup-batch-size against its --global-batch-size",
        )
    group = None if args.micro_batch_size is None else args.micro_batch_size * dp
    if group is not None and (start % group or increment % group):
        raise ConfigError(
            f"{flag}: a step's global batch ({start}, {start + increment}, ...) is not a multiple"
            f" of micro batch size {args.micro_batch_size} x data-parallel size {dp} = {group}"
            " (Megatron's training loop asserts it at every step)",
            hint="use a start and an increment that are multiples of micro batch x data-parallel"
            " size",
        )
    ramp = Ramp(start, increment, samples, gbs)
    steps, consumed = ramp.ramp_end()
    if consumed > args.train_samples:
        raise ConfigError(
            f"{flag}: the ramp's {steps} steps consume {consumed} samples, more than"
            f" --train-samples {args.train_samples} (Megatron would count"
            f" {ramp.train_iters(args.train_samples)} iterations and run past the train split)",
            hint="pass the job's flags: a ramp shorter than the training",
        )
    return ramp


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
            hint="pass the job's --eval-interval (or --eval-iters 0"
            " --skip-train when it evaluates never)",
        )
    points: int = iters // args.eval_interval + 1
    if args.start_eval_at_iter is not None:
        points = max(0, points - args.start_eval_at_iter // args.eval_interval)
    eval_iters: int = args.eval_iters
    return points * eval_iters * eval_gbs


def tokenizer_identity(args: argparse.Namespace) -> dict[str, Any] | None:
    """The tokenizer's ``unique_identifiers`` as Megatron writes them into every description."""
    if args.tokenizer_identity is not None:
        if args.tokenizer_type is not None:
            raise ConfigError(
                "--tokenizer-identity and --tokenizer-type are given together",
                hint="give one: the identity copied from Megatron, or NullTokenizer's flags",
            )
        return _identity_from(args.tokenizer_identity)
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
