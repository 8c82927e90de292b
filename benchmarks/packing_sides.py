"""The sides of benchmarks/packing.py's peer comparison, each run in a fresh process.

Each side is Python source that reads its payload (JSON, argv[1]), packs the documents of one
token file into rows of S token slots, reads the first micro-batch of rows, prints one JSON line
(``first_s``: process start to the first micro-batch, from the harness's clock, ``TIME0``;
``import_s``: its imports; ``pack_s``: the plan) and writes the rows it made to ``rows`` (an
``.npz`` the harness turns into ``packing_data.Rows`` for the shared metrics):

* ``ours``: tokenload (this venv). With ``dataset`` the packed dataset
  (``MegatronDataConfig(packing="best-fit")``, computed order) builds and reads its first
  micro-batch; otherwise ``tokenload.index.packing.pack_block`` over the file's documents in
  blocks of ``block`` documents (0: one block), its first rows read from the token file.
* ``olmo``: OLMo-core 3.0's ``NumpyPackedFSLDataset`` (the peers' venv) on the same ``.bin``
  (its raw ``.npy`` token format is the ``.bin``'s bytes; documents found by its EOS scan, every
  document ending with the EOD id), ``long_doc_strategy`` ``fragment`` (long documents cut into
  pieces of S, nothing dropped) or ``truncate`` (its default), ``prepare()`` on an empty work
  folder, then ``ds[i]`` for the micro-batch.
* ``grain``: Grain 0.2.18's ``BestFitPackIterDataset`` over a ``MapDataset`` of the documents
  (boundaries from the ``.idx``, handed over as an ``.npy`` of offsets; read from the ``.bin`` by
  ``np.memmap``), documents longer than S cut into pieces of S first (Grain refuses longer
  inputs), shuffled per epoch (``MapDataset.shuffle``, seed 0), ``num_packing_bins`` open rows;
  it streams, so its rows are counted by iterating on after the first micro-batch (untimed), the
  whole epoch or its first ``max_rows`` rows (Python per document: ~1-3 ms each here).
"""

from __future__ import annotations

PRELUDE = r"""
import json, os, sys, time
a = json.loads(sys.argv[1])
def elapsed():
    return time.time() - a["time0"]
def hwm_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
def rss_mb():
    # peak RSS so far of this process, and of the largest finished child (a process pool's)
    import resource
    return [hwm_mb(), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024]
T_IMPORT = time.time()
def begin():
    # after a side's imports: its record (with the imports' time) and the clock of its work
    return {"import_s": time.time() - T_IMPORT}, time.time()
"""

# the peers' sides start alike: quiet, NumPy
PEER = (
    PRELUDE
    + r"""
import logging, warnings
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
import numpy as np
"""
)

OURS = (
    PRELUDE
    + r"""
import numpy as np
from tokenload.format import TokenFile
if a.get("dataset"):
    from tokenload.datasets import MegatronDataConfig, build_datasets
    out, t = begin()
    extra = a.get("extra", 1)  # 0: rows of S slots (add_extra_token=False), as OLMo-core's
    cfg = MegatronDataConfig(sequence_length=a["seq"], random_seed=1234, blend=[a["prefix"]],
                             split="100,0,0", order="computed", packing="best-fit",
                             eod_id=a["eod"], pad_id=a["eod"], add_extra_token=bool(extra))
    ds = build_datasets(cfg, [a["samples"], 0, 0])[0]
    batch = ds.__getitems__(np.arange(a["micro_batch"]))
    out["pack_s"] = time.time() - t
    out["first_s"] = elapsed()
    out["rss_first_mb"] = rss_mb()
    # the epoch's rows, as the dataset serves them (not timed): every block of epoch 0 packed
    full = build_datasets(cfg, [None, 0, 0])[0]
    n = len(full)
    p = full.plan_pieces(np.arange(n))
    # the plan names sequences; a document of the file may hold none (an empty text)
    docs = np.asarray(TokenFile(a["prefix"]).document_indices, dtype=np.int64)
    np.savez(a["rows"], slots=a["seq"] + extra, offsets=np.r_[p.first, p.sequence.size],
             doc=np.searchsorted(docs, p.sequence, side="right") - 1, start=p.start,
             length=p.length)
    out["rows_total"] = n
else:
    from tokenload.index.packing import pack_block
    out, t = begin()
    tf = TokenFile(a["prefix"])
    ends = np.zeros(tf.num_sequences + 1, dtype=np.int64)
    np.cumsum(np.asarray(tf.sequence_lengths, dtype=np.int64), out=ends[1:])
    docs = np.asarray(tf.document_indices, dtype=np.int64)
    starts, lengths = ends[docs[:-1]], ends[docs[1:]] - ends[docs[:-1]]
    block = a["block"] or lengths.size
    extra = a.get("extra", 1)
    window = a["seq"] + extra
    plans = []
    first_block = pack_block(lengths[:block], window, extra=extra)
    plans.append((0, first_block))
    out["pack_first_block_s"] = time.time() - t
    mm = np.memmap(tf.bin_path, dtype=tf.dtype, mode="r")
    p = first_block
    rows = []
    for r in range(min(a["micro_batch"], p.num_rows)):
        lo, hi = p.row_offsets[r], p.row_offsets[r + 1]
        s = starts[p.piece_doc[lo:hi]] + p.piece_start[lo:hi]
        row = np.full(window, a["eod"], dtype=np.int64)
        row[: int(p.piece_length[lo:hi].sum())] = np.concatenate(
            [mm[b : b + n] for b, n in zip(s.tolist(), p.piece_length[lo:hi].tolist())])
        rows.append(row)
    batch = np.stack(rows)
    out["first_s"] = elapsed()
    out["rss_first_mb"] = rss_mb()
    for b in range(block, lengths.size, block):
        plans.append((b, pack_block(lengths[b : b + block], window, extra=extra)))
    out["pack_s"] = time.time() - t
    offsets, doc, start, length, base = [np.zeros(1, np.int64)], [], [], [], 0
    for b, p in plans:
        offsets.append(p.row_offsets[1:] + base)
        base += int(p.row_offsets[-1])
        doc.append(p.piece_doc + b); start.append(p.piece_start); length.append(p.piece_length)
    np.savez(a["rows"], slots=window, offsets=np.concatenate(offsets), doc=np.concatenate(doc),
             start=np.concatenate(start), length=np.concatenate(length))
out["hwm_mb"] = hwm_mb()
print(json.dumps(out))
"""
)

