"""Configs as users have them: Megatron-LM's training flags, and the result every importer returns.

Each importer returns an ``ImportedConfig`` (defined beside ``MegatronDataConfig``): ``fields``
(keyword arguments of ``MegatronDataConfig``), ``sizes`` (samples per split, by the arithmetic
of the system the config comes from) and ``extras`` (what is not a dataset field: batch sizes,
loader workers, tokenizer files). Nothing is silently ignored: a flag or key either maps onto a
field, is recorded in ``extras``, belongs to an explicit list of the system's known non-data
options (model, optimizer, parallelism, logging, checkpoints), or is a ``ConfigError`` that
names it.

Megatron's flags are parsed here with Megatron's own names and rules (``allow_abbrev=False``,
blends and batch arithmetic shared with ``tokenload prepare-cache``). GPT-NeoX's YAML files are
read by ``datasets.neox.neox_yaml``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn

from .. import megatron_args
from ..distributed import int_env, process_group
from ..errors import ConfigError
from .config import ImportedConfig, register_importer

__all__ = [
    "MEGATRON_NON_DATA_FLAGS",
    "ImportedConfig",
    "megatron_config_from_args",
]


# -- Megatron-LM ----------------------------------------------------------------------------------

MEGATRON_NON_DATA_FLAGS = frozenset(
    """
--adam-beta1 --adam-beta2 --adam-eps --apply-layernorm-1p --apply-query-key-layer-scaling
--attention-backend --attention-dropout --attention-softmax-in-fp32 --bf16
--calculate-per-token-loss --ckpt-format --clip-grad --cross-entropy-loss-fusion
--decoupled-lr --decoupled-min-lr --disable-bias-linear --distributed-backend
--distributed-timeout-minutes --empty-unused-memory-level --exit-duration-in-mins
--exit-interval --expert-model-parallel-size --expert-tensor-parallel-size --ffn-hidden-size
--finetune --fp16 --fp8-amax-compute-algo --fp8-amax-history-len --fp8-format
--fp8-param-gather --grad-reduce-in-bf16 --group-query-attention --hidden-dropout
--hidden-size --init-method-std --kv-channels --load --log-interval --log-throughput
--log-timers-to-tensorboard --log-validation-ppl-to-tensorboard --lr --lr-decay-iters
--lr-decay-samples --lr-decay-style --lr-warmup-fraction --lr-warmup-iters
--lr-warmup-samples --make-vocab-size-divisible-by --manual-gc --max-position-embeddings
--min-lr --moe-aux-loss-coeff --moe-grouped-gemm --moe-router-load-balancing-type
--moe-router-topk --moe-token-dispatcher-type --no-gradient-accumulation-fusion
--no-load-optim --no-load-rng --no-masked-softmax-fusion --no-position-embedding
--no-save-optim --no-save-rng --normalization --num-attention-heads --num-experts
--num-layers --num-query-groups --overlap-grad-reduce --overlap-param-gather
--position-embedding-type --profile --profile-step-end --profile-step-start --recompute-granularity
--recompute-method --recompute-num-layers --rotary-base --rotary-percent --save
--save-interval --sequence-parallel --swiglu --tensorboard-dir --transformer-impl
--untie-embeddings-and-output-weights --use-distributed-optimizer --use-flash-attn
--use-mcore-models --use-rotary-position-embeddings --wandb-exp-name --wandb-project
--wandb-save-dir --weight-decay
--tokenizer-special-tokens --tokenizer-sentencepiece-legacy --tokenizer-hf-no-use-fast
--tokenizer-hf-no-include-special-tokens --trust-remote-code
--no-tokenizer-sentencepiece-ignore-extra-whitespaces
--disable-tokenizer-sentencepiece-ignore-extra-whitespaces --padded-vocab-size --no-pad-vocab-size
--disable-pad-vocab-size --no-use-tokenizer-model-from-checkpoint-args
--disable-use-tokenizer-model-from-checkpoint-args
""".split()  # noqa: SIM905 (a word list reads as text)
)
"""Megatron flags that decide no sample, token or item (model, optimizer, parallelism,
checkpoints, logging; the tokenizer's options, which change no token file and, the identity
given, no cache name): those of its example training scripts (``examples/gpt3``, ``llama``,
``mixtral``), their close relatives and megatron-core 0.19.2's tokenizer options. Any other flag
that is not a data flag is refused."""

_NON_DATA_SWITCHES = frozenset(
    """
