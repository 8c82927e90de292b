"""Build policies on 4 real ranks (gloo, CPU), simulated as two nodes of two ranks (LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK), in one launch: every policy gives every rank the order of a
single-process build; 'none' and 'every-rank' (and 'auto') make no collective call, 'rank0' and
'local-rank0' exactly one barrier; each cache file has at most one writer (one per node for the
node-local folders of 'local-rank0'), recorded by an audit hook on opens for writing; 'none' on
a missing cache and 'rank0' whose writer fails give a CacheError on every rank, no hang. A build
killed part way (os._exit in the middle of the cache writes) leaves nothing that loads."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from support import write_documents

from .launch import run_ranks

SIZES = [300, 30, 10]
PREFIXES = 6
COLLECTIVES = ("barrier", "all_reduce", "broadcast", "all_gather", "all_gather_object", "broadcast_object_list",
               "reduce", "gather", "scatter", "reduce_scatter", "all_to_all")
_TEMP = re.compile(r"^\.(?P<name>.+)\.tmp-.*$")


def config(folder: str, cache_folder: str | None, **overrides):
    from tokenload.datasets import MegatronDataConfig

    blend = [x for i in range(PREFIXES) for x in (str(i + 1), os.path.join(folder, f"p{i}"))]
    return MegatronDataConfig(
        sequence_length=16, blend=blend, split="90,8,2", tokenizer={"class": "test", "vocab_size": "5000"},
        eod_id=4999, path_to_cache=cache_folder, **overrides,
    )


def digests(splits) -> list[str | None]:
    """md5 of every item's tokens of each split, in index order."""
    out: list[str | None] = []
    for ds in splits:
        if ds is None:
            out.append(None)
            continue
        tokens = np.asarray(ds.__getitems__(list(range(len(ds))))["tokens"])
        out.append(hashlib.md5(tokens.tobytes()).hexdigest())
    return out


class _Probe:
    """Counts collectives (raising when forbidden) and records the cache files this rank opens
    for writing (temporary names mapped to the final ones)."""

    def __init__(self, root: str) -> None:
        import torch.distributed as dist

        self.dist, self.root = dist, root
        self.forbid = False
        self.calls: list[str] = []
        self.writes: set[str] = set()
        self.originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
        for name, fn in self.originals.items():
            setattr(dist, name, self._wrap(name, fn))
        sys.addaudithook(self._audit)

    def _wrap(self, name, fn):
        def collective(*args, **kwargs):
            self.calls.append(name)
            if self.forbid:
                raise RuntimeError(f"collective {name} called")
            return fn(*args, **kwargs)
        return collective

    def _audit(self, event, args):
        if event == "open" and isinstance(args[0], str) and args[0].startswith(self.root):
            mode, flags = args[1], args[2]
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags & (os.O_WRONLY | os.O_RDWR)):
                folder, name = os.path.split(args[0])
                m = _TEMP.match(name)
                self.writes.add(os.path.relpath(os.path.join(folder, m["name"] if m else name), self.root))

    def run(self, forbid: bool, fn):
        self.forbid, self.calls, self.writes = forbid, [], set()
        result: tuple[object, ...]
        try:
            result = ("ok", fn())
        except Exception as exc:  # every rank reports its own outcome
            result = ("error", type(exc).__name__, str(exc))
        return {"result": result, "collectives": list(self.calls), "writes": sorted(self.writes)}

    def restore(self):
        for name, fn in self.originals.items():
            setattr(self.dist, name, fn)