OLMO = (
    PEER
    + r"""
from olmo_core.data.numpy_dataset import NumpyPackedFSLDataset
from olmo_core.data.types import LongDocStrategy
out, t = begin()
ds = NumpyPackedFSLDataset(a["npy"], sequence_length=a["seq"], pad_token_id=a["eod"],
                           eos_token_id=a["eod"], vocab_size=a["vocab"], dtype=np.uint16,
                           long_doc_strategy=LongDocStrategy(a["strategy"]))
ds.work_dir = a["work"]
ds.prepare()
batch = [ds[i] for i in range(a["micro_batch"])]
out["pack_s"] = time.time() - t
out["first_s"] = elapsed()
out["rss_first_mb"] = rss_mb()
out["rows_total"] = len(ds)
out["hwm_mb"] = hwm_mb()
# its plan, as written to its work folder (raw uint64 arrays)
paths = [a["npy"]]
read = lambda p: np.fromfile(p, dtype=np.uint64).astype(np.int64)
np.savez(a["rows"], frags=read(ds._get_document_indices_path(*paths)),
         instances=read(ds._get_instance_offsets_path(*paths)),
         docs=read(ds._get_docs_by_instance_path(*paths)))
print(json.dumps(out))
"""
)

GRAIN = (
    PEER
    + r"""
import grain
out, t = begin()
seq = a["seq"]
offsets = np.load(a["offsets"])  # document boundaries, tokens
lengths = np.diff(offsets)
n = np.maximum(-(-lengths // seq), 0)  # pieces of at most S per document (0 for an empty one)
piece_doc = np.repeat(np.arange(lengths.size), n)
within = np.arange(piece_doc.size) - np.repeat(np.cumsum(n) - n, n)
piece_start = within * seq
piece_len = np.minimum(lengths[piece_doc] - piece_start, seq)
mm = np.memmap(a["bin"], dtype=np.uint16, mode="r")
base = offsets[piece_doc] + piece_start

def element(i):
    return {"tokens": mm[base[i] : base[i] + piece_len[i]].astype(np.int32), "piece": np.int64(i)}

source = grain.MapDataset.range(piece_doc.size).shuffle(seed=0).map(element).to_iter_dataset()
packed = grain.experimental.BestFitPackIterDataset(
    source, length_struct={"tokens": seq}, num_packing_bins=a["bins"], shuffle_bins=True, seed=0,
    meta_features=("piece",))
it = iter(packed)
rows = [next(it) for _ in range(a["micro_batch"])]
batch = np.stack([r["tokens"] for r in rows])
out["pack_s"] = time.time() - t
out["first_s"] = elapsed()
out["rss_first_mb"] = rss_mb()
row_pieces = [[int(p) for p in r["piece"]] for r in rows]
out["whole_epoch"] = True
for r in it:  # the epoch's rows (not timed), or the first ``max_rows``
    row_pieces.append([int(p) for p in r["piece"]])
    if a["max_rows"] and len(row_pieces) >= a["max_rows"]:
        out["whole_epoch"] = False
        break
out["rows_read"] = len(row_pieces)
out["epoch_s"] = time.time() - t
out["hwm_mb"] = hwm_mb()
counts = np.array([len(r) for r in row_pieces], dtype=np.int64)
flat = np.array([p for r in row_pieces for p in r], dtype=np.int64)
np.savez(a["rows"], slots=seq, offsets=np.r_[0, np.cumsum(counts)], doc=piece_doc[flat],
         start=piece_start[flat], length=piece_len[flat])
print(json.dumps(out))
"""
)

