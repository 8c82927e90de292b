"""Checks of tokenload.integrations.megatron against megatron-core 0.19.2's ``megatron.training``,
run by the Python that has megatron-core (``TOKENLOAD_MEGATRON_PYTHON``, made by
``.ci/megatron-venv.sh``); ``test_megatron_training.py`` launches them and reads their JSON.

``parity WORK``: one process (gloo, world 1). For each configuration, Megatron's own path
(``parse_and_validate_args``, ``get_train_valid_test_num_samples``,
``build_train_valid_test_datasets`` with pretrain_gpt.py's provider,
``build_pretraining_data_loader`` with the single or cyclic sampler) and tokenload's (the same
args with ``--dataloader-type external`` and tokenload's provider, Megatron's pass-through
loader and ``RerunDataIterator``) must give the same micro-batches, field by field, and stop at
the same batch. Consumed samples are set as a checkpoint restores them (train 16, valid 8).

``run WORK NAME ITERS``: one phase of a training run under torchrun (gloo ranks): Megatron's
loop arithmetic over tokenload's iterators (``get_num_microbatches()`` micro-batches per
iteration, ``consumed_train_samples += dp x micro x num_microbatches``, evaluations every
``--eval-interval``), then a checkpoint holding ``args`` as Megatron's does; with ``--load`` it
first restores the consumed samples as ``load_checkpoint`` does. Each rank records the tokens it
received by global sample index. ``verify WORK NAMES...`` checks the phases together against
Megatron's GPTDataset and reads the TensorBoard events the last rank wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

warnings.filterwarnings("ignore")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import torch  # noqa: E402

VOCAB = 1000  # NullTokenizer: eod = VOCAB - 1
BASE = [
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
    "--seq-length", "32", "--max-position-embeddings", "32",
    "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB), "--seed", "1234",
    "--distributed-backend", "gloo",
]


def write_corpus(work: str) -> dict[str, str]:
    """Three token files of random documents (EOD-terminated), written by tokenload; and ``n``,
    documents without a trailing EOD, some with EOD ids inside, some empty."""
    from tokenload.format import TokenFileWriter

    rng = np.random.default_rng(7)
    prefixes = {}
    for name, docs in (("a", 60), ("b", 40), ("c", 30)):
        prefix = os.path.join(work, name)
        if not os.path.exists(prefix + ".idx"):
            with TokenFileWriter(prefix, np.uint16) as w:
                for _ in range(docs):
                    doc = rng.integers(0, VOCAB - 1, size=int(rng.integers(5, 90)))
                    w.add_document(np.append(doc, VOCAB - 1).astype(np.int64))
        prefixes[name] = prefix
    prefix = prefixes["n"] = os.path.join(work, "n")
    if not os.path.exists(prefix + ".idx"):
        rng = np.random.default_rng(8)
        with TokenFileWriter(prefix, np.uint16) as w:
            for k in range(70):
                doc = rng.integers(0, VOCAB - 1, size=0 if k % 9 == 4 else int(rng.integers(1, 60)))
                if k % 5 == 1 and doc.size > 2:  # an EOD id inside, not at the end
                    doc[doc.size // 2] = VOCAB - 1
                w.add_document(doc.astype(np.int64))
    return prefixes


def configs(p: dict[str, str], work: str) -> dict[str, list[str]]:
    batch = ["--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "12",
             "--eval-iters", "2", "--eval-interval", "4", "--num-workers", "1"]
    return {
        "one-prefix": [*batch, "--data-path", p["a"], "--split", "90,8,2"],
        "weighted-blend": [*batch, "--data-path", "0.3", p["a"], "0.7", p["b"],
                           "--split", "80,15,5",
                           "--eod-mask-loss", "--reset-position-ids", "--reset-attention-mask"],
        "per-split": [*batch, "--train-data-path", "0.4", p["a"], "0.6", p["b"],
                      "--valid-data-path", p["c"], "--test-data-path", p["b"],
                      "--no-create-attention-mask-in-dataloader"],
        "mock": [*batch, "--mock-data"],
        "cyclic": [*batch, "--data-path", p["a"], "--split", "90,8,2",
                   "--tokenload-dataloader-type", "cyclic"],
        # cu_seqlens differ in length per sample: Megatron's collate needs micro-batches of 1
        "inter-document": [*batch, "--micro-batch-size", "1", "--data-path", p["b"],
                           "--split", "90,8,2", "--dataloader-inter-document-masking",
                           "--no-create-attention-mask-in-dataloader"],
        # documents without a trailing EOD: megatron-core's boundaries are the documents'
        # lengths (cu_seqlens padded to S + 1, so micro-batches of 2 collate)
        "inter-document-no-eod": [*INTER_DOCUMENT, "--data-path", p["n"]],
        "mock-inter-document": [*INTER_DOCUMENT, "--mock-data"],
    }


INTER_DOCUMENT_BATCH = ["--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters",
                        "12", "--eval-iters", "2", "--eval-interval", "4", "--num-workers", "1"]
INTER_DOCUMENT = [*INTER_DOCUMENT_BATCH, "--split", "90,8,2", "--dataloader-inter-document-masking",
                  "--reset-position-ids", "--eod-mask-loss",
                  "--no-create-attention-mask-in-dataloader"]


# -- Megatron's side ------------------------------------------------------------------------------

def init_process(world_size: int = 1) -> None:
    """gloo ranks and Megatron's parallel state (CPU: initialize_megatron skips the latter)."""
    from megatron.core import parallel_state as mpu

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")
    if not mpu.model_parallel_is_initialized():
        mpu.initialize_model_parallel(1, 1)