def rank_run(rank, world_size, folder):
    os.environ.update(LOCAL_RANK=str(rank % 2), LOCAL_WORLD_SIZE="2", GROUP_RANK=str(rank // 2))
    from tokenload.datasets import build_datasets, wait_for_cache_writes

    node = os.path.join(folder, f"node{rank // 2}")  # node-local cache folders
    shared = os.path.join(folder, "shared")
    probe = _Probe(folder)

    def build(cache, **kw):
        def run():
            got = digests(build_datasets(config(folder, cache, **kw), SIZES))
            assert wait_for_cache_writes(60)  # auto's writer writes behind its first batches
            return got

        return run

    out = {}
    try:
        out["every-rank"] = probe.run(True, build(os.path.join(folder, "unused"), build_policy="every-rank"))
        # a folder of its own: a fast rank's later rank0 build fills shared/rank0 while a slow
        # rank may still be at this step
        out["none-missing"] = probe.run(True, build(os.path.join(shared, "never"), build_policy="none"))
        out["auto"] = probe.run(True, build(os.path.join(shared, "auto"), build_policy="auto"))
        out["auto-hit"] = probe.run(True, build(os.path.join(shared, "auto"), build_policy="auto"))
        out["rank0"] = probe.run(False, build(os.path.join(shared, "rank0"), build_policy="rank0"))
        out["local-rank0"] = probe.run(False, build(node, build_policy="local-rank0"))
        out["none"] = probe.run(True, build(os.path.join(shared, "rank0"), build_policy="none"))
        blocker = os.path.join(folder, "blocker")
        out["rank0-fails"] = probe.run(False, build(os.path.join(blocker, "cache"), build_policy="rank0"))
    finally:
        probe.restore()
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("policies")
    rng = np.random.default_rng(3)
    for i in range(PREFIXES):
        docs = [np.append(rng.integers(0, 4999, size=int(k)), 4999) for k in rng.integers(3, 60, size=80 + 20 * i)]
        write_documents(folder / f"p{i}", docs)
    (folder / "blocker").write_text("a file where the cache folder should be")
    return str(folder)


@pytest.fixture(scope="module")
def ranks(data):
    return run_ranks(4, rank_run, data)


@pytest.fixture(scope="module")
def single(data):
    from tokenload.datasets import build_datasets

    return digests(build_datasets(config(data, None, cache="off"), SIZES))


BUILDING = ["every-rank", "auto", "auto-hit", "rank0", "local-rank0", "none"]


@pytest.mark.parametrize("policy", BUILDING)
def test_every_policy_gives_every_rank_the_single_process_order(ranks, single, policy):
    for rank, out in enumerate(ranks):
        assert out[policy]["result"] == ("ok", single), (policy, rank)


@pytest.mark.parametrize("policy", ["every-rank", "none", "none-missing", "auto", "auto-hit"])
def test_policies_without_a_barrier_call_no_collective(ranks, policy):
    assert [out[policy]["collectives"] for out in ranks] == [[]] * 4


@pytest.mark.parametrize("policy", ["rank0", "local-rank0", "rank0-fails"])
def test_rank0_policies_call_exactly_one_barrier(ranks, policy):
    assert [out[policy]["collectives"] for out in ranks] == [["barrier"]] * 4


def _writers(ranks, policy) -> dict[str, list[int]]:
    by_file: dict[str, list[int]] = {}
    for rank, out in enumerate(ranks):
        for path in out[policy]["writes"]:
            by_file.setdefault(path, []).append(rank)
    return by_file


def test_at_most_one_writer_per_cache_file(ranks):
    for policy in ("every-rank", "none", "none-missing", "auto-hit"):
        assert _writers(ranks, policy) == {}, policy
    for policy, writer in (("auto", 0), ("rank0", 0)):
        files = _writers(ranks, policy)
        # 6 prefixes x 3 splits x (3 arrays, sidecar, description) + 3 blends x 4 + the manifest
        assert len(files) == 6 * 3 * 5 + 3 * 4 + 1, policy
        assert set(map(tuple, files.values())) == {(writer,)}, policy
        assert any(f.endswith("-tokenload-build.json") for f in files)
    files = _writers(ranks, "local-rank0")
    assert {tuple(r) for r in files.values()} == {(0,), (2,)}  # local rank 0 of each node
    assert {f.split(os.sep)[0] for f, r in files.items() if r == [0]} == {"node0"}
    assert {f.split(os.sep)[0] for f, r in files.items() if r == [2]} == {"node1"}
    assert len(files) == 2 * (6 * 3 * 5 + 3 * 4 + 1)


def test_none_on_a_missing_cache_is_a_cache_error_on_every_rank(ranks):
    for out in ranks:
        status, kind, message = out["none-missing"]["result"]
        assert (status, kind) == ("error", "CacheError")
        assert "missing" in message and "-GPTDataset-train-description.txt" in message
        assert "tokenload prepare-cache --data-path 1" in message and "--data-cache-path" in message
        assert "--seq-length 16" in message and "HINT" in message


def test_rank0_whose_writer_fails_gives_every_rank_an_error_without_a_hang(ranks):
    kinds = [out["rank0-fails"]["result"][:2] for out in ranks]
    assert kinds == [("error", "CacheError")] * 4
    assert "cannot write the index cache" in ranks[0]["rank0-fails"]["result"][2]
    assert "after the writer's build" in ranks[1]["rank0-fails"]["result"][2]


KILLER = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {tests!r})
    from distributed.test_build_policies import config
    from tokenload.datasets import build_datasets
    import tokenload.format.atomic as atomic
    real, left = atomic.replace, int(sys.argv[1])
    def replace(tmp, final):
        global left
        if left == 0:
            os._exit(9)  # killed between two files of the build
        left -= 1
        return real(tmp, final)
    atomic.replace = replace
    build_datasets(config({data!r}, {cache!r}), {sizes!r})
""")


@pytest.mark.parametrize("after", [0, 2, 45, 101])
def test_a_build_killed_part_way_leaves_nothing_that_loads(data, single, tmp_path, after):
    """Killed after ``after`` complete files (of 103: the manifest is the last)."""
    from tokenload.datasets import build_datasets
    from tokenload.errors import CacheError

    cache = str(tmp_path / "cache")
    tests = os.path.dirname(os.path.dirname(__file__))
    code = KILLER.format(tests=tests, data=data, cache=cache, sizes=SIZES)
    done = subprocess.run([sys.executable, "-c", code, str(after)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 9, done.stderr
    with pytest.raises(CacheError, match="missing or stale") as info:
        build_datasets(config(data, cache, build_policy="none"), SIZES)
    assert "tokenload prepare-cache" in str(info.value)
    assert digests(build_datasets(config(data, cache, build_policy="auto"), SIZES)) == single
    assert digests(build_datasets(config(data, cache, build_policy="none"), SIZES)) == single
