"""TokenloadTitanDataLoader with torchtitan 0.3.0's own components: its Configurable config system
(build with the Trainer's keywords, tyro parsing with torchtitan's registry), its batch contract
(``(input_dict, labels)``, IGNORE_INDEX), and its CheckpointManager saving and loading through
torch.distributed.checkpoint on real gloo processes, resumed on another data-parallel size.

torchtitan's Trainer module itself imports triton, which has no CPU build, so the trainer object
is not constructed here: the loader is built with exactly the keywords ``Trainer.__init__`` passes.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import tyro
from torchtitan.components.dataloader import BaseDataLoader, ParallelAwareDataloader
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.config.manager import custom_registry

from distributed.launch import run_ranks
from support import write_documents
from tokenload.errors import ConfigError, StateError
from tokenload.integrations.torchtitan import TokenloadTitanDataLoader
from tokenload.loader import build_dataloader

from . import titan_ranks
from .titan_ranks import SEQ, build

EOD = 999


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    rng = np.random.default_rng(7)
    docs = [[*list(rng.integers(0, 900, rng.integers(3, 50))), EOD] for _ in range(300)]
    return write_documents(tmp_path_factory.mktemp("titan") / "corpus", docs)


def test_config_is_torchtitans_and_builds_with_the_trainers_keywords(prefix):
    config = TokenloadTitanDataLoader.Config(data_path=[prefix], num_workers=0)
    assert isinstance(config, BaseDataLoader.Config)
    loader = build(1, 2, prefix, 4)
    assert isinstance(loader, BaseDataLoader)
    assert (loader.dp_rank, loader.dp_world_size) == (1, 2)

    @dataclasses.dataclass(kw_only=True)
    class TrainerLike:  # how Trainer.Config declares it: dataloader: BaseDataLoader.Config
        dataloader: BaseDataLoader.Config = dataclasses.field(default_factory=lambda: config)

    parsed = tyro.cli(
        TrainerLike,
        args=["--dataloader.order", "computed", "--dataloader.seed", "5"],
        default=TrainerLike(dataloader=config),
        registry=custom_registry,
    )
    assert type(parsed.dataloader) is TokenloadTitanDataLoader.Config
    assert (parsed.dataloader.order, parsed.dataloader.seed) == ("computed", 5)
    assert parsed.dataloader.data_path == [prefix]


def test_batches_are_input_dict_and_labels_of_tokenloads_order(prefix):
    loader = build(1, 2, prefix, 4)
    plain = build_dataloader(loader.dataset, micro_batch_size=4, dp_rank=1, dp_size=2,
                             num_workers=0)
    expected = len(plain)
    assert len(loader) == expected > 10
    seen = 0
    for (inputs, labels), batch in zip(loader, plain):
        seen += 1
        assert set(inputs) == {"input", "positions"}
        assert inputs["input"].dtype == labels.dtype == inputs["positions"].dtype == torch.int64
        assert inputs["input"].shape == labels.shape == inputs["positions"].shape == (4, SEQ)
        assert torch.equal(inputs["input"], batch["tokens"])
        assert torch.equal(inputs["positions"], batch["position_ids"])
        assert torch.equal(labels, batch["labels"])
        assert torch.equal(labels[:, :-1], inputs["input"][:, 1:])
    assert seen == expected


def test_eod_mask_loss_becomes_ignore_index(prefix):
    class Tokenizer:
        eos_id = EOD

    config = TokenloadTitanDataLoader.Config(data_path=[prefix], num_workers=0,
                                             eod_mask_loss=True)
    loader = config.build(dp_world_size=1, dp_rank=0, tokenizer=Tokenizer(), seq_len=SEQ,
                          local_batch_size=8)
    _inputs, labels = next(iter(loader))
    plain = build_dataloader(loader.dataset, micro_batch_size=8, num_workers=0, dp_rank=0,
                             dp_size=1)
    batch = next(iter(plain))
    masked = batch["loss_mask"] == 0
    # Megatron's --eod-mask-loss: no loss where the input token is the EOD
    assert masked.any() and torch.equal(masked, batch["tokens"] == EOD)
    assert torch.equal(labels == IGNORE_INDEX, masked)
    assert torch.equal(labels[~masked], batch["labels"][~masked])


@pytest.fixture(scope="module")
def no_eod(tmp_path_factory):
    """Documents of 1-30 tokens, none ending with an EOD id."""
    rng = np.random.default_rng(11)
    docs = [list(rng.integers(0, 900, rng.integers(1, 30))) for _ in range(300)]
    return write_documents(tmp_path_factory.mktemp("titan_no_eod") / "corpus", docs)


def _get_document_mask_mod():
    """torchtitan 0.3.0's ``get_document_mask_mod``, its own source: importing
    ``torchtitan.models.common`` imports its MoE kernels, which need triton (no CPU build), so
    the function is taken from ``attention.py`` and run as it is written."""
    import ast
    import importlib.util
    from pathlib import Path

    path = Path(importlib.util.find_spec("torchtitan").origin).parent / "models/common/attention.py"
    tree = ast.parse(path.read_text())
    (node,) = [n for n in tree.body if getattr(n, "name", None) == "get_document_mask_mod"]
    namespace = {"torch": torch, "_mask_mod_signature": object}
    exec(compile(ast.Module([node], []), str(path), "exec"), namespace)
    return namespace["get_document_mask_mod"]


def _documents_of(positions):
    """torchtitan's own get_document_mask_mod, evaluated on every (query, key) pair of each row:
    True where the two tokens are in one document."""
    mask_mod = _get_document_mask_mod()(positions)
    rows, seq = positions.shape
    q, kv = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    return torch.stack([mask_mod(torch.tensor(b), torch.tensor(0), q, kv) for b in range(rows)])


def _same_document(cu_seqlens, seq):
    """True where two tokens lie between the same pair of boundaries."""
    starts = torch.zeros(cu_seqlens.shape[0], seq, dtype=torch.long)
    for r, row in enumerate(cu_seqlens.tolist()):
        for begin in row[:-1]:
            if begin < seq:
                starts[r, begin:] = begin
    return starts[:, :, None] == starts[:, None, :]


@pytest.mark.parametrize("order,packing", [("megatron", "concat"), ("computed", "concat"),
                                           ("computed", "best-fit")])
def test_positions_give_torchtitan_the_documents_of_the_token_files(no_eod, tmp_path, order,
                                                                     packing):
    """No EOD in the data, no tokenizer: the positions restart where the token file's documents
    do, so torchtitan's document mask (positions == 0) separates exactly the documents whose
    boundaries tokenload's cu_seqlens give (megatron-core's, tests/unit/datasets); the config's
    packing reaches the dataset."""
    config = TokenloadTitanDataLoader.Config(data_path=[no_eod], num_workers=0, order=order,
                                             packing=packing, data_cache_path=str(tmp_path))
    loader = config.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=SEQ,
                          local_batch_size=4)
    assert ("Packed" in type(loader.dataset).__name__) == (packing == "best-fit")
    plain = build_dataloader(loader.dataset, micro_batch_size=4, num_workers=0, dp_rank=0,
                             dp_size=1)
    several = 0
    for k, ((inputs, _), batch) in enumerate(zip(loader, plain)):
        if k == 5:
            break
        assert torch.equal(inputs["positions"], batch["position_ids"])
        same = _same_document(batch["cu_seqlens"], SEQ)
        assert torch.equal(_documents_of(inputs["positions"]), same)
        several += int((inputs["positions"][:, 1:] == 0).any(dim=1).sum())
    assert several > 0  # rows of several documents
    loader.close()


def test_document_positions_off_and_a_wrong_packing(no_eod):
    config = TokenloadTitanDataLoader.Config(data_path=[no_eod], num_workers=0,
                                             document_positions=False)
    loader = config.build(dp_world_size=1, dp_rank=0, seq_len=SEQ, local_batch_size=4)
    inputs, _ = next(iter(loader))
    assert torch.equal(inputs["positions"], torch.arange(SEQ).expand(4, SEQ))
    loader.close()
    with pytest.raises(ConfigError, match="packing"):
        TokenloadTitanDataLoader.Config(data_path=[no_eod], packing="first-fit").build(
            dp_world_size=1, dp_rank=0, seq_len=SEQ, local_batch_size=4)


def test_wrong_states_and_config_are_typed_errors(prefix):
    loader = build(0, 1, prefix, 4)
    with pytest.raises(StateError, match="dp_rank_N"):
        loader.load_state_dict({"dp_rank_0": b"...", "world_size": 1})
    with pytest.raises(StateError, match="not the JSON"):
        loader.load_state_dict({"tokenload": "{"})
    other = build(0, 1, prefix, 4)
    other.load_state_dict({})  # torchtitan's "nothing saved": a fresh start
    with pytest.raises(ConfigError, match=r"dataloader.data_path"):
        TokenloadTitanDataLoader.Config().build(dp_world_size=1, dp_rank=0, seq_len=SEQ,
                                                local_batch_size=4)
    longer = TokenloadTitanDataLoader.Config(num_workers=0).build(
        dp_world_size=1, dp_rank=0, seq_len=SEQ, local_batch_size=4,
        token_dataset=_dataset(prefix, SEQ * 2),
    )
    with pytest.raises(ConfigError, match=r"training.seq_len"):
        next(iter(longer))


def _dataset(prefix, seq):
    from tokenload.datasets import MegatronDataConfig, build_datasets

    return build_datasets(MegatronDataConfig(sequence_length=seq, blend=[prefix],
                                             split="100,0,0"), [None, 0, 0])[0]


def test_torchtitans_own_loader_refuses_another_dp_size_and_the_state_is_one_key(prefix):
    class Rows(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(8))

    own = ParallelAwareDataloader(Rows(), dp_rank=0, dp_world_size=2)
    saved = {"dp_rank_0": b"", "world_size": 4}
    with pytest.raises(AssertionError, match="resharding is not supported"):
        own.load_state_dict(saved)
    states = [build(r, 2, prefix, 4).state_dict() for r in range(2)]
    assert list(states[0]) == ["tokenload"] and states[0] == states[1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("before, after", [(2, 4)])
def test_checkpoint_resumes_exactly_on_another_dp_size(tmp_path, prefix, before, after):
    global_batch, steps, more = 8, 3, 2
    saved = run_ranks(before, titan_ranks.train_then_save, prefix, str(tmp_path),
                      global_batch // before, steps, 1, timeout=240)
    resumed = run_ranks(after, titan_ranks.load_then_train, prefix, str(tmp_path),
                        global_batch // after, steps, more, timeout=240)
    # the global order: one rank consuming whole global batches
    reference = build(0, 1, prefix, global_batch)
    it = iter(reference)
    order = [next(it)[0]["input"].tolist() for _ in range(steps + more)]
    # DCP keeps one copy of a key every rank saves: the ranks' states must be the same
    assert all(state == saved[0][1] for _, state in saved)
    for step in range(steps):
        assert [row for rank, _ in saved for row in rank[step]] == order[step]
    assert [r[0] for r in resumed] == [steps] * after  # the trainer's own state came back too
    for step in range(more):
        assert [row for rank in resumed for row in rank[1][step]] == order[steps + step]
