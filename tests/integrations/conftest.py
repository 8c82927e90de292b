"""Lightning tests fail within 180 s instead of the suite's global 600 s when a run hangs (the
slowest, ddp_spawn on two ranks, takes about 25 s on a loaded 2-core machine). A test's own
``pytest.mark.timeout`` wins."""

from distributed.timeouts import folder_timeout

pytest_collection_modifyitems = folder_timeout(__file__, 180)
