"""GPT-NeoX's YAML configs as ``MegatronDataConfig`` fields: the NeoX half of the importers.

Files are read as NeoX reads them: several YAML files merged in order (a key twice is an error,
as in NeoX's ``from_ymls``), ``-`` in keys read as ``_``, NeoX's defaults for what a file leaves
out, and ``order="neox"``. Every key either maps onto a field, is recorded in ``extras``, counts
the job's GPUs as NeoX's launcher does (``neox_launch``), is one of NeoX's known non-data keys
(``NEOX_NON_DATA_KEYS``), or is a ``ConfigError`` that names it;
a data key tokenload cannot reproduce (``NEOX_UNSUPPORTED_DATA_KEYS``) is refused unless left at
NeoX's default. The sample counts follow NeoX's ``train_val_test_num_samples``.

Separate from ``configs`` (the Megatron-flag importer; both return ``config.ImportedConfig``)
because the two share nothing but that result: NeoX's schema lists and merge rules are their
own, and PyYAML is imported only when a NeoX file is read.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

from ...distributed import World
from ...errors import ConfigError, StorageError
from ..config import ImportedConfig, register_importer
from .neox_launch import LAUNCH_DEFAULTS, check_launch_values, launch_gpus, uncounted_gpus
from .neox_weights import document_weights

__all__ = ["NEOX_NON_DATA_KEYS", "NEOX_UNSUPPORTED_DATA_KEYS", "neox_config_from_yaml"]

NEOX_NON_DATA_KEYS = frozenset(
    """