--apply-layernorm-1p --apply-query-key-layer-scaling --attention-softmax-in-fp32 --bf16
--calculate-per-token-loss --cross-entropy-loss-fusion --disable-bias-linear
--disable-pad-vocab-size --disable-tokenizer-sentencepiece-ignore-extra-whitespaces
--disable-use-tokenizer-model-from-checkpoint-args --finetune --fp16 --fp8-param-gather
--grad-reduce-in-bf16 --group-query-attention --log-throughput --log-timers-to-tensorboard
--log-validation-ppl-to-tensorboard --manual-gc --moe-grouped-gemm
--no-gradient-accumulation-fusion --no-load-optim --no-load-rng --no-masked-softmax-fusion
--no-pad-vocab-size --no-position-embedding --no-save-optim --no-save-rng
--no-tokenizer-sentencepiece-ignore-extra-whitespaces
--no-use-tokenizer-model-from-checkpoint-args --overlap-grad-reduce --overlap-param-gather
--profile --sequence-parallel --swiglu --tokenizer-hf-no-include-special-tokens
--tokenizer-hf-no-use-fast --tokenizer-sentencepiece-legacy --trust-remote-code
--untie-embeddings-and-output-weights --use-distributed-optimizer --use-flash-attn
--use-mcore-models --use-rotary-position-embeddings
""".split()  # noqa: SIM905 (a word list reads as text)
)
"""The non-data flags that take no value in megatron-core 0.19.2's parser (``store_true``)."""
_NON_DATA_LISTS = frozenset(
    ("--moe-aux-loss-coeff", "--moe-router-load-balancing-type", "--tokenizer-special-tokens")
)
"""The non-data flags that take one value or more (``nargs="+"``); the others take one."""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are ConfigErrors, not a usage message and ``SystemExit``."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"Megatron flags: {message}", hint="check the flag against Megatron's")


def _megatron_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="megatron", add_help=False, allow_abbrev=False)
    megatron_args.blend_flags(p)
    g = p.add_argument_group("data")
    g.add_argument("--split")
    g.add_argument("--seq-length", type=int)
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--data-cache-path")
    g.add_argument("--per-dataset-sequences-path")
    g.add_argument("--mock-data", action="store_true")
    megatron_args.loader_flags(g)
    megatron_args.batch_flags(g)
    megatron_args.tokenload_flags(g)  # the Megatron-LM provider's own
    megatron_args.item_flags(g)
    megatron_args.tokenizer_flags(g)
    return p


def unknown_flags(leftovers: Sequence[str]) -> list[str]:
    """The flags of ``leftovers`` (what a parser did not take, values after their flags) that are
    not Megatron's known non-data flags; ``ConfigError`` for a value that no flag takes: before
    any flag, after a known flag's own values (a switch takes none, ``--lr`` one), or given to
    a switch with ``=``, as megatron-core's parser refuses them. After an unknown flag any values
    may follow (its arity is not known here; the flag itself is reported)."""
    unknown: list[str] = []
    current: str | None = None
    room: int | None = 0  # values the current flag still takes; None: any number
    wants = False  # the current flag has not had the value it needs yet
    for token in [*leftovers, None]:
        if wants and (token is None or token.startswith("--")):
            raise ConfigError(
                f"Megatron flags: {current} expects a value, and none follows it (Megatron's"
                " parser refuses it too)",
                hint=f"give {current} its value",
            )
        if token is None:
            break
        if token.startswith("--"):
            current, given = token.split("=", 1)[0], "=" in token
            if current not in MEGATRON_NON_DATA_FLAGS:
                unknown.append(current)
                room = None
            elif current in _NON_DATA_SWITCHES:
                if given:
                    raise ConfigError(
                        f"Megatron flags: {token!r}: {current} takes no value (Megatron's parser"
                        " refuses it too)",
                        hint=f"write {current} alone",
                    )
                room = 0
            else:
                room = 0 if given else None if current in _NON_DATA_LISTS else 1  # --f=v: v only
                wants = not given
        elif room is not None and room <= 0:
            if current is None:
                raise ConfigError(
                    f"stray argument {token!r}, not a flag's value; expected --flags only",
                    hint="quote a value that holds spaces, e.g. --step-batch-size-schedule"
                    ' "0:16 2.4B:320", so that it reaches the command as one argument',
                )
            raise ConfigError(
                f"Megatron flags: unrecognized argument {token!r} after {current}, which takes"
                f" {'no value' if current in _NON_DATA_SWITCHES else 'one value'} (Megatron's"
                " parser refuses it too)",
                hint=f"remove {token!r}, or quote a value that holds spaces so that it reaches"
                " the job as one argument",
            )
        else:
            wants = False
            if room is not None:
                room -= 1
    return unknown


