"""What each rank of the torchtitan tests runs (imported by spawned processes): build the loader
as torchtitan's Trainer does, train a few steps, and save or load through torchtitan's own
CheckpointManager (torch.distributed.checkpoint, gloo on CPU)."""

from __future__ import annotations

import torch
from torchtitan.components.checkpoint import CheckpointManager

from tokenload.integrations.torchtitan import TokenloadTitanDataLoader

SEQ = 16


class Box:
    """A Stateful stand-in for the optimizer, LR scheduler and train state (torchtitan's
    checkpointer needs only state_dict/load_state_dict of them)."""

    def __init__(self, **state) -> None:
        self.state = state

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state) -> None:
        self.state = dict(state)


def build(rank: int, world: int, prefix: str, local_batch_size: int, workers: int = 0):
    config = TokenloadTitanDataLoader.Config(data_path=[prefix], num_workers=workers)
    return config.build(  # the keywords torchtitan 0.3.0's Trainer.__init__ passes
        dp_world_size=world,
        dp_rank=rank,
        tokenizer=None,
        seq_len=SEQ,
        local_batch_size=local_batch_size,
        snapshot_every_n_steps=1,
    )


def checkpointer(loader, folder: str, step: int) -> tuple[CheckpointManager, Box]:
    train_state = Box(step=torch.tensor(step))
    manager = CheckpointManager.Config(enable=True, folder="ckpt", interval=1, keep_latest_k=0)
    return (
        manager.build(
            dataloader=loader,
            model_parts=[torch.nn.Linear(2, 2)],
            optimizers=Box(lr=torch.tensor(0.1)),
            lr_schedulers=Box(last=torch.tensor(0)),
            states={"train_state": train_state},
            sd_adapter=None,
            base_folder=folder,
        ),
        train_state,
    )


def train_then_save(rank, world, prefix, folder, local_batch_size, steps, workers):
    """Input rows of ``steps`` steps and the state saved, then a checkpoint at ``steps``."""
    loader = build(rank, world, prefix, local_batch_size, workers)
    it = iter(loader)
    rows = [next(it)[0]["input"].tolist() for _ in range(steps)]
    manager, _ = checkpointer(loader, folder, steps)
    manager.save(curr_step=steps)
    manager.close()
    loader.close()
    return rows, loader.state_dict()


def load_then_train(rank, world, prefix, folder, local_batch_size, step, steps):
    """The train state loaded, and the input rows of ``steps`` steps after the checkpoint."""
    loader = build(rank, world, prefix, local_batch_size)
    manager, train_state = checkpointer(loader, folder, 0)
    assert manager.load(step=step)
    manager.close()
    it = iter(loader)
    return int(train_state.state["step"]), [next(it)[0]["input"].tolist() for _ in range(steps)]