account activation activation_checkpointing adlr_autoresume adlr_autoresume_interval amp
apply_query_key_layer_scaling attention_config attention_dropout attention_softmax_in_fp32
autotuning autotuning_run base_shapes_file batch_size bf16 bias_dropout_fusion bias_gelu_fusion
char_level_ppl checkpoint checkpoint_activations checkpoint_factor checkpoint_in_cpu
checkpoint_num_layers checkpoint_scale checkpoint_validation_with_forward_pass clip_grad
comet_experiment comet_experiment_name comet_others comet_project comet_tags comet_workspace
comment comms_logger communication_data_type compression_training config_files
contiguous_checkpointing coord_check csv_monitor data_types deepscale deepscale_config deepspeed
deepspeed_activation_checkpointing deepspeed_extra_args deepspeed_mpi deepspeed_slurm dim_att
distributed_backend do_test do_train do_valid dpo_beta dpo_fp32 dpo_reference_free dump_state
dynamic_loss_scale elasticity eval_results_prefix eval_tasks exit_interval expansion_factor
extra_save_iters ffn_dim finetune flops_profiler force_multi fp16 fp16_lm_cross_entropy
fp32_allreduce fp32_reinforce fused_kernels_build_path git_hash gmlp_attn_dim gpt_j_residual
gpt_j_tied gradient_clipping gradient_noise_scale_cpu_offload gradient_noise_scale_n_batches
gradient_predivide_factor head_size hidden_dropout hidden_size hysteresis init_method
init_method_std intermediate_size is_pipe_parallel iteration keep_last_n_checkpoints kl_div_beta
kl_impl kto_beta kto_desirable_weight kto_fp32 kto_undesirable_weight launcher layernorm_epsilon
layernorm_fusion lazy_mpu_init load local_rank log_dir log_grad_norm log_grad_pct_zeros
log_gradient_noise_scale log_interval log_optimizer_states log_param_norm loss_scale
loss_scale_window lr lr_decay_fraction lr_decay_iters lr_decay_style make_vocab_size_divisible_by
mamba_causal_conv_fusion mamba_inner_func_fusion mamba_selective_fp32_params
mamba_selective_scan_fusion mamba_use_bias_in_conv mamba_use_bias_in_linears master_addr
master_port max_position_embeddings maximum_tokens memory_profiling memory_profiling_path min_lr
min_scale mlp_multiple_of moe_expert_interval moe_jitter_eps moe_lbl_in_fp32 moe_num_experts
moe_router_type moe_top_k mup_attn_temp mup_embedding_mult mup_init_scale mup_output_temp
mup_rp_embedding_mult mup_width_scale no_load_optim no_load_rng no_save_optim no_save_rng
no_ssh_check no_weight_tying norm num_attention_heads num_kv_heads num_layers num_samples
num_unique_layers online_dataserver_ips online_dataserver_ports onnx_safe opt_pos_emb_offset
optimizer optimizer_type output_layer_init_method output_layer_parallelism override_lr_scheduler
padded_vocab_size param_sharing_style partition_activations peak_theoretical_tflops
pipe_partition_method pos_emb precision prescale_gradients profile profile_backward
profile_step_start profile_step_stop prompt_end rank recompute reinforce_leave_one_out
return_logits rms_norm_epsilon rmsnorm_fusion rope_fusion rotary_emb_base rotary_pct
rotary_save_freqs_buffer rpe_max_distance rpe_num_buckets s3_chunk_size s3_path sample_input_file
sample_output_file save save_base_shapes scaled_masked_softmax_fusion
scaled_upper_triang_masked_softmax_fusion scalenorm_epsilon scheduler sequence_parallel
serve_model_weights short_seq_prob sliding_window_width soft_prompt_tuning sparse_attention
sparse_gradients sparsity_config steps_per_print synchronize_each_layer te_columnparallel
te_fp8_amax_compute_algo te_fp8_amax_history_len te_fp8_format te_fp8_margin te_fp8_mha
te_fp8_wgrad te_layernorm_mlp te_mha te_rowparallel temperature tensorboard tensorboard_dir
text_gen_type top_k top_p use_bias_in_attn_linear use_bias_in_mlp use_bias_in_norms
use_bnb_optimizer use_checkpoint_lr_scheduler use_comet use_cpu_initialization use_flashattn_swiglu
use_mup use_qk_layernorm use_wandb user_script wall_clock_breakdown wandb wandb_group wandb_host
wandb_init_all_ranks wandb_project wandb_run_name wandb_team warmup weight_decay weight_server_port
world_size z_loss zero_allgather_bucket_size zero_contiguous_gradients zero_optimization
zero_reduce_bucket_size zero_reduce_scatter zero_stage
""".split()  # noqa: SIM905 (a word list reads as text)
)
"""Keys of GPT-NeoX's config schema (``megatron/neox_arguments``, commit ea7aefd) that decide no
sample, token or item: model, optimizer, DeepSpeed, parallelism, logging, checkpoints,
generation. Keys outside the schema, and data keys tokenload does not map, are refused."""

NEOX_UNSUPPORTED_DATA_KEYS: dict[str, Any] = {
    **{
        f"{s}_{kind}_data_paths": None
        for s in ("train", "valid", "test")
        for kind in ("label", "reward")
    },
    **{
        f"{side}_{s}_{kind}data_paths": None
        for side in ("pos", "neg")
        for s in ("train", "valid", "test")
        for kind in ("", "label_")
    },
    "precompute_model_name": None,
    "curriculum_learning": None,
    "curriculum_seqlen": 0,
    "data_efficiency": None,
}
"""Data keys of NeoX's schema with no tokenload counterpart (label/reward datasets, pairwise
DPO/KTO data, DeepSpeed curriculum and data efficiency), with NeoX's defaults: a key set to
another value is a ConfigError naming it."""

_NEOX_FIXED = {"pack_impl": "packed", "dataset_impl": "gpt2", "train_impl": "normal"}
"""NeoX's data modes tokenload reproduces only at these values (NeoX's defaults)."""

_NEOX_DATA_DEFAULTS: dict[str, Any] = {
    "data_path": None,
    "train_data_paths": None,
    "valid_data_paths": None,
    "test_data_paths": None,
    "train_data_weights": None,
    "valid_data_weights": None,
    "test_data_weights": None,
    "weight_by_num_documents": False,
    "weighted_sampler_alpha": 1.0,
    "split": "969, 30, 1",
    "seq_length": None,
    "seed": 1234,
    "data_impl": "infer",
    "mmap_warmup": False,
    "use_shared_fs": True,
    "allow_chopped": True,
    "eod_mask_loss": False,
    "train_iters": None,
    "train_epochs": None,
    "eval_iters": 100,
    "eval_interval": 1000,
    "train_batch_size": None,
    "train_micro_batch_size_per_gpu": None,
    "gradient_accumulation_steps": 1,
    "pipe_parallel_size": 0,
    "model_parallel_size": 1,
    "global_num_gpus": None,
    **LAUNCH_DEFAULTS,
    "num_workers": 2,
    "vocab_file": None,
    "merge_file": None,
    "tokenizer_type": "GPT2BPETokenizer",
    **_NEOX_FIXED,
}
"""The keys the importer reads, with GPT-NeoX's defaults (``neox_args.py``)."""

