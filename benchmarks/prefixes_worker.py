"""One rank of benchmarks/prefixes.py: benchmarks/startup_worker.py with these additions.

* The tokenload side ``policy == "computed"`` builds the computed order (``order="computed"``,
  nothing to build or cache) instead of a Megatron-order build policy.
* After the first item, while the built datasets are still alive (the builder's return value is
  held until then, as a training job holds it), the rank's open file descriptors
  (``/proc/self/fd``), its resident set (``VmRSS``) and peak (``VmHWM``) go into the record's
  ``result``. (Measured after the phase returned, the datasets are already freed and their
  descriptors closed: that hid megatron-core's 3 descriptors per prefix.)
* ``spec["mmap_bin_files"] is False`` passes megatron-core's ``mmap_bin_files=False``
  (``--no-mmap-bin-files``): ``.bin`` files read with ``pread`` through a file opened per read,
  so a prefix holds one descriptor (its ``.idx`` map) instead of three.
* A failed phase reports the open descriptors at the failure (an ``EMFILE`` shows how far it got)
  and frees what it held before the record is written.

Run by the driver only: ``prefixes_worker.py SPEC.json`` (the spec of startup_worker.py).
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import startup_worker  # noqa: E402

_HELD: list = []  # the builder's return value, until the state after the first item is taken


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # EMFILE: listing needs a descriptor
        return -1


def process_state() -> dict:
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                status[key] = int(value.split()[0])
    return {"fds": open_fds(), "rss_kb": status.get("VmRSS"), "hwm_kb": status.get("VmHWM")}


def holding(build):
    """``build`` whose return value stays alive until ``_HELD`` is cleared."""

    def held(*args, **kwargs):
        out = build(*args, **kwargs)
        _HELD.append(out)
        return out

    return held


def with_state(prepare):
    def wrapped(spec: dict, rec: dict):
        phase = prepare(spec, rec)

        def measured():
            failure = None
            try:
                result = phase()
            except Exception as exc:
                failure = (
                    f"{type(exc).__name__}: {exc} (open descriptors at the failure: {open_fds()})"
                )
            if failure is not None:
                _HELD.clear()
                gc.collect()
                raise RuntimeError(failure)
            result.update(process_state())
            _HELD.clear()
            return result

        return measured

    return wrapped


def computed_prepare(spec: dict, rec: dict):
    import time

    t = time.time()
    from tokenload.datasets import MegatronDataConfig, build_datasets

    rec["import_lib_s"] = time.time() - t
    rec["tokenizer_s"] = 0.0
    rank = int(os.environ.get("RANK", "0"))

    def phase():
        blend = [x for w, p in zip(spec["weights"], spec["prefixes"]) for x in (str(w), p)]
        config = MegatronDataConfig(
            sequence_length=spec["seq"],
            random_seed=spec["seed"],
            tokenizer=spec["tokenizer"],
            blend=blend,
            split=spec["split"],
            order="computed",
        )
        train, _, _ = build_datasets(config, spec["sizes"])
        tokens = train[rank]["tokens"]
        return {"len": len(train), "first_token": int(tokens[0])}

    return phase


_tokenload = startup_worker.tokenload_prepare
_megatron = startup_worker.megatron_prepare


def tokenload_prepare(spec: dict, rec: dict):
    import tokenload.datasets

    # Both prepares import ``build_datasets`` from the package: patched before they do.
    tokenload.datasets.build_datasets = holding(tokenload.datasets.build_datasets)
    if spec.get("policy") == "computed":
        return computed_prepare(spec, rec)
    return _tokenload(spec, rec)


def megatron_prepare(spec: dict, rec: dict):
    phase = _megatron(spec, rec)  # imports the builder
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )

    build = BlendedMegatronDatasetBuilder.build
    nommap = spec.get("mmap_bin_files") is False

    def build_held(self):
        if nommap:
            self.config.mmap_bin_files = False
        out = build(self)
        _HELD.append(out)
        return out

    BlendedMegatronDatasetBuilder.build = build_held
    rec["mmap_bin_files"] = not nommap
    return phase


startup_worker.tokenload_prepare = with_state(tokenload_prepare)
startup_worker.megatron_prepare = with_state(megatron_prepare)

if __name__ == "__main__":
    startup_worker.main()