def megatron_args(argv: list[str]):
    """Megatron's parser, validation and globals (tokenizer, writers), as pretrain_gpt.py's main."""
    from megatron.training.arguments import parse_and_validate_args
    from megatron.training.global_vars import unset_global_variables

    from tokenload.integrations.megatron import add_arguments

    unset_global_variables()
    sys.argv = ["pretrain_gpt.py", *BASE, *argv]
    return parse_and_validate_args(extra_args_provider=add_arguments,
                                   args_defaults={"tokenizer_type": "GPT2BPETokenizer"})


def reference_provider(train_val_test_num_samples, vp_stage=None):
    """pretrain_gpt.py's provider (Megatron-LM core_r0.19: its core_gpt_dataset_config_from_args
    and train_valid_test_datasets_provider), for GPT pretraining data (no SFT/FIM)."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
    from megatron.training import get_args, get_tokenizer
    from megatron.training.utils import get_blend_and_blend_per_split

    args = get_args()
    blend, blend_per_split = get_blend_and_blend_per_split(args)
    config = GPTDatasetConfig(
        random_seed=args.seed, sequence_length=args.seq_length, blend=blend,
        blend_per_split=blend_per_split, split=args.split,
        multiple_validation_sets=args.multiple_validation_sets,
        full_validation=args.full_validation,
        num_dataset_builder_threads=args.num_dataset_builder_threads,
        path_to_cache=args.data_cache_path, mmap_bin_files=args.mmap_bin_files,
        tokenizer=get_tokenizer(), reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask, eod_mask_loss=args.eod_mask_loss,
        create_attention_mask=args.create_attention_mask_in_dataloader,
        object_storage_cache_path=args.object_storage_cache_path,
        mid_level_dataset_surplus=args.mid_level_dataset_surplus,
        allow_ambiguous_pad_tokens=args.allow_ambiguous_pad_tokens,
        fast_cache_load=args.dataloader_fast_cache_load, sequences_per_dataset=None,
        defer_npy_index_mmap=args.dataloader_defer_npy_index_mmap,
        context_parallel_size=args.context_parallel_size,
        data_parallel_size=args.data_parallel_size,
        sequence_parallel_size=args.tensor_model_parallel_size * args.sequence_parallel,
        hybrid_context_parallel=args.hybrid_context_parallel,
        inter_document_masking=args.dataloader_inter_document_masking,
    )
    kind = MockGPTDataset if args.mock_data else GPTDataset
    return BlendedMegatronDatasetBuilder(kind, train_val_test_num_samples, lambda: True,
                                         config).build()


def loaders(provider, args, sizes):
    """Megatron's path from a provider to the three iterators (training.py's
    build_train_valid_test_data_loaders/iterators without their CUDA flag broadcast)."""
    from megatron.core.rerun_state_machine import RerunDataIterator
    from megatron.training.datasets.data_samplers import build_pretraining_data_loader
    from megatron.training.training import build_train_valid_test_datasets, cyclic_iter

    datasets = build_train_valid_test_datasets(provider, sizes)
    starts = (args.consumed_train_samples, args.consumed_valid_samples, 0)
    out = []
    for ds, start in zip(datasets, starts):
        dl = build_pretraining_data_loader(ds, start)
        if dl is None:
            out.append(None)
        elif args.dataloader_type == "single":
            out.append(RerunDataIterator(iter(dl)))
        elif args.dataloader_type == "cyclic":
            out.append(RerunDataIterator(iter(cyclic_iter(dl))))
        else:
            out.append(RerunDataIterator(dl))
    return out


# -- parity ---------------------------------------------------------------------------------------

def compare(ours, theirs, limit: int) -> tuple[int, list[str]]:
    """Micro-batches compared until both end (or ``limit``); raises on the first difference."""
    n = 0
    while n < limit:
        a, b = _next(ours), _next(theirs)
        if a is None or b is None:
            if (a is None) != (b is None):
                ended = {True: "ended", False: "went on"}
                raise AssertionError(f"micro-batch {n}: tokenload {ended[a is None]},"
                                     f" Megatron {ended[b is None]}")
            break
        keys = sorted(k for k, v in b.items() if v is not None)
        if sorted(k for k, v in a.items() if v is not None) != keys:
            raise AssertionError(f"micro-batch {n}: fields {sorted(a)} != Megatron's {keys}")
        for k in keys:
            x, y = a[k], b[k]
            if k != "dataset_id" and x.dtype != y.dtype:
                raise AssertionError(f"micro-batch {n} {k}: dtype {x.dtype} != {y.dtype}")
            if x.shape != y.shape or not torch.equal(x.to(y.dtype), y):
                raise AssertionError(f"micro-batch {n} {k} differs:\n{x}\n{y}")
        n += 1
    return n, keys


def _next(it):
    try:
        return next(it)
    except StopIteration:
        return None


class WandbRecorder:
    """Stands in for Megatron's W&B writer (wandb is not installed): records ``log`` calls."""

    def __init__(self):
        self.calls = []

    def log(self, values, step):
        self.calls.append((step, dict(values)))