_DATA_IMPL_READ_MODES = {"mmap": "mmap", "cached": "memory", "lazy": "pread", "infer": None}
"""NeoX's ``data_impl`` as tokenload's ``read_mode`` (docs/FORMAT.md); ``infer`` needs none."""


def _load_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            value = yaml.load(f, Loader=yaml.FullLoader)  # NeoX's loader: True/False, 1.0e-8
    except OSError as exc:
        raise StorageError(
            f"cannot read the NeoX config {path}: {exc.strerror}",
            path=str(path),
            hint="check the path",
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"{path} is not valid YAML: {exc}".splitlines()[0],
            path=str(path),
            hint="check the file's syntax",
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(
            f"{path} holds a {type(value).__name__}; expected a mapping of keys", path=str(path)
        )
    return value


def _merge_neox(sources: Sequence[Any]) -> dict[str, Any]:
    """NeoX's ``from_ymls``: files merged in order, ``-`` read as ``_``. A key already merged is
    refused as NeoX refuses it: the key as written against the merged (``_``) keys, so
    ``tokenizer_type`` then ``tokenizer-type`` is NeoX's override (later file wins), kept."""
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for source in sources:
        name = "the config dict" if isinstance(source, Mapping) else str(source)
        conf = dict(source) if isinstance(source, Mapping) else _load_yaml(source)
        for key, value in conf.items():
            if key in merged:
                raise ConfigError(
                    f"key {key!r} is in both {origin[key]} and {name}; expected each key once "
                    "(GPT-NeoX refuses it too)",
                    hint="keep the key in one file",
                )
            norm = str(key).replace("-", "_")
            merged[norm], origin[norm] = value, name
    return merged


def _check_neox_keys(conf: Mapping[str, Any]) -> None:
    for key, value in conf.items():
        if key in NEOX_UNSUPPORTED_DATA_KEYS:
            if value != NEOX_UNSUPPORTED_DATA_KEYS[key]:
                raise ConfigError(
                    f"NeoX key {key} is set ({value!r}); tokenload does not support it",
                    hint=f"remove {key} (only GPT-NeoX's plain language-model data is supported)",
                )
        elif key in _NEOX_FIXED:
            if value != _NEOX_FIXED[key]:
                raise ConfigError(
                    f"NeoX key {key} is {value!r}; tokenload reproduces only {_NEOX_FIXED[key]!r}",
                    hint=f"remove {key} or set it to {_NEOX_FIXED[key]!r}",
                )
        elif key not in _NEOX_DATA_DEFAULTS and key not in NEOX_NON_DATA_KEYS:
            raise ConfigError(
                f"unknown NeoX key {key}: neither a data key tokenload maps nor a known key of "
                "GPT-NeoX's config schema",
                hint="check its spelling, or remove it",
            )


def neox_config_from_yaml(
    path_or_dict: str | os.PathLike[str] | Mapping[str, Any] | Sequence[Any],
    *,
    data_parallel_size: int | None = None,
    world_size: int | None = None,
    eod_id: int | None = None,
) -> ImportedConfig:
    """A GPT-NeoX config (a YAML path, a dict, or a list of them merged as ``deepy.py`` does) as
    ``MegatronDataConfig`` fields with ``order="neox"`` and NeoX's sample counts.

    ``data_parallel_size``: for ``train_batch_size`` when the config gives only the micro batch
    (default: the config's ``global_num_gpus``, else NeoX's launcher count from its hostfile,
    ``num_nodes`` and ``num_gpus`` (``neox_launch``), else this process's world, divided by pipe
    x model parallel sizes, as NeoX); ``world_size``: the job's GPUs instead (NeoX's
    ``global_num_gpus``, which it divides by pipe x model parallel sizes);
    ``eod_id``: the tokenizer's end-of-document id, needed with ``eod_mask_loss``. ``extras``
    holds the data-parallel size that applies (None where the job's is unknown: a lone process
    without ``global_num_gpus`` or a launcher count), the batch keys, the loader's settings and
    the tokenizer files.
    """
    for name, value in (("data_parallel_size", data_parallel_size), ("world_size", world_size)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1
        ):
            raise ConfigError(f"{name} is {value!r}; expected a positive int", field=name)
    data_parallel_size = None if data_parallel_size is None else int(data_parallel_size)
    world_size = None if world_size is None else int(world_size)
    many = isinstance(path_or_dict, Sequence) and not isinstance(path_or_dict, (str, bytes))
    raw = _merge_neox(list(cast(Sequence[Any], path_or_dict)) if many else [path_or_dict])
    _check_neox_keys(raw)
    conf = {**_NEOX_DATA_DEFAULTS, **{k: v for k, v in raw.items() if k in _NEOX_DATA_DEFAULTS}}
    if world_size is not None:
        conf["global_num_gpus"] = world_size
    _check_neox_values(conf)
    if conf["global_num_gpus"] is None and data_parallel_size is None:
        conf["global_num_gpus"] = launch_gpus(conf)  # NeoX's launcher: hostfile, num_gpus...
    if conf["seq_length"] is None:
        raise ConfigError("the NeoX config has no seq_length", hint="add seq_length")
    fields: dict[str, Any] = {
        "order": "neox",
        "sequence_length": int(conf["seq_length"]),
        "random_seed": int(conf["seed"]),
    }
    fields.update(_neox_data(conf))
    read_mode = _DATA_IMPL_READ_MODES.get(conf["data_impl"], "?")
    if read_mode == "?":
        raise ConfigError(
            f"NeoX key data_impl is {conf['data_impl']!r}; expected one of "
            f"{sorted(_DATA_IMPL_READ_MODES)}",
            hint="use mmap (NeoX's usual)",
        )
    if read_mode is not None:
        fields["read_mode"] = read_mode
    if conf["mmap_warmup"]:
        fields["warmup"] = True
    if not conf["use_shared_fs"]:
        fields["build_policy"] = "local-rank0"
    if conf["eod_mask_loss"]:
        if eod_id is None:
            raise ConfigError(
                "eod_mask_loss needs the tokenizer's end-of-document id",
                hint="pass eod_id=... (50256 for GPT2BPETokenizer)",
            )
        fields.update(eod_mask_loss=True, eod_id=eod_id)
    sizes, batch = _neox_sizes(conf, data_parallel_size)
    if sizes == [None, None, None]:
        fields["num_epochs"] = 1
    micro, steps = _neox_batches(conf, data_parallel_size)
    known = _dp_known(conf, data_parallel_size)
    extras = {
        # the job's data-parallel size: given, or the job's GPUs (global_num_gpus, the launcher's
        # count, world_size=, a launched rank's world) over pipe x model; None in a lone process
        # without them, whose sizes take a world of 1
        "data_parallel_size": _neox_dp(conf, data_parallel_size) if known else None,
        "train_batch_size": batch,
        # the loader's micro batch (None where only train_batch_size is given and the job's
        # data-parallel size is unknown); train_epochs: run the one-epoch loader that many times
        "micro_batch_size": micro,
        "gradient_accumulation_steps": steps,
        "train_iters": conf["train_iters"],
        "train_epochs": conf["train_epochs"],
        "num_workers": conf["num_workers"],
        "tokenizer": {k: conf[k] for k in ("tokenizer_type", "vocab_file", "merge_file")},
    }
    return ImportedConfig(fields, sizes, extras, to_order=document_weights)


_NEOX_INTS = """seq_length seed train_iters train_epochs eval_iters eval_interval train_batch_size
train_micro_batch_size_per_gpu gradient_accumulation_steps pipe_parallel_size model_parallel_size
num_workers global_num_gpus""".split()  # noqa: SIM905 (a word list reads as text)
_NEOX_BATCH = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_NEOX_BOOLS = """weight_by_num_documents mmap_warmup use_shared_fs allow_chopped
eod_mask_loss""".split()  # noqa: SIM905


def _check_neox_values(conf: Mapping[str, Any]) -> None:
    """The data keys' values as NeoX's ``validate_types`` and ``calculate_derived`` take them: a
    value of another type, or one NeoX refuses, is a ConfigError naming the key (never cast:
    ``seq_length: 128.7`` is not 128)."""

    def refuse(key: str, expected: str, hint: str = "") -> None:
        raise ConfigError(
            f"NeoX key {key} is {conf[key]!r}; expected {expected} (GPT-NeoX refuses it too)",
            hint=hint or f"fix {key} in the NeoX config",
        )

    for key in _NEOX_INTS:
        value = conf[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            refuse(key, "an int")
    for key in _NEOX_BOOLS:
        if not isinstance(conf[key], bool):
            refuse(key, "true or false")
    check_launch_values(conf)
    alpha = conf["weighted_sampler_alpha"]
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        refuse("weighted_sampler_alpha", "a number")
    for key in ("split", "data_impl"):
        if not isinstance(conf[key], str):
            refuse(key, "a string")
    if conf["train_iters"] == 0 and conf["train_epochs"]:
        # NeoX's checks read both as truth values, so it takes this pair; its sizes then come
        # from train_iters (0 samples) and it trains no step: never what a config means
        raise ConfigError(
            f"NeoX keys train_iters is 0 and train_epochs is {conf['train_epochs']!r}; expected"
            " one of the two (GPT-NeoX takes this pair, sizes training by train_iters and trains"
            " no step)",
            hint="drop train_iters to train by epochs, or train_epochs to train by iterations",
        )
    if conf["train_iters"] is not None and conf["train_epochs"] is not None:
        refuse("train_epochs", "no train_epochs with train_iters", "give one of the two")
    for key in ("train_iters", "train_epochs", "eval_interval", *_NEOX_BATCH):
        if conf[key] is not None and conf[key] < 1:
            refuse(key, "1 or more")
    if conf["train_epochs"] is not None:  # NeoX's validate_train_epochs
        if conf["weight_by_num_documents"]:
            refuse("weight_by_num_documents", "false with train_epochs", "use train_iters")
        weights = conf["train_data_weights"]
        if isinstance(weights, list) and not all(w == 1.0 for w in weights):
            refuse("train_data_weights", "none, or all 1.0, with train_epochs", "use train_iters")
    if not 0 <= conf["seed"] < 2**32:
        refuse("seed", "0 <= seed < 2**32 (NumPy's random state)")
    separate = [conf[f"{s}_data_paths"] is not None for s in ("train", "valid", "test")]
    if conf["data_path"] and any(separate):
        refuse(
            "data_path", "data_path or train/valid/test_data_paths, not both", "give one of them"
        )
    if any(separate) and not all(separate):
        missing = [s for s, given in zip(("train", "valid", "test"), separate) if not given]
        raise ConfigError(
            f"the NeoX config gives train/valid/test_data_paths without {missing[0]}_data_paths;"
            " GPT-NeoX asserts all three or none",
            hint=f"add {missing[0]}_data_paths (or use data_path with split)",
        )


def _neox_paths(key: str, value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(p, str) for p in value):
        raise ConfigError(f"NeoX key {key} is {value!r}; expected a list of path prefixes")
    return value


def _neox_data(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``data_path`` + ``split``, or per-split weighted paths (NeoX prefers the latter)."""
    if conf["train_data_paths"]:
        blends: list[list[str] | None] = []
        for s in ("train", "valid", "test"):
            paths = conf[f"{s}_data_paths"]
            if not paths:
                blends.append(None)
                continue
            paths = _neox_paths(f"{s}_data_paths", paths)
            weights = conf[f"{s}_data_weights"] or [1.0] * len(paths)  # NeoX's default
            if len(weights) != len(paths):
                raise ConfigError(
                    f"NeoX has {len(weights)} {s}_data_weights for {len(paths)} "
                    f"{s}_data_paths; expected one weight per path"
                )
            blends.append([x for w, p in zip(weights, paths) for x in (repr(float(w)), p)])
        out: dict[str, Any] = {"blend_per_split": blends}
        if conf["weight_by_num_documents"]:
            out["weight_by_num_documents"] = True
            out["weighted_sampler_alpha"] = float(conf["weighted_sampler_alpha"])
        return out
    if not conf["data_path"]:
        raise ConfigError(
            "the NeoX config has no data: expected data_path or train_data_paths",
            hint="add data_path (split by split) or train/valid/test_data_paths",
        )
    return {"blend": _neox_paths("data_path", conf["data_path"]), "split": str(conf["split"])}


def _neox_sizes(conf: Mapping[str, Any], dp: int | None) -> tuple[list[int | None], int | None]:
    """NeoX's ``train_val_test_num_samples`` and its ``train_batch_size``."""
    if conf["train_batch_size"] is None and conf["train_micro_batch_size_per_gpu"] is None:
        raise ConfigError(
            "the NeoX config has neither train_batch_size nor train_micro_batch_size_per_gpu"
            " (GPT-NeoX asserts one of them)",
            hint="add one of them",
        )
    if conf["global_num_gpus"] is not None and dp is None:
        _neox_dp(conf, None)  # a GPU count pipe x model does not divide: NeoX's error, any mode
    if conf["train_batch_size"] is not None and _dp_known(conf, dp):
        _check_neox_batch(conf, _neox_dp(conf, dp))  # (not in a lone process reading a config)
    if conf["train_iters"] is None:
        if conf["train_epochs"] is None:
            raise ConfigError(
                "the NeoX config has neither train_iters nor train_epochs",
                hint="add train_iters (GPT-NeoX requires one of them too)",
            )
        return [None, None, None], None
    batch = conf["train_batch_size"]
    if batch is None:  # NeoX's calculate_batch_parameters: micro x accumulation (1 if null) x dp
        micro = conf["train_micro_batch_size_per_gpu"]
        batch = int(micro) * int(conf["gradient_accumulation_steps"] or 1) * _neox_dp(conf, dp)
    iters, evals = int(conf["train_iters"]), int(conf["eval_iters"])
    valid = (iters // int(conf["eval_interval"]) + 1) * evals
    return [iters * batch, valid * batch, evals * batch], int(batch)


def _dp_known(conf: Mapping[str, Any], dp: int | None) -> bool:
    """Whether the job's data-parallel size is known: given, from ``global_num_gpus``, or this
    process is a rank of a launched job."""
    return dp is not None or conf["global_num_gpus"] is not None or World.detect().world_size > 1


def _neox_batches(conf: Mapping[str, Any], dp: int | None) -> tuple[int | None, int | None]:
    """The micro batch per GPU and the accumulation steps, as NeoX's
    ``calculate_batch_parameters`` gives them: given, or derived from ``train_batch_size`` where
    the data-parallel size is known; None where they cannot be."""
    batch = conf["train_batch_size"]
    micro, steps = conf["train_micro_batch_size_per_gpu"], conf["gradient_accumulation_steps"]
    if batch is not None and _dp_known(conf, dp):
        return _derived_batches(int(batch), micro, steps, _neox_dp(conf, dp))
    if micro is not None and steps is None:  # micro only: NeoX's accumulation is 1
        steps = 1
    return (None if micro is None else int(micro)), (None if steps is None else int(steps))


def _derived_batches(batch: int, micro: int | None, steps: int | None, dp: int) -> tuple[int, int]:
    """NeoX's ``calculate_batch_parameters`` with ``train_batch_size`` given: the micro batch or
    the accumulation steps it lacks, by floor division (1 step when both are missing)."""
    if micro is None:
        steps = steps or 1
        return batch // dp // steps, steps
    if steps is None:
        return micro, batch // micro // dp
    return micro, steps


def _check_neox_batch(conf: Mapping[str, Any], dp: int) -> None:
    """NeoX's ``calculate_batch_parameters`` and ``check_batch_parameters``: a
    ``train_batch_size`` given must be micro batch x accumulation steps x the data-parallel size
    (the missing one derived from it by floor division, as NeoX does)."""
    batch = int(conf["train_batch_size"])
    micro, steps = _derived_batches(
        batch, conf["train_micro_batch_size_per_gpu"], conf["gradient_accumulation_steps"], dp
    )
    if micro < 1 or steps < 1 or batch != micro * steps * dp:
        raise ConfigError(
            f"the NeoX config's train_batch_size {batch} is not train_micro_batch_size_per_gpu"
            f" {micro} x gradient_accumulation_steps {steps} x {dp} data-parallel ranks"
            " (GPT-NeoX refuses it too)",
            hint="make train_batch_size = micro batch x accumulation steps x data-parallel size,"
            " or give only two of the three",
        )


def _neox_dp(conf: Mapping[str, Any], dp: int | None) -> int:
    """The data-parallel size: ``dp`` given, else NeoX's ``calculate_derived`` with the config's
    ``global_num_gpus`` (what NeoX's launcher writes into every rank's config, or counts from its
    hostfile: ``neox_launch``), else this process's world, over pipe x model parallel sizes."""
    if dp is not None:
        return dp
    model = max(1, int(conf["pipe_parallel_size"])) * max(1, int(conf["model_parallel_size"]))
    gpus = conf["global_num_gpus"]
    if gpus is not None and gpus < 1:  # an int (_check_neox_values)
        raise ConfigError(
            f"the NeoX config's global_num_gpus is {gpus!r}; expected a positive int",
            hint="fix global_num_gpus, or remove it (NeoX's launcher then counts the GPUs)",
        )
    world = gpus if gpus is not None else World.detect().world_size
    if world % model:
        # without a GPU count, this process's world stands for NeoX's count of a machine's GPUs
        why = "" if gpus is not None else f"; {uncounted_gpus(conf)}"
        raise ConfigError(
            f"{world} processes are not divisible by pipe x model parallel size {model}{why}",
            hint="give the job's GPUs: global_num_gpus in the config, as NeoX's launcher writes"
            " it, or world_size=N (prepare-cache: --prepare-cache-world-size N)"
            + ("" if gpus is not None else ", or point hostfile at the job's hostfile")
            + "; or its data-parallel size: data_parallel_size=N",
        )
    return world // model


register_importer("neox_config", neox_config_from_yaml)
