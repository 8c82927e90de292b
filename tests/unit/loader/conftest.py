"""Loader tests fail within 60 s instead of the suite's global 600 s when a worker deadlocks
(the slowest of them takes about 3 s on a loaded 2-core machine). A test's own
``pytest.mark.timeout`` wins."""

from distributed.timeouts import folder_timeout

pytest_collection_modifyitems = folder_timeout(__file__, 60)