def parity(work: str) -> dict:
    from megatron.training import global_vars

    from tokenload.integrations.megatron import train_valid_test_datasets_provider

    init_process()
    prefixes = write_corpus(work)
    report: dict[str, Any] = {}
    for name, argv in configs(prefixes, work).items():
        mcache, tcache = os.path.join(work, name, "megatron"), os.path.join(work, name, "tokenload")
        kind = "cyclic" if "cyclic" in argv else "single"
        args = megatron_args([*argv, "--dataloader-type", kind, "--data-cache-path", mcache])
        from megatron.training.training import get_train_valid_test_num_samples

        sizes = get_train_valid_test_num_samples()
        # as restored from a checkpoint: training and evaluation resume mid-way
        args.consumed_train_samples, args.consumed_valid_samples = 16, 8
        theirs = loaders(reference_provider, args, sizes)
        args.dataloader_type, args.data_cache_path = "external", tcache
        recorder = WandbRecorder()
        global_vars._GLOBAL_WANDB_WRITER = recorder
        ours = loaders(train_valid_test_datasets_provider, args, sizes)
        entry: dict[str, Any] = {"sizes": list(sizes)}
        for split, a, b in zip(("train", "valid", "test"), ours, theirs):
            count, keys = compare(a, b, limit=40 if kind == "cyclic" else 500)
            entry[split] = count
            entry["fields"] = keys
        entry["wandb_steps"] = sorted({step for step, _ in recorder.calls})
        entry["wandb_consumed"] = sorted({v["tokenload/consumed-samples"]
                                          for _, v in recorder.calls})
        if not args.mock_data:
            entry["megatron_cache"] = sorted(_files(mcache))
            entry["tokenload_cache"] = sorted(_files(tcache))
        for it in ours:
            it.iterable.close()
        report[name] = entry
    args.dataloader_type = "single"  # Megatron would wrap the loaders in its own sampler
    try:
        train_valid_test_datasets_provider([8, 8, 8])
    except ValueError as exc:  # tokenload's ConfigError
        report["refused"] = str(exc)
    return report


def _files(folder: str) -> list[str]:
    return [f for _, _, files in os.walk(folder) for f in files]


# -- THD: cu_seqlens through megatron.training's get_batch path ------------------------------------

