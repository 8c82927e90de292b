"""Run a function on N real processes joined by a torch.distributed gloo group (CPU).

Each rank runs ``fn(rank, world_size, *args)`` after ``init_process_group("gloo")`` through a
FileStore (no ports to collide); the return values come back as a list indexed by rank.

The ranks are fresh processes, as torchrun's are: not forks of the test process, but children of
multiprocessing's fork server, which imported torch.distributed once for the whole test run. A
rank then starts in a fraction of a second instead of importing torch again (about 3 s of CPU
each), and starts with the test process's environment and
working folder as they are at the launch, as a spawned process would.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import tempfile
import time
import traceback
from pathlib import Path


def _entry(fn, rank, world_size, store_path, out_path, args, env, parent):
    # the test process's environment and folder as they are at the launch (the fork server's
    # are those of its own start), then the launch's own variables
    environ, cwd = parent
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    tempfile.tempdir = None  # the next gettempdir() reads TMPDIR again
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size)
        result = ("ok", fn(rank, world_size, *args))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # report the failure to the parent instead of hanging the others
        result = ("error", traceback.format_exc())
    with open(out_path, "wb") as f:
        pickle.dump(result, f)


_CONTEXT: mp.context.ForkServerContext | None = None


def _context() -> mp.context.ForkServerContext:
    """The fork server's context, torch.distributed preloaded there (set once, before the
    server's first start)."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = mp.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["torch.distributed"])
    return _CONTEXT


def run_ranks(world_size: int, fn, *args, timeout: float = 120, env: dict | None = None) -> list:
    """Results of ``fn`` on every rank; ranks still running ``timeout`` seconds after the start
    (all together, not each) are killed and raise TimeoutError."""
    ctx = _context()
    parent = (dict(os.environ), os.getcwd())
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        outs = [os.path.join(tmp, f"rank{r}.pkl") for r in range(world_size)]
        procs = [
            ctx.Process(target=_entry, args=(fn, r, world_size, store, outs[r], args, env or {}, parent))
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        alive = [p for p in procs if p.is_alive()]
        for p in alive:
            p.kill()
        if alive:
            raise TimeoutError(f"{len(alive)} of {world_size} ranks still running after {timeout}s")
        results = []
        for r, path in enumerate(outs):
            if not os.path.exists(path):
                raise RuntimeError(f"rank {r} exited with code {procs[r].exitcode} and no result")
            status, value = pickle.loads(Path(path).read_bytes())
            if status != "ok":
                raise RuntimeError(f"rank {r} failed:\n{value}")
            results.append(value)
        return results
