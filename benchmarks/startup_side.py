"""One rank's startup, for side-by-side runs of two source trees (``ab.py``): ``build_datasets``
on a blend, then its first micro-batch of 16.

Usage: python benchmarks/ab.py --src BEFORE/src --src src [--before 'rm -rf CACHE'] --
           python benchmarks/startup_side.py POLICY CACHE [BLEND_JSON]

BLEND_JSON (default: ``index_scale.py``'s 100-prefix blend of 1M documents,
``/tmp/tokenload-bench/index-scale/blend_100x1000000/blend.json``) lists the prefixes; S = 2048,
seed 1234, split ``99,1,0``, 200,000 train and 2,000 valid samples, ``build_policy=POLICY``,
cache folder CACHE (empty it between runs with ``--before`` to time a build)."""

import json
import sys

import numpy as np

from tokenload.datasets import MegatronDataConfig, build_datasets

policy, cache = sys.argv[1], sys.argv[2]
blend = sys.argv[3] if len(sys.argv) > 3 else (
    "/tmp/tokenload-bench/index-scale/blend_100x1000000/blend.json")
with open(blend) as f:
    prefixes = json.load(f)["prefixes"]
cfg = MegatronDataConfig(sequence_length=2048, random_seed=1234, blend=prefixes, split="99,1,0",
                         path_to_cache=cache, build_policy=policy, eod_id=0)
ds = build_datasets(cfg, [200_000, 2_000, 0])[0]
batch = ds.__getitems__(np.arange(16))
assert batch["tokens"].shape == (16, 2048)
