"""One rank of benchmarks/startup.py: imports, the data phase, one item; writes its record as JSON.

Run by the driver (never by hand) with either venv's Python: ``startup_worker.py SPEC.json``,
with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT set
as torchrun sets them. Only the standard library is imported before the clock starts, so the
import times are the libraries' own.

What it records (all in the record file named by the spec):

* ``proc_start``: the process's start (``/proc/self/stat``, 10 ms resolution), ``script_start``,
  then the import times (torch, the library, Megatron's tokenizer), the process-group set-up, and
  the data phase: from just before the config is made and ``build_datasets`` /
  ``BlendedMegatronDatasetBuilder(...).build()`` runs, to the first item of the train split on this
  rank (``train[rank]``);
* CPU time of the data phase (``getrusage``: all threads of this process);
* ``/proc/self/io`` deltas of the data phase (rchar/wchar: read/write syscalls of any kind;
  read_bytes/write_bytes: what reached the block device);
* an audit-hook count of the data phase's Python-level file operations under the benchmark's
  data folder (``open`` with its mode, ``os.rename``/``os.replace``, ``os.remove``, ``os.mkdir``,
  ``os.listdir``/``os.scandir``, ``mmap.__new__``); stat calls have no audit event, the strace
  pass counts those;
* the torch.distributed collectives called during the data phase (each wrapped to count);
* with ``spec["strace"]``: strace attached to this process (all threads) just before the data
  phase and detached just after, writing ``spec["trace_log"]``; two marker stat calls
  (``@@startup-bench-begin@@`` / ``-end@@``) delimit the data phase in that log.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

SCRIPT_START = time.time()

COLLECTIVES = (
    "barrier", "monitored_barrier", "all_reduce", "broadcast", "all_gather", "all_gather_object",
    "broadcast_object_list", "reduce", "gather", "scatter", "all_to_all", "reduce_scatter",
    "all_gather_into_tensor", "reduce_scatter_tensor",
)


def process_start() -> float:
    """Wall-clock time at which this process started (from /proc, 10 ms resolution)."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def proc_io() -> dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class AuditCounter:
    """Python-level file operations under ``root`` while ``active``."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.active = False
        self.counts: dict[str, int] = {}
        self.written: list[str] = []
        self.renamed: list[list[str]] = []
        self.maps = 0
        sys.addaudithook(self.hook)

    def _ours(self, path) -> bool:
        return isinstance(path, str) and path.startswith(self.root)

    def hook(self, event: str, args) -> None:
        if not self.active:
            return
        if event == "open":
            path, mode, flags = args
            if not self._ours(path):
                return
            writing = (mode is not None and any(c in mode for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            self.counts["opens"] = self.counts.get("opens", 0) + 1
            if writing:
                self.written.append(path)
        elif event == "os.rename":
            src, dst = args[0], args[1]
            if self._ours(os.fsdecode(dst)):
                self.counts["renames"] = self.counts.get("renames", 0) + 1
                self.renamed.append([os.fsdecode(src), os.fsdecode(dst)])
        elif event in ("os.remove", "os.mkdir", "os.listdir", "os.scandir", "os.rmdir"):
            if args and self._ours(os.fsdecode(args[0]) if args[0] is not None else ""):
                self.counts[event] = self.counts.get(event, 0) + 1
        elif event == "mmap.__new__":
            if args[0] not in (-1, None):
                self.maps += 1


def count_collectives(calls: dict[str, int]) -> None:
    """Wrap torch.distributed's collectives so that each call is counted (only if imported)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is None:
            continue

        def counted(*a, _fn=fn, _name=name, **k):
            calls[_name] = calls.get(_name, 0) + 1
            return _fn(*a, **k)

        setattr(dist, name, counted)


def init_group(spec: dict, rec: dict) -> None:
    import datetime

    import torch.distributed as dist

    t = time.time()
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=60))
    rec["pg_init_s"] = time.time() - t


def import_torch(rec: dict) -> None:
    t = time.time()
    import torch  # noqa: F401

    rec["import_torch_s"] = time.time() - t


