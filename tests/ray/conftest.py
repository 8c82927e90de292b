"""A real local Ray cluster for the Ray executor tests: a head node and one added node (each one
CPU, so that two cores suffice), started once per session and shared by every test, since a
start costs about 10 s on a loaded 2-core machine. Tests reach it as a user would: RAY_ADDRESS
in the environment of a ``tokenload preprocess --executor ray`` subprocess, or ``ray_address=``.

Each test fails within 180 s instead of the suite's 600 s (the slowest, a driver killed and
rerun, takes about 40 s here). The S3 server fixtures are the storage tests' own."""

from __future__ import annotations

import pytest

from distributed.timeouts import folder_timeout
from storage.conftest import s3, s3_endpoint, s3_env  # noqa: F401  (fixtures shared with tests/storage)

pytest_collection_modifyitems = folder_timeout(__file__, 180)


@pytest.fixture(scope="session")
def ray_cluster():
    """Address (host:port) of a running two-node cluster; shut down after the session."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


@pytest.fixture
def ray_env(ray_cluster):
    """Environment that points a ``tokenload`` subprocess at the shared cluster."""
    return {"RAY_ADDRESS": ray_cluster}