def thd(work: str) -> dict:
    """tokenload's batches (data without trailing EODs, ``--dataloader-inter-document-masking``,
    micro-batches of 2) through ``megatron.training.training.dummy_train_step``, which reads the
    iterator as pretrain_gpt.py's ``get_batch`` does (``get_batch_on_this_tp_rank`` with
    ``has_cu_seqlens``, then ``get_batch_on_this_cp_rank``), and then
    ``megatron.core.utils.flatten_batch_for_packed_sequences`` (the THD layout: one row, one
    merged ``cu_seqlens``), into a ``PackedSeqParams(qkv_format="thd")``. On the CPU, ``.cuda()``
    returns the tensor itself and ``torch.cuda.current_device()`` is ``"cpu"``; the broadcasts run
    on the gloo tensor-parallel group of one rank. Each merged ``cu_seqlens`` must be the
    micro-batch's rows joined, as the attention kernels read them."""
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.utils import flatten_batch_for_packed_sequences
    from megatron.training import training
    from megatron.training.training import get_train_valid_test_num_samples

    from tokenload.integrations.megatron import train_valid_test_datasets_provider

    init_process()
    prefixes = write_corpus(work)
    args = megatron_args([*INTER_DOCUMENT, "--data-path", prefixes["n"], "--dataloader-type",
                          "external", "--data-cache-path", os.path.join(work, "thd-cache")])
    train, _, _ = loaders(train_valid_test_datasets_provider, args,
                          get_train_valid_test_num_samples())
    seen = []
    original = training.get_batch_on_this_cp_rank

    def capture(batch, **kwargs):  # what get_batch_on_this_tp_rank returned
        seen.append({k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)})
        return original(batch, **kwargs)

    cuda, device = torch.Tensor.cuda, torch.cuda.current_device
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.current_device = lambda: "cpu"
    training.get_batch_on_this_cp_rank = capture
    try:
        for _ in range(3):  # three iterations of get_num_microbatches() micro-batches
            training.dummy_train_step(train)
    finally:
        torch.Tensor.cuda, torch.cuda.current_device = cuda, device
        training.get_batch_on_this_cp_rank = original
    seq, mbs = args.seq_length, args.micro_batch_size
    documents = 0
    for batch in seen:
        rows = batch["cu_seqlens"]
        assert rows.dtype == torch.int32 and rows.shape == (mbs, seq + 1), rows.shape
        flat = flatten_batch_for_packed_sequences(dict(batch))
        cu = flat["cu_seqlens"][0]
        joined = [0]
        for i, row in enumerate(rows.tolist()):
            ends = row[1: row.index(seq) + 1]  # the row's boundaries up to its first S
            joined += [i * seq + e for e in ends]
        if cu.tolist() != joined:
            raise AssertionError(f"merged cu_seqlens {cu.tolist()} != the rows joined {joined}")
        if flat["tokens"].shape != (1, mbs * seq) or int(flat["max_seqlen"][0]) != int(
            torch.diff(cu).max()
        ):
            raise AssertionError("THD batch: tokens or max_seqlen do not follow cu_seqlens")
        params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                 max_seqlen_q=int(flat["max_seqlen"][0]),
                                 max_seqlen_kv=int(flat["max_seqlen"][0]))
        assert params.cu_seqlens_q[-1] == mbs * seq
        documents += len(joined) - 1
    train.iterable.close()
    return {"micro_batches": len(seen), "documents": documents,
            "fields": sorted(seen[0]) if seen else []}


# -- a training run in phases ---------------------------------------------------------------------

