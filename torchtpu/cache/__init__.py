"""The compilation cache: an in-process tier, then an on-disk store (TORCHTPU_CACHE_DIR).

compile_graph calls `key_for`, `lookup` and `store`; `torchtpu cache ...` manages the store.
"""
from torchtpu.cache.tiers import key_for, lookup, store

__all__ = ["key_for", "lookup", "store"]
