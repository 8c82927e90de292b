"""Run as a subprocess by test_descriptors.py: a blend of many small prefixes read through the
loader with workers under a lowered RLIMIT_NOFILE; prints the open descriptors of this process
and of each worker after every few micro-batches as one JSON line.

Usage: python descriptor_driver.py DATA_DIR PREFIXES ORDER READ_MODE NOFILE WORKERS BATCHES"""

from __future__ import annotations

import json
import os
import resource
import sys

import numpy as np


def open_fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def children() -> list[int]:
    pids = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            pids += [int(p) for p in f.read().split()]
    return pids


def main() -> None:
    data, prefixes, order, mode, nofile, workers, batches = sys.argv[1:]
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(nofile), hard))
    from tokenload.datasets import MegatronDataConfig, build_datasets
    from tokenload.loader import build_dataloader

    names = [os.path.join(data, f"p{i:05d}") for i in range(int(prefixes))]
    blend = [x for name in names for x in ("1", name)]
    config = MegatronDataConfig(
        sequence_length=16, blend=blend, split="100,0,0", order=order, read_mode=mode,
        # index caches are the Megatron order's; the computed order reads none
        path_to_cache=os.path.join(data, f"cache-{order}-{mode}") if order == "megatron" else None,
    )
    mbs, steps = 16, int(batches)
    train = build_datasets(config, [mbs * steps, 0, 0])[0]
    assert train is not None
    loader = build_dataloader(train, micro_batch_size=mbs, num_workers=int(workers))
    counts, seen = [], 0
    tokens = []
    for _step, batch in enumerate(loader):
        tokens.append(np.asarray(batch["tokens"]).copy())
        seen += 1
        if seen % 10 == 0:
            counts.append({"step": seen, "main": open_fds(),
                           "workers": [open_fds(pid) for pid in children()]})
        if seen == steps:
            break
    expected = train.__getitems__(np.arange(mbs * steps))["tokens"]
    same = bool(np.array_equal(np.concatenate(tokens), np.asarray(expected)))
    print(json.dumps({"counts": counts, "batches": seen, "same": same}))


if __name__ == "__main__":
    main()
