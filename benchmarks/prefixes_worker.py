"""One rank of benchmarks/prefixes.py: benchmarks/startup_worker.py with two additions.

* The tokenload side ``policy == "computed"`` builds the computed order (``order="computed"``,
  nothing to build or cache) instead of a Megatron-order build policy.
* After the first item, the rank's open file descriptors (``/proc/self/fd``), its resident set
  (``VmRSS``) and peak (``VmHWM``) go into the record's ``result``.

Run by the driver only: ``prefixes_worker.py SPEC.json`` (the spec of startup_worker.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import startup_worker  # noqa: E402


def process_state() -> dict:
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                status[key] = int(value.split()[0])
    return {"fds": len(os.listdir("/proc/self/fd")), "rss_kb": status.get("VmRSS"),
            "hwm_kb": status.get("VmHWM")}


def with_state(prepare):
    def wrapped(spec: dict, rec: dict):
        phase = prepare(spec, rec)

        def measured():
            result = phase()
            result.update(process_state())
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
        config = MegatronDataConfig(sequence_length=spec["seq"], random_seed=spec["seed"],
                                    tokenizer=spec["tokenizer"], blend=blend, split=spec["split"],
                                    order="computed")
        train, _, _ = build_datasets(config, spec["sizes"])
        tokens = train[rank]["tokens"]
        return {"len": len(train), "first_token": int(tokens[0])}

    return phase


_tokenload = startup_worker.tokenload_prepare


def tokenload_prepare(spec: dict, rec: dict):
    if spec.get("policy") == "computed":
        return computed_prepare(spec, rec)
    return _tokenload(spec, rec)


startup_worker.tokenload_prepare = with_state(tokenload_prepare)
startup_worker.megatron_prepare = with_state(startup_worker.megatron_prepare)

if __name__ == "__main__":
    startup_worker.main()
