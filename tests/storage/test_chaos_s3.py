"""A short chaos run over token files read from ``s3://`` (issue 24): the faults of
``benchmarks/chaos.py`` strike loader workers that read an ``s3://`` prefix from the session's
SeaweedFS server in small chunks (every worker keeps sending ranged GETs); every batch must equal
the fault-free run's, no case may pass its bound, and spending the restart budget must end in a
WorkerError with every field. The full s3 axis (60+ faults) is the benchmark's ``--read-modes s3``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import s3fs

from tokenload import storage

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import chaos  # spawned workers find it through sys.path

CASES = [  # method, workers, kind, faults (fault, micro-batch), budget, expected
    ("fork", 2, "megatron", [("kill", 3), ("stop", 6)], 3, "ok"),
    ("fork", 2, "computed", [("exit_start", 0), ("block", 5)], 3, "ok"),
    ("fork", 1, "computed", [("stop_cont", 4), ("raise", 8)], 3, "ok"),
    ("spawn", 2, "megatron", [("exit_start", 0), ("kill", 5)], 3, "ok"),
    ("fork", 2, "megatron", [("kill", 2), ("exit_start", 5)], 1, "worker_error"),
]


@pytest.fixture(scope="module")
def data(s3_endpoint, tmp_path_factory):
    """The two orders over one ``s3://`` prefix, with their fault-free batches; the workers
    find endpoint and credentials in the ``AWS_*`` environment."""
    import torch  # noqa: F401  (the loader imports it; not inside the first case's bound)

    folder = tmp_path_factory.mktemp("chaos-s3")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in chaos.S3_ENV.items():
            mp.setenv(name, value)
        mp.setenv("AWS_ENDPOINT_URL", s3_endpoint)
        mp.setenv("TOKENLOAD_CACHE_DIR", str(folder / "idxcache"))
        fs = s3fs.S3FileSystem(key="test", secret="test", skip_instance_cache=True,
                               client_kwargs={"endpoint_url": s3_endpoint})
        files = chaos.make_data(folder, fs)
        assert files["s3"].startswith("s3://")
        built = {}
        for kind in ("megatron", "computed"):
            before = storage.stats()["gets"]
            dataset = chaos.build(kind, "s3", files)
            built[kind] = (dataset, chaos.expected_batches(dataset))
            assert storage.stats()["gets"] > before  # the tokens came from the bucket
        yield built


@pytest.mark.timeout(120)
def test_short_chaos_run_over_s3(data):
    outcomes = []
    for i, (method, workers, kind, faults, budget, expected) in enumerate(CASES):
        case = chaos.Case(method=method, workers=workers, kind=kind, read_mode="s3",
                          faults=faults, budget=budget, seed=i,
                          timeout=chaos.S3_TIMEOUT)
        dataset, want = data[kind]
        outcome = chaos.run_case(case, dataset, want)
        outcomes.append(outcome)
        if outcome.result != expected:  # the whole detail: a stalled worker's stack, say
            pytest.fail(f"{case}: {outcome.result}, expected {expected}\n{outcome.detail}")
        assert outcome.seconds < case.bound
    summary = chaos.summarize(outcomes)
    assert not summary["failures"]
    assert set(summary["by_fault"]) == set(chaos.FAULTS)
    assert summary["restarts"] >= 6 and summary["stalls"] >= 2
    assert summary["recover_s"]["n"] >= 4
