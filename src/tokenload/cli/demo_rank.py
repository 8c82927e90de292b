"""One rank of ``tokenload demo``: what torchrun starts on every process of the demo's job.

``python -m tokenload.cli.demo_rank --job DIR/job.json --phase run|resume``, under
``torch.distributed.run``, joins a gloo process group (so that every rank starts its data phase
at the same moment, as a real job's ranks do), then for each order of the job (Megatron's order
on the prepared cache with ``build_policy="none"``, the computed order, mock data) builds the
datasets, iterates a loader with a simulated training step and writes what it measured and a
digest of every sample it served to ``DIR/results/``. The ``run`` phase saves the loader state
after the job's checkpoint step and goes on, uninterrupted; the ``resume`` phase, on another rank
count, loads that state and serves the steps after it, so that the parent can compare them.

A failure is written as one line to ``DIR/errors/rank{R}.txt`` (the traceback goes to stderr,
which the parent keeps in a log) and the rank exits 1; torchrun then stops the others.

``TOKENLOAD_DEMO_FAIL_RANK=R`` (a test hook) makes rank R fail at its first order with a
StorageError, to rehearse that path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..datasets import MegatronDataConfig

#: The orders every rank runs, in the table's order.
ORDERS = ("megatron", "computed", "mock")
FAIL_HOOK = "TOKENLOAD_DEMO_FAIL_RANK"


def order_config(job: dict[str, Any], order: str, *, prepare: bool = False) -> MegatronDataConfig:
    """The ``MegatronDataConfig`` of ``order`` for the job; ``prepare`` gives the one-process
    build that writes the Megatron order's caches and manifest (what ``prepare-cache`` runs)."""
    from ..datasets import MegatronDataConfig

    common = dict(
        sequence_length=job["seq_length"],
        eod_id=job["eod_id"],
        vocab_size=job["vocab_size"],
        random_seed=job["seed"],
    )
    if order == "mock":
        return MegatronDataConfig(**common, cache="off")
    data = dict(common, blend=[job["prefix"]], split=job["split"], sequences_path=job["sequences"])
    if order == "computed":
        return MegatronDataConfig(**data, order="computed")
    policy = "rank0" if prepare else "none"
    return MegatronDataConfig(**data, path_to_cache=job["cache"], build_policy=policy)


def row_digests(tokens: Any) -> list[str]:
    """A short digest of each sample (row) of a ``tokens`` batch."""
    array = tokens.numpy() if hasattr(tokens, "numpy") else tokens
    return [hashlib.blake2b(row.tobytes(), digest_size=8).hexdigest() for row in array]


def _run_order(
    job: dict[str, Any], order: str, phase: str, rank: int, world: int
) -> dict[str, Any]:
    from ..datasets import build_datasets
    from ..errors import StorageError
    from ..loader import build_dataloader

    if os.environ.get(FAIL_HOOK) == str(rank):
        raise StorageError(
            f"rehearsed failure of rank {rank} ({FAIL_HOOK})", hint="unset the test hook"
        )
    checkpoint, steps = job["checkpoint"], job["steps"]
    mbs = job["global_batch"] // world
    start = time.perf_counter()
    train, _, _ = build_datasets(order_config(job, order), job["sizes"])
    built = time.perf_counter() - start
    assert train is not None  # the job's split gives every order a train split
    loader = build_dataloader(
        train, micro_batch_size=mbs, num_workers=job["workers"], dp_rank=rank, dp_size=world
    )
    folder = Path(job["work"]) / "states"
    state_file = folder / f"{order}.json"
    if phase == "resume":
        loader.load_state_dict(json.loads(state_file.read_text()))
    first_step = checkpoint if phase == "resume" else 0
    served: dict[str, list[str]] = {}
    first, steady_from, loop_from = None, 0.0, time.perf_counter()
    waits: list[float] = []  # seconds blocked in next() at each step, the first batch's included
    batches = iter(loader)
    try:
        for step in range(first_step, steps):
            asked = time.perf_counter()
            batch = next(batches, None)
            got = time.perf_counter()
            if batch is None:
                break
            waits.append(got - asked)
            if first is None:
                first, steady_from, loop_from = got - start, got, asked
            if step >= checkpoint:
                served[str(step)] = row_digests(batch["tokens"])
            time.sleep(job["step_ms"] / 1e3)  # the training step the data has to keep up with
            if phase == "run" and step + 1 == checkpoint and rank == 0:
                folder.mkdir(exist_ok=True)
                tmp = state_file.with_suffix(".tmp")
                tmp.write_text(json.dumps(loader.state_dict()))
                tmp.replace(state_file)
        end = time.perf_counter()
        steady_s = end - steady_from if first is not None else 0.0
        metrics = loader.metrics()
    finally:
        loader.close()
    return {
        "order": order,
        "phase": phase,
        "rank": rank,
        "world": world,
        "build_s": built,
        "first_batch_s": first,
        "samples": metrics["samples"],
        "active_s": metrics["active_s"],
        # from asking the first batch to the end of the last step (its simulated step included)
        "loop_s": end - loop_from,
        "wait_share": metrics["data_wait"]["share"],
        # the share of the steps after the first batch: what a long run's loop waits
        "steady_wait_share": sum(waits[1:]) / steady_s if steady_s > 0 else None,
        "served": served,
    }


def _one_line(exc: BaseException) -> str:
    from ..errors import TokenloadError
    from .main import one_line

    return one_line(exc) if isinstance(exc, TokenloadError) else f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tokenload.cli.demo_rank")
    parser.add_argument("--job", required=True, help="the job.json the demo wrote")
    parser.add_argument("--phase", choices=("run", "resume"), required=True)
    args = parser.parse_args(argv)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    job = json.loads(Path(args.job).read_text())
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        dist.barrier()  # every rank starts its data phase at once, as a job's ranks do
        results = Path(job["work"]) / "results"
        results.mkdir(exist_ok=True)
        for order in ORDERS:
            result = _run_order(job, order, args.phase, rank, world)
            (results / f"{args.phase}-{order}-rank{rank}.json").write_text(json.dumps(result))
            dist.barrier()  # rank 0's checkpoint is on disk before anyone goes on
        dist.destroy_process_group()
    except Exception as exc:  # one line for the demo, the traceback for its log
        traceback.print_exc()
        errors = Path(job["work"]) / "errors"
        errors.mkdir(exist_ok=True)
        (errors / f"rank{rank}.txt").write_text(
            f"{args.phase} on {world} ranks: {_one_line(exc)}\n"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