# -- megatron-core ------------------------------------------------------------------------------
def megatron_prepare(spec: dict, rec: dict):
    """Imports and tokenizer; returns the data phase as a function returning the first item."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    t = time.time()
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    rec["import_lib_s"] = time.time() - t
    logging.getLogger("megatron").setLevel(logging.ERROR)
    logging.disable(logging.WARNING)
    t = time.time()
    from megatron.core.tokenizers import MegatronTokenizer

    tokenizer = MegatronTokenizer.from_pretrained(
        metadata_path={"library": "null-text"}, vocab_size=spec["vocab"], pad_id=-1)
    rec["tokenizer_s"] = time.time() - t
    fast = spec["mode"] == "fast"
    rank = int(os.environ.get("RANK", "0"))

    def phase():
        blend = (spec["prefixes"], spec["weights"])
        sequences = None
        if spec.get("sequences_path"):
            with open(spec["sequences_path"]) as f:
                sequences = {k: tuple(v) for k, v in json.load(f).items()}
        common = dict(
            random_seed=spec["seed"], sequence_length=spec["seq"], path_to_cache=spec["cache"],
            tokenizer=tokenizer, reset_position_ids=False, reset_attention_mask=False,
            eod_mask_loss=False, create_attention_mask=False,
        )
        if spec["per_split"]:
            config = GPTDatasetConfig(
                blend_per_split=[blend, blend, None], fast_cache_load=fast,
                defer_npy_index_mmap=fast, sequences_per_dataset=sequences, **common)
        else:
            config = GPTDatasetConfig(blend=blend, split=spec["split"], **common)
        train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, spec["sizes"], lambda: True, config).build()
        item = train[rank]
        return {"len": len(train), "first_token": int(item["tokens"][0])}

    return phase


# -- tokenload ----------------------------------------------------------------------------------
def tokenload_prepare(spec: dict, rec: dict):
    t = time.time()
    from tokenload.datasets import MegatronDataConfig, build_datasets

    rec["import_lib_s"] = time.time() - t
    rec["torch_imported_by_lib"] = "torch" in sys.modules
    if os.environ.get("TOKENLOAD_BENCH_BUILD_THREADS"):  # measurement knob: the builder's pool size
        from tokenload.datasets.megatron import builder

        builder.BUILD_THREADS = int(os.environ["TOKENLOAD_BENCH_BUILD_THREADS"])
    rec["build_threads"] = __import__("tokenload.datasets.megatron.builder", fromlist=["x"]).BUILD_THREADS
    rec["tokenizer_s"] = 0.0
    rank = int(os.environ.get("RANK", "0"))

    def phase():
        extra = {}
        if spec.get("policy") not in (None, "default"):
            extra["build_policy"] = spec["policy"]
        if spec.get("sequences_path"):
            extra["sequences_path"] = spec["sequences_path"]
        blend = [x for w, p in zip(spec["weights"], spec["prefixes"]) for x in (str(w), p)]
        common = dict(sequence_length=spec["seq"], random_seed=spec["seed"], tokenizer=spec["tokenizer"],
                      path_to_cache=spec["cache"], **extra)
        if spec["per_split"]:
            config = MegatronDataConfig(blend_per_split=[blend, blend, None], **common)
        else:
            config = MegatronDataConfig(blend=blend, split=spec["split"], **common)
        train, _, _ = build_datasets(config, spec["sizes"])
        item = train[rank]
        tokens = item["tokens"] if isinstance(item, dict) else item
        return {"len": len(train), "first_token": int(tokens[0])}

    return phase


def tracer_pid() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("TracerPid"))


def attach_strace(spec: dict):
    """strace attached to this process, once the kernel says it is (None without ``strace``)."""
    if not spec.get("strace"):
        return None
    import subprocess

    tracer = subprocess.Popen(spec["strace"] + ["-o", spec["trace_log"], "-p", str(os.getpid())],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while tracer_pid() == 0:
        if time.time() > deadline or tracer.poll() is not None:
            raise RuntimeError("strace did not attach")
        time.sleep(0.01)
    time.sleep(0.05)
    return tracer


def detach_strace(tracer) -> None:
    if tracer is not None:
        import signal

        tracer.send_signal(signal.SIGINT)
        tracer.wait()


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    rec: dict = {"rank": int(os.environ.get("RANK", "0")), "proc_start": process_start(),
                 "script_start": SCRIPT_START, "pid": os.getpid()}
    audit = AuditCounter(spec["root"])
    megatron = spec["lib"] == "megatron"
    if megatron or spec["pg"]:
        import_torch(rec)
    if spec["pg"]:
        init_group(spec, rec)
    phase = (megatron_prepare if megatron else tokenload_prepare)(spec, rec)
    calls: dict[str, int] = {}
    count_collectives(calls)
    rec["imports_done"] = time.time()
    tracer = attach_strace(spec)
    io0, cpu0 = proc_io(), cpu_seconds()
    try:
        os.stat("/tmp/@@startup-bench-begin@@")
    except OSError:
        pass
    audit.active = True
    t0 = time.time()
    try:
        rec["result"] = phase()
    except Exception as exc:  # recorded, so that the table names the failure per rank
        rec["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    t1 = time.time()
    audit.active = False
    try:
        os.stat("/tmp/@@startup-bench-end@@")
    except OSError:
        pass
    cpu1, io1 = cpu_seconds(), proc_io()
    detach_strace(tracer)
    rec.update(
        data_start=t0, data_end=t1, data_s=t1 - t0, data_cpu_s=cpu1 - cpu0,
        io={k: io1[k] - io0[k] for k in io1}, audit=audit.counts, audit_maps=audit.maps,
        audit_written=audit.written, audit_renamed=audit.renamed, collectives=calls,
        torch_loaded="torch" in sys.modules,
    )
    with open(spec["record"] + ".tmp", "w") as f:
        json.dump(rec, f)
    os.replace(spec["record"] + ".tmp", spec["record"])
    dist = sys.modules.get("torch.distributed")
    if spec["pg"] and dist is not None and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
