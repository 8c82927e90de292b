"""Multi-process tests fail within 300 s instead of the suite's global 600 s when ranks deadlock
(the slowest, five launches of 2 to 8 spawned ranks, takes about 75 s on a loaded 2-core
machine; ``launch.run_ranks`` also gives up on one launch after 120 s). A test's own
``pytest.mark.timeout`` wins."""

from distributed.timeouts import folder_timeout

pytest_collection_modifyitems = folder_timeout(__file__, 300)