def run_phase(work: str, name: str, iters: int, load: str | None) -> None:
    from megatron.core import parallel_state as mpu
    from megatron.core.num_microbatches_calculator import get_num_microbatches

    from tokenload.integrations.megatron import train_valid_test_datasets_provider

    init_process()
    rank, dp = torch.distributed.get_rank(), mpu.get_data_parallel_world_size()
    if rank == 0:
        write_corpus(work)
    torch.distributed.barrier()
    prefixes = write_corpus(work)  # the names of the files rank 0 wrote
    args = megatron_args(run_argv(prefixes, work))
    args.iteration = 0
    if load is not None:  # checkpointing.load_checkpoint's restore of the data position
        checkpoint = torch.load(load, weights_only=False)
        checkpoint_args = checkpoint["args"]
        args.iteration = checkpoint["iteration"]
        args.consumed_train_samples = getattr(checkpoint_args, "consumed_train_samples", 0)
        args.consumed_valid_samples = getattr(checkpoint_args, "consumed_valid_samples", 0)
    from megatron.training.training import get_train_valid_test_num_samples

    train, valid, _ = loaders(train_valid_test_datasets_provider, args,
                              get_train_valid_test_num_samples())
    seen: dict[str, dict[int, list[int]]] = {"train": {}, "valid": {}}
    mbs = args.micro_batch_size
    for _ in range(iters):
        start = args.consumed_train_samples
        for m in range(get_num_microbatches()):
            batch = next(train)
            base = start + m * mbs * dp + mpu.get_data_parallel_rank() * mbs
            for j in range(mbs):
                seen["train"][base + j] = batch["tokens"][j].tolist()
        args.consumed_train_samples += dp * mbs * get_num_microbatches()
        args.iteration += 1
        if args.iteration % args.eval_interval == 0:  # training.py's evaluate()
            for _ in range(args.eval_iters):
                start = args.consumed_valid_samples
                for m in range(get_num_microbatches()):
                    batch = next(valid)
                    base = start + m * mbs * dp + mpu.get_data_parallel_rank() * mbs
                    for j in range(mbs):
                        seen["valid"][base + j] = batch["tokens"][j].tolist()
                args.consumed_valid_samples += args.global_batch_size
    from megatron.training.global_vars import get_tensorboard_writer

    if get_tensorboard_writer() is not None:
        get_tensorboard_writer().flush()
    with open(os.path.join(work, f"{name}-rank{rank}.json"), "w") as f:
        json.dump(seen, f)
    if rank == 0:  # Megatron's checkpoint holds the args (with the consumed samples)
        torch.save({"args": args, "iteration": args.iteration},
                   os.path.join(work, f"{name}.ckpt"))
    train.iterable.close()
    valid.iterable.close()
    torch.distributed.barrier()


def run_argv(p: dict[str, str], work: str) -> list[str]:
    return ["--micro-batch-size", "2", "--global-batch-size", "16", "--train-iters", "10",
            "--eval-iters", "1", "--eval-interval", "3", "--num-workers", "2",
            "--data-path", "0.5", p["a"], "0.5", p["b"], "--split", "90,8,2",
            "--dataloader-type", "external", "--data-cache-path", os.path.join(work, "cache"),
            "--tensorboard-dir", os.path.join(work, "tb"), "--tensorboard-log-interval", "2"]


def verify(work: str, names: list[str]) -> dict:
    """The phases' samples together against Megatron's GPTDataset, one process."""
    init_process()
    prefixes = write_corpus(work)
    args = megatron_args([*run_argv(prefixes, work), "--dataloader-type", "single"])
    args.data_cache_path = os.path.join(work, "megatron-cache")
    from megatron.training.training import get_train_valid_test_num_samples

    datasets = reference_provider(get_train_valid_test_num_samples())
    report: dict[str, Any] = {}
    for split, ds in (("train", datasets[0]), ("valid", datasets[1])):
        seen: dict[int, list[int]] = {}
        for name in names:
            for path in sorted(os.listdir(work)):
                if path.startswith(f"{name}-rank") and path.endswith(".json"):
                    part = json.loads(Path(os.path.join(work, path)).read_text())[split]
                    for k, tokens in part.items():
                        if int(k) in seen:
                            raise AssertionError(f"{split} sample {k} served twice")
                        seen[int(k)] = tokens
        if sorted(seen) != list(range(len(seen))):
            raise AssertionError(f"{split}: samples {sorted(set(range(max(seen) + 1)) - set(seen))}"
                                 " were skipped")
        for k, tokens in seen.items():
            if tokens != ds[k]["tokens"].tolist():
                raise AssertionError(f"{split} sample {k} differs from Megatron's GPTDataset")
        report[split] = len(seen)
    report["tensorboard"] = tensorboard_scalars(os.path.join(work, "tb"))
    return report


def tensorboard_scalars(folder: str) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, Any] = {}
    for root, _, files in os.walk(folder):
        if any(f.startswith("events.") for f in files):
            acc = EventAccumulator(root, size_guidance={"scalars": 0})
            acc.Reload()
            for tag in acc.Tags()["scalars"]:
                out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=("parity", "run", "verify", "thd"))
    p.add_argument("work")
    p.add_argument("names", nargs="*")
    p.add_argument("--iters", type=int, default=0)
    p.add_argument("--load")
    a = p.parse_args()
    if a.command == "parity":
        result = parity(a.work)
    elif a.command == "thd":
        result = thd(a.work)
    elif a.command == "run":
        run_phase(a.work, a.names[0], a.iters, a.load)
        result = {"ok": True}
    else:
        result = verify(a.work, a.names)
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
