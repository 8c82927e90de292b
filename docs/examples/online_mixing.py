"""Online data mixing with tokenload: a training loop that steers its own mixture.

    python docs/examples/online_mixing.py [--steps 120] [--workers 0]

Two sources of different difficulty are written in-process into a temporary folder: ``easy``
repeats one short phrase over and over (a small model learns it in a few steps), ``hard`` is
uniformly random tokens (its loss cannot fall below ln(vocabulary)). A computed-order blend
serves them 1:1 to a tiny bigram model on the CPU. After every step the loop turns the per-row
loss into a loss per source (``tokenload.mixing.per_source_loss``; on several ranks, all-reduce
its sum and count first) and gives it to ODM's Exp3 rule (``tokenload.mixing.ODMExp3``: Albalak
et al. 2023, arXiv:2312.02406), whose weights it hands to ``loader.set_weights``. The rule
rewards a source by its loss, so weight moves to the hard source: printed every few steps, with
the shares of the rows that were served. About 16 s of CPU (a minute or more of wall time on a
busy shared machine). A change every step makes loader workers remake the micro-batches they made
ahead, every step (the stream is the same with any worker count): with a controller that moves
every step, 0 workers, or a change every few steps, wastes nothing.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.format import TokenFileWriter
from tokenload.loader import build_dataloader
from tokenload.mixing import ODMExp3, per_source_loss

VOCAB, S = 64, 32


def write_sources(folder: Path) -> list[str]:
    rng = np.random.default_rng(0)
    phrase = np.array([5, 9, 2, 7, 11, 3, 8, 1], dtype=np.uint16)
    lengths = np.full(2000, 64)
    easy = np.tile(phrase, lengths.sum() // phrase.size)
    hard = rng.integers(0, VOCAB, size=int(lengths.sum()), dtype=np.uint16)
    prefixes = []
    for name, tokens in (("easy", easy), ("hard", hard)):
        prefix = str(folder / name)
        with TokenFileWriter(prefix, np.uint16) as writer:
            writer.add_documents(tokens, lengths)
        prefixes.append(prefix)
    return prefixes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--micro-batch", type=int, default=32)
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        easy, hard = write_sources(Path(tmp))
        config = MegatronDataConfig(
            sequence_length=S, blend=["1", easy, "1", hard], split="100,0,0", order="computed"
        )
        dataset = build_datasets(config, [args.steps * args.micro_batch, 0, 0])[0]
        loader = build_dataloader(
            dataset,
            micro_batch_size=args.micro_batch,
            dp_rank=0,
            dp_size=1,
            num_workers=args.workers,
        )
        model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB))
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
        controller = ODMExp3(num_sources=2)
        served = np.zeros(2)
        print("step  loss easy  loss hard  weights (easy, hard)  rows served (easy, hard)")
        for step, batch in enumerate(loader, start=1):
            logits = model(batch["tokens"])
            per_token = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), batch["labels"].flatten(), reduction="none"
            ).view_as(batch["labels"])
            mask = batch["loss_mask"]
            loss_per_row = (per_token * mask).sum(1) / mask.sum(1)
            optimizer.zero_grad()
            loss_per_row.mean().backward()
            optimizer.step()
            losses = per_source_loss(loss_per_row.detach(), batch["dataset_id"], 2)
            # several ranks: torch.distributed.all_reduce(losses.sum); all_reduce(losses.count)
            weights = controller.update(losses.mean.tolist())
            loader.set_weights(weights)  # from the next step on, on every rank alike
            served += losses.count.numpy()
            if step % 15 == 0 or step == 1:
                mean = losses.mean.tolist()
                shares = f"({weights[0]:.3f}, {weights[1]:.3f})"
                rows = f"({served[0]:.0f}, {served[1]:.0f})"
                print(f"{step:4d}  {mean[0]:9.3f}  {mean[1]:9.3f}  {shares}        {rows}")
                served[:] = 0
        state = loader.state_dict()
        loader.close()
        print(f"{len(state['weights_changes'])} changes recorded in the loader's state")


if __name__ == "__main__":
    main()
