"""vLLM in the loop (``--engine vllm==VERSION``): the release's own scheduler and hybrid KV-cache manager decide every
batch and its blocks; our oracle checks every write and read (docs/VLLM.md).

* :mod:`.release` fetches and imports a vLLM release (its wheel, ``--no-deps``, into slotscope's cache);
* :mod:`.scheduler` builds the release's ``Scheduler`` for a scenario and drives it step by step;
* :mod:`.worker` drives the worker side's block tables and slot mappings (the release's model runner V2
  ``BlockTables``; its Triton kernels under Triton's interpreter);
* :mod:`.source` turns each step into the simulator's ``ForwardBatch`` and the oracle's ``BatchTruth``;
* :mod:`.runtime` hands the simulator its seams (allocator, design, backends, scheduler) and says what ran.

Every ``import vllm`` of slotscope lives in this package.
"""
