"""Which slots each forward writes and reads: the continuous-batching scheduler (chunked prefill, decode,
mixed batches, lazy SWA eviction, retraction, DP and graph padding), the batches it yields with their
truth for the oracle, the radix prefix cache with SWA tombstones, the PD decode node, the workload and
the overlap timeline's journal of scheduler writes."""
