import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # the repository root, for benchmarks.models

# A fresh on-disk compilation cache per test session: no result depends on an earlier run.
import shutil  # noqa: E402

# Under pytest-xdist each worker process gets its own (`make test` runs two).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
_CACHE = os.path.join(os.path.dirname(HERE), ".pytest_cache", f"torchtpu-cache-{_WORKER}")
shutil.rmtree(_CACHE, ignore_errors=True)
os.environ["TORCHTPU_CACHE_DIR"] = _CACHE