def _check_leftovers(leftovers: list[str]) -> None:
    """Every flag argparse did not take must be a known non-data flag (its values follow it)."""
    unknown = unknown_flags(leftovers)
    if unknown:
        raise ConfigError(
            f"unknown Megatron flag {unknown[0]}: neither a data flag tokenload maps nor a "
            "known non-data flag",
            hint="remove it, or ask for it to be listed (a flag that changes the data "
            "must be supported, not ignored)",
        )


def check_strays(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """A value after a known flag's own values is an unrecognized argument to Megatron's parser
    (``parse_args`` exits on it), as when a shell splits an unquoted
    ``--step-batch-size-schedule "0:16 2.4B:320"``; ``parse_known_args`` alone would pass it on
    as a value of some earlier unknown flag. After an unknown flag any number of values may
    follow (its arity is Megatron's, not known here)."""
    room: float | None = None  # values the current flag still takes; None: any
    flag, value = None, ""
    for token in argv:
        if token.startswith("--"):
            flag, given, _ = token.partition("=")
            action = parser._option_string_actions.get(flag)
            if action is None:
                room = None
            elif given:
                room = 0
            elif action.nargs in ("*", "+"):
                room = float("inf")
            else:
                room = 1 if action.nargs in (None, "?") else int(action.nargs)
        elif room is not None:
            if room > 0:
                value = token
            if room <= 0:
                raise ConfigError(
                    f"Megatron flags: unrecognized argument {token!r} after {flag} and its"
                    " value (Megatron's parser refuses it too)",
                    hint=f"if {token!r} belongs to {flag}'s value, quote the whole value"
                    f' ({flag} "{value} {token} ...") so that it reaches the job as one'
                    " argument; otherwise remove it",
                )
            room -= 1


def _megatron_world() -> int:
    """The world size megatron.training takes: an initialised process group's, else
    ``WORLD_SIZE`` (its ``parse_args`` reads that variable alone: no ``RANK``, no SLURM's)."""
    group = process_group()
    if group is not None:
        return int(group.get_world_size())
    return int(int_env("WORLD_SIZE", default=1))


def megatron_config_from_args(
    argv: Sequence[str], *, world_size: int | None = None, eod_id: int | None = None
) -> ImportedConfig:
    """Megatron training flags (``pretrain_gpt.py``'s arguments, without the launcher's) as
    ``MegatronDataConfig`` fields and the sizes Megatron computes.

    ``world_size``: the job's number of processes, for the data-parallel size (default: this
    process's world, else ``WORLD_SIZE`` as megatron.training reads it); ``eod_id``: the
    tokenizer's end-of-document id, needed by ``--mock-data`` and the EOD flags unless the
    tokenizer is ``NullTokenizer`` (its EOD is known).
    """
    parser = _megatron_parser()
    check_strays(parser, argv)
    args, leftovers = parser.parse_known_args(list(argv))
    _check_leftovers(leftovers)
    if args.seq_length is None:
        raise ConfigError("--seq-length is missing", hint="pass the training job's --seq-length")
    if args.train_iters is None and args.train_samples is None:
        raise ConfigError(
            "no training length: expected --train-iters or --train-samples",
            hint="pass the training job's flag",
        )
    provider = args.tokenload_dataloader_type is not None or args.tokenload_packing is not None
    if args.dataloader_type == "external":
        if not provider:
            raise ConfigError(
                "--dataloader-type external: the job brings its own loader",
                hint="use single (Megatron's default) or cyclic; if that loader is tokenload's"
                " Megatron-LM provider, add its --tokenload-dataloader-type single (its default)",
            )
        args.dataloader_type = args.tokenload_dataloader_type or "single"  # the provider's order
        if args.full_validation:  # (the provider's own refusal)
            raise ConfigError(
                "--full-validation with tokenload's Megatron-LM provider: it serves GPT"
                " pretraining data only",
                hint="drop --full-validation, or use pretrain_gpt.py's own provider for it",
            )
    else:
        megatron_args.check_provider_flags(args)
    if any(t.split("=", 1)[0] == "--prepare-cache-world-size" for t in argv):
        raise ConfigError(
            "--prepare-cache-world-size is tokenload prepare-cache's flag, not Megatron's",
            hint="pass the job's world to the importer as world_size=N",
        )
    if world_size is not None and world_size < 1:
        raise ConfigError(f"world_size is {world_size}; expected 1 or more", field="world_size")
    args.prepare_cache_world_size = world_size or _megatron_world()
    fields: dict[str, Any] = {"sequence_length": args.seq_length, "random_seed": args.seed}
    if args.mock_data:
        paths = [getattr(args, f"{s}data_path") for s in ("", "train_", "valid_", "test_")]
        if any(paths):
            raise ConfigError("--mock-data is given with data paths; expected one of them")
        fields["split"] = args.split or megatron_args.LEGACY_SPLIT
    else:
        blend, per_split = megatron_args.blends_of(args)
        fields.update(blend=blend, blend_per_split=per_split)
        if blend is not None:
            fields["split"] = args.split or megatron_args.LEGACY_SPLIT
    fields.update(_megatron_tokenizer(args, eod_id))
    fields.update(
        eod_mask_loss=args.eod_mask_loss,
        reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask,
        create_attention_mask=not args.no_create_attention_mask_in_dataloader,
        inter_document_masking=args.dataloader_inter_document_masking,
        add_extra_token=args.add_extra_token,
        drop_last_partial_validation_sequence=args.drop_last_partial_validation_sequence,
        mid_level_dataset_surplus=args.mid_level_dataset_surplus,
    )
    if args.tokenload_packing not in (None, "concat"):
        fields["packing"] = args.tokenload_packing
    _megatron_loading(args, fields)
    counts = megatron_args.batches(args)
    extras = {
        "global_batch_size": counts.global_batch_size,
        "micro_batch_size": args.micro_batch_size,
        "data_parallel_size": counts.data_parallel_size,
        "train_iters": counts.train_iters,
        # --step-batch-size-schedule: each step's global batch and the samples consumed by a step
        "step_batch_size_schedule": counts.step_batch_size_schedule,
        # --rampup-batch-size as given: ignored by every count, as in megatron-core 0.19
        "rampup_batch_size": args.rampup_batch_size,
        "num_workers": args.num_workers,
        "dataloader_type": args.dataloader_type or "single",
        "tokenizer": _megatron_tokenizer_files(args),
    }
    return ImportedConfig(fields, list(counts.samples), extras)


def _megatron_tokenizer_files(args: argparse.Namespace) -> dict[str, Any]:
    """The tokenizer flags as given (``--vocab-file x`` as ``{"vocab_file": "x"}``)."""
    flags = ("--tokenizer-type", *megatron_args.TOKENIZER_VALUE_FLAGS)
    dests = [f[2:].replace("-", "_") for f in flags]
    return {d: getattr(args, d) for d in dests if getattr(args, d) is not None}


def _megatron_tokenizer(args: argparse.Namespace, eod_id: int | None) -> dict[str, Any]:
    """The tokenizer's identity (cache names), EOD, pad and vocabulary, as far as flags say."""
    out: dict[str, Any] = {}
    null = args.tokenizer_type == "NullTokenizer"
    if args.tokenizer_identity is not None or null:
        out["tokenizer"] = megatron_args.tokenizer_identity(args)
    if null:
        out["eod_id"] = (
            args.null_tokenizer_eod_id
            if args.null_tokenizer_eod_id is not None
            else args.vocab_size - 1
        )  # megatron-core's NullTokenizer
        out["pad_id"] = args.null_tokenizer_pad_id
    if eod_id is not None:
        out["eod_id"] = eod_id
    if args.vocab_size is not None:
        out["vocab_size"] = args.vocab_size
    flags = {
        "--mock-data": args.mock_data,
        "--eod-mask-loss": args.eod_mask_loss,
        "--reset-position-ids": args.reset_position_ids,
        "--reset-attention-mask": args.reset_attention_mask,
    }
    needs = [flag for flag, on in flags.items() if on]
    if needs and "eod_id" not in out:
        raise ConfigError(
            f"{needs[0]} needs the tokenizer's end-of-document id, which the flags do not give "
            f"for --tokenizer-type {args.tokenizer_type}",
            hint="pass eod_id=... (your tokenizer's eod) to megatron_config_from_args",
        )
    if args.mock_data and args.vocab_size is None:
        raise ConfigError("--mock-data needs --vocab-size", hint="pass the job's --vocab-size")
    return out


def _megatron_loading(args: argparse.Namespace, fields: dict[str, Any]) -> None:
    """Cache folder, fast load (build_policy 'none'), sequences JSON and the .bin read mode."""
    fields["path_to_cache"] = args.data_cache_path
    if megatron_args.fast_load(args):  # as megatron-core checks it (provider, prepare-cache too)
        fields["build_policy"] = "none"
    if args.per_dataset_sequences_path is not None:
        fields["sequences_path"] = args.per_dataset_sequences_path
    if not args.mmap_bin_files:
        fields["read_mode"] = "pread"


register_importer("megatron_args", megatron_config_from_args)
