import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("TORCHTPU_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "torchtpu"))
