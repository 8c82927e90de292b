"""Build policies in one process, with the World monkeypatched: the role each policy gives each
rank, the writes and barriers they make, the 'none' fast load from the build manifest (one open,
lengths without mapping, staleness found where the token file opens), its error on a missing
cache, the sequences JSON, and the startup hooks loader metrics read."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

import tokenload.datasets.megatron.builder as builder
from support import write_documents, write_small_blend
from tokenload.datasets import MegatronDataConfig, build_datasets, wait_for_cache_writes
from tokenload.datasets.megatron.policy import Role, prepare_command, resolve
from tokenload.distributed import World
from tokenload.errors import CacheError, ConfigError
from tokenload.format import TokenFile, write_sequences
from tokenload.format.sequences import counts_of

SIZES = [200, 20, 0]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("blend")
    return write_small_blend(folder)


def _config(data, cache_folder, **kw) -> MegatronDataConfig:
    blend = [x for n, w in (("a", "2"), ("b", "3"), ("c", "5")) for x in (w, str(data / n))]
    return MegatronDataConfig(sequence_length=8, blend=blend, split="90,10,0", eod_id=999,
                              path_to_cache=None if cache_folder is None else str(cache_folder), **kw)


def _tokens(ds) -> np.ndarray:
    return np.asarray(ds.__getitems__(list(range(len(ds))))["tokens"])


@pytest.fixture(scope="module")
def reference(data):
    return [_tokens(d) for d in build_datasets(_config(data, None, cache="off"), SIZES)[:2]]


def _world(monkeypatch, **kw) -> None:
    # builder.World is this class: the builder's World.detect() answers kw
    monkeypatch.setattr(World, "detect", classmethod(lambda cls: World(**kw)))


class _Barriers:
    def __init__(self, monkeypatch) -> None:
        self.count = 0
        monkeypatch.setattr(builder, "process_group", lambda: object())
        monkeypatch.setattr(builder, "barrier", self)

    def __call__(self, world, why) -> None:
        self.count += 1


def _opens(fn):
    """``fn()`` and the paths it opened (an audit hook; hooks cannot be removed, so it records
    only while ``active``)."""
    seen: list[str] = []
    state = _opens.__dict__.setdefault("state", {"active": None})
    if not state.get("installed"):
        sys.addaudithook(
            lambda ev, args: (
                state["active"] is not None
                and ev == "open"
                and state["active"].append(str(args[0]))
            )
        )
        state["installed"] = True
    state["active"] = seen
    try:
        return fn(), seen
    finally:
        state["active"] = None


# -- roles -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "rank", "local_rank", "expected"), [
    ("auto", 0, 0, (Role.WRITE, False)), ("auto", 3, 1, (Role.CHECK, False)),
    ("rank0", 0, 0, (Role.WRITE, True)), ("rank0", 2, 0, (Role.READ, True)),
    ("local-rank0", 2, 0, (Role.WRITE, True)), ("local-rank0", 3, 1, (Role.READ, True)),
    ("every-rank", 0, 0, (Role.MEMORY, False)), ("none", 0, 0, (Role.READ, False)),
])
def test_each_policy_gives_each_rank_one_role(policy, rank, local_rank, expected):
    world = World(rank=rank, world_size=4, local_rank=local_rank, local_world_size=2)
    assert resolve(policy, world, "auto") == expected
    assert resolve(policy, World(), "off") == (Role.MEMORY, False)
    if policy in ("rank0", "local-rank0"):
        assert resolve(policy, World(), "auto") == (Role.WRITE, False)  # one process: no barrier


def test_unknown_policy_and_none_without_cache_are_config_errors(data):
    with pytest.raises(ConfigError, match="build_policy is 'rank-0'") as info:
        _config(data, None, build_policy="rank-0")
    assert "HINT" in str(info.value)
    with pytest.raises(ConfigError, match="cache='off'"):
        _config(data, None, build_policy="none", cache="off")


def test_node_index_from_the_launcher(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert World.detect().node == 1
    monkeypatch.setenv("GROUP_RANK", "7")
    assert World.detect().node == 7
    monkeypatch.delenv("GROUP_RANK")
    monkeypatch.setenv("SLURM_NODEID", "3")
    assert World.detect().node == 3


@pytest.mark.parametrize("policy", ["rank0", "local-rank0"])
@pytest.mark.parametrize("rank", [0, 1])
def test_barrier_policy_without_a_process_group_is_a_config_error_before_any_work(
    data, tmp_path, monkeypatch, policy, rank
):
    _world(monkeypatch, rank=rank, world_size=2, local_rank=rank, local_world_size=2)
    with pytest.raises(ConfigError, match=r"needs torch.distributed initialised") as info:
        build_datasets(_config(data, tmp_path / "c", build_policy=policy), SIZES)
    assert "build_policy='auto' or 'none'" in str(info.value)
    assert not (tmp_path / "c").exists()


def test_rank0_writer_builds_then_waits_once_and_readers_wait_then_load(data, tmp_path, monkeypatch, reference):
    barriers = _Barriers(monkeypatch)
    _world(monkeypatch, rank=1, world_size=2, local_rank=1, local_world_size=2)
    with pytest.raises(CacheError, match="after the writer's build"):  # nothing was written yet
        build_datasets(_config(data, tmp_path, build_policy="rank0"), SIZES)
    assert barriers.count == 1 and not os.listdir(tmp_path)
    _world(monkeypatch, rank=0, world_size=2, local_rank=0, local_world_size=2)
    build_datasets(_config(data, tmp_path, build_policy="rank0"), SIZES)
    assert barriers.count == 2
    _world(monkeypatch, rank=1, world_size=2, local_rank=1, local_world_size=2)
    loaded, opened = _opens(lambda: build_datasets(_config(data, tmp_path, build_policy="rank0"), SIZES))
    assert barriers.count == 3
    assert [p for p in opened if p.startswith(str(tmp_path))] == [str(next(tmp_path.glob("*-tokenload-build.json")))]
    for got, want in zip(loaded, reference):
        np.testing.assert_array_equal(_tokens(got), want)


def test_auto_on_a_miss_writes_only_on_rank0_and_never_waits(data, tmp_path, monkeypatch, reference):
    barriers = _Barriers(monkeypatch)
    _world(monkeypatch, rank=3, world_size=4, local_rank=1, local_world_size=2)
    other = build_datasets(_config(data, tmp_path / "c"), SIZES)
    assert not (tmp_path / "c").exists()  # built in memory, nothing written
    for got, want in zip(other, reference):
        np.testing.assert_array_equal(_tokens(got), want)
    _world(monkeypatch, rank=0, world_size=4, local_rank=0, local_world_size=2)
    writer = build_datasets(_config(data, tmp_path / "c"), SIZES)
    assert writer[0].indices.paths is None  # rank 0 serves from memory and writes behind
    assert wait_for_cache_writes(60)
    assert len(list((tmp_path / "c").glob("*-tokenload-build.json"))) == 1
    _world(monkeypatch, rank=3, world_size=4, local_rank=1, local_world_size=2)
    hit = build_datasets(_config(data, tmp_path / "c"), SIZES)  # now a hit: mapped, not built
    assert hit[0].indices.paths is not None
    assert barriers.count == 0


def test_every_rank_reads_and_writes_no_cache(data, tmp_path, reference):
    built, opened = _opens(lambda: build_datasets(_config(data, tmp_path, build_policy="every-rank"), SIZES))
    assert not [p for p in opened if p.startswith(str(tmp_path))] and not os.listdir(tmp_path)
    np.testing.assert_array_equal(_tokens(built[0]), reference[0])


# -- 'none' ----------------------------------------------------------------------------------------


def test_none_on_a_missing_cache_lists_the_files_and_the_prepare_command(data, tmp_path):
    with pytest.raises(CacheError) as info:
        build_datasets(_config(data, tmp_path, build_policy="none"), SIZES)
    text = str(info.value)
    assert "build_policy='none' loads index caches only, and 8 are missing" in text  # 3 x 2 + 2 blends
    assert "GPTDataset-train: missing" in text and "-description.txt" in text
    assert f"tokenload prepare-cache --data-path 2 {data / 'a'} 3" in text
    assert f"--split 90,10,0 --seq-length 8 --seed 1234 --data-cache-path {tmp_path}" in text
    # 20 valid and 0 test samples follow no evaluation schedule: the counts are passed as they are
    assert "--train-valid-test-num-samples 200 20 0" in text
    assert not os.listdir(tmp_path)


def test_prepare_command_follows_megatrons_sample_arithmetic(data):
    cfg = _config(data, "/c")
    # train_iters 1000, eval_interval 100, eval_iters 10, global batch 8
    line = prepare_command(cfg, [8000, (1000 // 100 + 1) * 10 * 8, 10 * 8])
    assert "--global-batch-size 1 --train-samples 8000 --eval-iters 80 --eval-interval 800" in line
    train_iters, interval = 8000, 800
    assert (train_iters // interval + 1) * 80 == 880


def test_none_loads_from_one_open_with_lengths_before_any_mapping(data, tmp_path, reference):
    built = build_datasets(_config(data, tmp_path), SIZES)
    splits, opened = _opens(lambda: build_datasets(_config(data, tmp_path, build_policy="none"), SIZES))
    assert opened == [str(next(tmp_path.glob("*-tokenload-build.json")))]
    train = splits[0]
    assert [len(d) for d in splits[:2]] == [len(d) for d in built[:2]]
    assert train.indices._arrays is None and all(m.indices._arrays is None for m in train.datasets)
    assert all(m.source._state is None for m in train.datasets)  # no token file opened either
    for got, want in zip(splits, reference):
        np.testing.assert_array_equal(_tokens(got), want)
    assert train.fingerprint == built[0].fingerprint


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_none_notices_a_rewritten_token_file_where_it_opens(data, tmp_path, packing):
    """Packed plans too (a red-team finding: a packed plan of the old file served the changed
    one's documents with no error, never its new ones)."""
    folder = tmp_path / "data"
    folder.mkdir()
    for n in ("a", "b", "c"):
        for ext in (".bin", ".idx"):
            os.link(data / f"{n}{ext}", folder / f"{n}{ext}")
    build_datasets(_config(folder, tmp_path / "c", packing=packing), SIZES)
    docs = [[5] * (k % 30 + 3) for k in range(120)]
    os.remove(folder / "b.bin"), os.remove(folder / "b.idx")
    write_documents(folder / "b", docs)
    again = _config(folder, tmp_path / "c", build_policy="none", packing=packing)
    train = build_datasets(again, SIZES)[0]
    with pytest.raises(CacheError, match="token file changed") as info:
        _tokens(train)
    assert info.value.path == str(folder / "b.idx") and "prepare-cache" in str(info.value)


def test_none_with_a_deleted_array_is_a_cache_error_naming_it(data, tmp_path):
    build_datasets(_config(data, tmp_path), SIZES)
    (victim,) = tmp_path.glob("*-BlendedDataset-train-dataset_index.npy")
    victim.unlink()
    train = build_datasets(_config(data, tmp_path, build_policy="none"), SIZES)[0]
    with pytest.raises(CacheError) as info:
        _tokens(train)
    assert info.value.path == str(victim)


def test_sequences_json_opens_no_index_header(data, tmp_path, reference):
    seq = tmp_path / "seq.json"
    write_sequences(seq, {str(data / n): counts_of(TokenFile(data / n)) for n in ("a", "b", "c")})
    build_datasets(_config(data, tmp_path / "c"), SIZES)
    cfg = _config(data, tmp_path / "c", build_policy="none", sequences_path=str(seq))
    splits, opened = _opens(lambda: build_datasets(cfg, SIZES))
    opened = [p for p in opened if p != str(seq)]
    assert opened[1:] == [] and opened[0].endswith("-tokenload-build.json")
    source = splits[0].datasets[0].source
    assert source.sequences == (120, 121) and source.dtype == np.uint16 and source._state is None
    np.testing.assert_array_equal(_tokens(splits[0]), reference[0])
    auto = build_datasets(_config(data, tmp_path / "c2", sequences_path=str(seq)), SIZES)
    np.testing.assert_array_equal(_tokens(auto[0]), reference[0])


# -- startup hooks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["auto", "none"])
def test_samples_per_epoch_and_startup_phases(data, tmp_path, policy):
    build_datasets(_config(data, tmp_path), SIZES)
    train, valid, _ = build_datasets(_config(data, tmp_path, build_policy=policy), SIZES)
    for member in train.datasets:
        assert member.samples_per_epoch == member.samples_per_epoch_from_index()
    assert set(train.startup_phases) <= {"header_reads", "index_build", "index_load", "cache_write", "barrier"}
    assert "index_load" in train.startup_phases and train.startup_phases is valid.startup_phases
    json.dumps(train.startup_phases)


def test_the_command_in_the_none_error_prepares_what_none_loads(data, tmp_path, reference):
    """The hint's command, run as printed, writes the caches and the manifest that a 'none' load
    of the same configuration reads in one open."""
    import shlex

    from support import run_cli

    cfg = _config(data, tmp_path, build_policy="none", tokenizer={"class": "t", "vocab_size": "1000"})
    sizes = [200, (200 // 100 + 1) * 10, 10]  # Megatron's arithmetic: eval every 100 iterations, 10 each
    with pytest.raises(CacheError) as info:
        build_datasets(cfg, sizes)
    command = info.value.hint.split("with: ", 1)[1].split("  (or", 1)[0]
    argv = shlex.split(command)
    assert argv[:2] == ["tokenload", "prepare-cache"]
    done = run_cli(*argv[1:])
    assert done.returncode == 0, done.stderr
    assert "--eval-interval 100" in command
    splits, opened = _opens(lambda: build_datasets(cfg, sizes))
    assert len(opened) == 1 and opened[0].endswith("-tokenload-build.json")
    np.testing.assert_array_equal(_tokens(splits[0]), reference[0])


def test_auto_writer_whose_background_write_fails_runs_on_from_memory(data, tmp_path, monkeypatch, reference, caplog):
    import errno

    import tokenload.datasets.megatron.cache_rules as index_cache

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(index_cache.CacheWriter, "add", full)
    _world(monkeypatch, rank=0, world_size=4, local_rank=0, local_world_size=2)
    caplog.set_level("WARNING", logger="tokenload.datasets.megatron.cache_rules")
    got = build_datasets(_config(data, tmp_path / "c"), SIZES)
    assert wait_for_cache_writes(60)
    for ds, want in zip(got, reference):
        np.testing.assert_array_equal(_tokens(ds), want)
    assert not list((tmp_path / "c").glob("*-tokenload-build.json"))
    assert any("index cache not written" in r.getMessage() and "No space" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("cached", [True, False])
def test_the_command_in_the_none_error_works_with_a_spaced_split_and_any_cache_folder(
    data, tmp_path, reference, cached
):
    """The hint's command keeps the split as the job wrote it ("90, 10, 0": it is part of the
    caches' names; the command dropped its spaces, so the caches it made had other names and
    the hint came back), and without a cache folder prepares Megatron's default folders beside
    the token files (prepare-cache required --data-cache-path). Red-team findings."""
    import shlex

    from support import run_cli

    folder = tmp_path / "data"
    folder.mkdir()
    for n in ("a", "b", "c"):
        for ext in (".bin", ".idx"):
            os.link(data / f"{n}{ext}", folder / f"{n}{ext}")
    blend = [x for n, w in (("a", "2"), ("b", "3"), ("c", "5")) for x in (w, str(folder / n))]
    cfg = MegatronDataConfig(sequence_length=8, blend=blend, split="90, 10, 0", eod_id=999,
                             build_policy="none",
                             path_to_cache=str(tmp_path / "c") if cached else None)
    sizes = [200, (200 // 100 + 1) * 10, 10]
    with pytest.raises(CacheError) as info:
        build_datasets(cfg, sizes)
    command = info.value.hint.split("with: ", 1)[1].split("  (or", 1)[0]
    argv = shlex.split(command.split(" && ", 1)[-1])
    assert argv[argv.index("--split") + 1] == "90, 10, 0"
    done = run_cli(*argv[1:])
    assert done.returncode == 0, done.stderr
    if not cached:
        assert list((folder / "a" / "cache" / "GPTDataset_indices").glob("*.npy"))
    splits = build_datasets(cfg, sizes)
    np.testing.assert_array_equal(_tokens(splits[0]), reference[0])


def test_none_with_a_cache_folder_that_does_not_exist_says_so(data, tmp_path):
    """A mistyped cache folder under ``none`` read as every cache missing, with a hint to make
    that folder and prepare into it (a new user's finding): the error says the folder does not
    exist, and the hint to check its path comes first."""
    cfg = MegatronDataConfig(sequence_length=8, blend=[str(data / "a")], split="90,10,0", eod_id=999,
                             build_policy="none", path_to_cache=str(tmp_path / "typo"))
    with pytest.raises(CacheError, match=r"the cache folder .*typo does not exist, so all \d+ are missing") as info:
        build_datasets(cfg, [50, 10, 0])
    assert info.value.hint.startswith("check the path of that cache folder")
    (tmp_path / "typo").mkdir()
    with pytest.raises(CacheError, match=r"build_policy='none' loads index caches only, and \d+ are missing") as info:
        build_datasets(cfg, [50, 10, 0])
    assert info.value.hint.startswith("build them first")