# The plan cost (packing.py's ``plan`` part), tokenload only, one fresh process per measure:
# the computed order's build and first micro-batch at row ``at`` (0: a start; near the epoch's
# end: a resume), ``packing`` "concat" or "best-fit"; payload ``prefix``, ``seq``, ``at``.
COMPUTED_START = (
    PRELUDE
    + r"""
import numpy as np
from tokenload.datasets import MegatronDataConfig, build_datasets
out, t = begin()
c0 = time.process_time()
cfg = MegatronDataConfig(sequence_length=a["seq"], random_seed=1234, blend=[a["prefix"]],
                         split="100,0,0", order="computed", packing=a["packing"],
                         eod_id=a["eod"], pad_id=0)
ds = build_datasets(cfg, [a["samples"], 0, 0])[0]
out["build_s"] = time.time() - t
at = int(a["at_share"] * ds.samples_per_epoch) if a["at_share"] else 0
batch = ds.__getitems__(np.arange(at, at + a["micro_batch"]))
out["data_s"] = time.time() - t
out["data_cpu_s"] = time.process_time() - c0
out["first_s"] = elapsed()
out["at"] = at
out["epoch_rows"] = int(ds.samples_per_epoch)
out["rss_first_mb"] = rss_mb()
print(json.dumps(out))
"""
)

# The Megatron order's index build (``build_policy`` "auto": built and written, as one rank of a
# job that finds no cache; "every-rank": in memory), packed or concatenated, as
# benchmarks/index_scale.py times it: the build call alone, wall and CPU, and the peak RSS.
MEGATRON_BUILD = (
    PRELUDE
    + r"""
import resource
from tokenload.datasets import MegatronDataConfig, build_datasets
cfg = MegatronDataConfig(sequence_length=a["seq"], random_seed=1234, blend=[a["prefix"]],
                         split="100,0,0", path_to_cache=a["cache"], build_policy=a["policy"],
                         mid_level_dataset_surplus=0.005, tokenizer=a["tokenizer"],
                         packing=a["packing"])
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
c0, t0 = cpu(), time.perf_counter()
ds = build_datasets(cfg, [a["size"], 0, 0])[0]
t1, c1 = time.perf_counter(), cpu()
print(json.dumps({"s": t1 - t0, "cpu": c1 - c0, "hwm_mb": hwm_mb(), "len": len(ds)}))
"""
)

# The read path (packing.py's ``read`` part): a fresh process builds the computed order's train
# split of ``prefix`` (``packing`` "concat" or "best-fit") and reads ``samples`` samples from
# row ``start`` with tokenload's loader (``workers`` processes), its first micro-batch untimed
# (worker start-up, the first block's plan); then samples/s and CPU per micro-batch (this
# process and its workers), benchmarks/common.py's PROBE.
READ = (
    PRELUDE
    + r"""
import numpy as np
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.loader import build_dataloader
exec(a["probe"])
if a.get("cold"):  # the token file out of the page cache (this process has mapped nothing yet)
    drop_caches([a["prefix"] + ".bin", a["prefix"] + ".idx"])
order = a.get("order", "computed")
caches = {"path_to_cache": a["index_cache"]} if order == "megatron" else {}
cfg = MegatronDataConfig(sequence_length=a["seq"], random_seed=1234, blend=[a["prefix"]],
                         split="100,0,0", order=order, packing=a["packing"],
                         eod_id=a["eod"], pad_id=a["eod"], **caches)
ds = build_datasets(cfg, [a["request"], 0, 0])[0]
mb = a["micro_batch"]
loader = build_dataloader(ds, micro_batch_size=mb, num_workers=a["workers"], dp_rank=0,
                          dp_size=1, persistent_workers=True, consumed_samples=a["start"])
it = iter(loader)
next(it)
pids = [p.pid for p in loader.worker_processes]
steps = a["samples"] // mb
def body():
    for _ in range(steps):
        next(it)
    return steps * mb
out = timed(body, steps, pids)
loader.close()
print(json.dumps(out))
"""
)
