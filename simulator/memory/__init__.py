"""Slots and pools: the hybrid allocator (full and SWA sub-pools, ``full_to_swa``), the unified pool of
virtual ids, the pool-writer protocol and pool classes (copy on divergence), and slot events, the
vocabulary in which allocators and caches tell the oracle who owns what."""
