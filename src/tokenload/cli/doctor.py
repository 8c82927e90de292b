"""``tokenload doctor``: the scale guides' checklist, measured on this data and filesystem
(``tokenload.doctor``); prints each finding with its fix. Exit status (``EXIT_STATUS``): 0 no
problem found, 1 problems found, 2 an error (``main``: usage, data, configuration, the plot's
file), 130 interrupted, 141 the reader of the report gone."""

from __future__ import annotations

import argparse
import os

from ..errors import ConfigError
from ..megatron_args import tokenizer_flags, tokenizer_identity
from .args import at_least, positive
from .vocabulary import to_flags

#: The exit statuses, as ``--help`` and docs/FEATURES.md ("Troubleshoot") list them: 0 and 1 are
#: ``run``'s, the others ``main``'s, as for every command.
EXIT_STATUS = (
    "exit status: 0 no problem found; 1 one or more problems found (the report names them);"
    " 2 an error, one line on stderr (a usage error, data or a configuration that cannot be"
    " measured, a --compare or --plot path refused before measuring, or the plot not written"
    " after the report); 130 interrupted; 141 the reader of the output gone (`| head`)"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "doctor",
        help="measure the scale guides' checklist on your data and print the fixes",
        description="Measure the scale guides' checklist on your data and print the fixes.",
        epilog=EXIT_STATUS,
    )
    p.add_argument(
        "--data-path",
        nargs="+",
        required=True,
        metavar="W_OR_PREFIX",
        help="the job's --data-path: prefixes or weight/prefix pairs (a prefix given twice from two"
        " folders is compared as copies)",
    )
    p.add_argument("--seq-length", type=positive(int), required=True, help="the job's --seq-length")
    p.add_argument(
        "--data-cache-path", default=None, metavar="DIR", help="the job's --data-cache-path"
    )
    p.add_argument("--split", default="969, 30, 1", help="the job's --split")
    p.add_argument(
        "--train-samples",
        type=positive(int),
        default=None,
        help="samples of the train split, as the job asks them (default: one epoch; for a"
        " weighted blend one pass over its train tokens, valid and test built empty)",
    )
    lengths = p.add_argument_group(
        "the job's length flags (Megatron's)",
        "with them the three splits are sized as the job sizes them (train = iterations x global"
        " batch or --train-samples; valid = (iterations // eval interval + 1) x eval iterations x"
        " global batch; test = eval iterations x global batch), as tokenload prepare-cache"
        " computes them: the doctor looks for the job's own caches, whose names hold these"
        " counts, and prints the prepare-cache command with these flags",
    )
    lengths.add_argument(
        "--train-iters", type=positive(int), default=None, help="the job's --train-iters"
    )
    lengths.add_argument(
        "--global-batch-size",
        type=positive(int),
        default=None,
        help="the job's --global-batch-size (needed with the other length flags)",
    )
    lengths.add_argument(
        "--eval-iters",
        type=at_least(int, 0),
        default=None,
        help="the job's --eval-iters (default: Megatron's, 100)",
    )
    lengths.add_argument(
        "--eval-interval",
        type=positive(int),
        default=None,
        help="the job's --eval-interval (needed with the other length flags)",
    )
    p.add_argument("--seed", type=int, default=1234, help="the job's --seed")
    tokenizer_flags(
        p.add_argument_group(
            "the job's tokenizer identity (part of every cache name)",
            "as tokenload prepare-cache takes them: the doctor looks for the caches named for"
            " this tokenizer, and prints the prepare-cache command that writes them",
        )
    )
    p.add_argument(
        "--build-policy",
        default="auto",
        choices=("auto", "rank0", "local-rank0", "every-rank", "none"),
        help="the job's build_policy",
    )
    p.add_argument(
        "--order",
        default="megatron",
        choices=("megatron", "computed"),
        help="the job's sample order",
    )
    p.add_argument(
        "--packing",
        default="concat",
        choices=("concat", "best-fit"),
        help="the job's packing: the doctor measures both and says when best-fit would help",
    )
    p.add_argument(
        "--read-mode", default="mmap", choices=("mmap", "pread"), help="the job's read_mode"
    )
    p.add_argument(
        "--sequences-path",
        default=None,
        metavar="JSON",
        help="the job's sequences JSON (--per-dataset-sequences-path)",
    )
    p.add_argument(
        "--micro-batch-size", type=positive(int), default=4, help="samples per micro-batch"
    )
    p.add_argument(
        "--step-ms",
        type=positive(float),
        default=20.0,
        help="the training step's duration the data has to keep up with",
    )
    p.add_argument("--steps", type=positive(int), default=16, help="loader steps per measurement")
    p.add_argument(
        "--compare",
        nargs="+",
        default=[],
        metavar="DIR",
        help="folders holding copies of the prefixes (another node's mount): compared by content",
    )
    p.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="write the startup timeline and the per-step data wait as a PNG"
        " (needs tokenload[plot])",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..doctor import DoctorConfig, diagnose, format_report, plot
    from ..errors import require

    if args.plot:
        require("matplotlib", "plot", "tokenload doctor --plot")  # before minutes of measuring
        check_plot_path(args.plot)
    for folder in args.compare or []:
        if not os.path.isdir(folder):
            raise ConfigError(
                f"--compare {folder!r} is not a folder; expected a folder holding copies of the"
                " prefixes (another node's mount)",
                path=folder,
                hint="pass the folder where the other copy of the data lives",
            )
    config = DoctorConfig(
        data_path=args.data_path,
        seq_length=args.seq_length,
        data_cache_path=args.data_cache_path,
        split=args.split,
        train_samples=args.train_samples,
        train_iters=args.train_iters,
        global_batch_size=args.global_batch_size,
        eval_iters=args.eval_iters,
        eval_interval=args.eval_interval,
        seed=args.seed,
        tokenizer=tokenizer_identity(args),
        build_policy=args.build_policy,
        order=args.order,
        packing=args.packing,
        read_mode=args.read_mode,
        sequences_path=args.sequences_path,
        micro_batch_size=args.micro_batch_size,
        step_ms=args.step_ms,
        steps=args.steps,
        compare=args.compare,
    )
    report = diagnose(config)
    print(to_flags(format_report(report)))  # the report names doctor's fields: its flags here
    if args.plot:
        plot(report, args.plot)
        print(f"plot written to {args.plot}")
    return 1 if report.problems else 0


def check_plot_path(path: str) -> None:
    """ConfigError unless ``path`` can take the plot: a file name in a folder that exists and can
    be written, not a folder (checked before the measuring, which takes a while)."""
    from ..format.atomic import require_folder

    if os.path.isdir(path):
        raise ConfigError(
            f"--plot {path!r} is a folder; expected a file name for the PNG",
            path=path,
            hint="name the file, e.g. --plot doctor.png",
        )
    require_folder(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--plot {path!r}: its folder {folder!r} cannot be written",
            path=path,
            hint="choose a writable folder for the plot",
        )
