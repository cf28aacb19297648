"""The release's own forward in the loop: its attention backends' metadata, write locations and read tables.

In engine mode a backend boundary (simulator/core/boundary.py's ``Boundary``) is the release's backend itself:
:class:`~engine_path.forward.boundary.ReleaseBackends` is the run's ``BackendSource``. Per forward it builds the
release's ``ForwardBatch`` from the step's batch (its translator plan bound, as ``ForwardBatch.init_new`` does),
calls the backend's own ``init_forward_metadata``, and runs each layer's ``RadixAttention.forward`` (the
release's per-layer narrowing included) through the backend's ``forward_extend`` / ``forward_decode`` up to the
pool write, where a capture pool records the ``KVWriteLoc`` the backend hands over; the run then writes its
tagged rows at those locations into the pool under test. Only the attention arithmetic is replaced where it
cannot run here, and every replacement is named (``engine_pieces``).

Modules: ``runner`` (the model-runner stand-in a backend is built over: the release's pools, allocator,
translator, server args), ``batch`` (the release's ``ForwardBatch`` of a step), ``adapters`` (per backend: how it
is built, what of it is replaced, where its read tables are), ``graphs`` (the release's decode and prefill
CUDA-graph runners on the write path: capture, replay, the prefill-graph scope), ``kernels`` (three of the metadata's
Triton kernels as torch ops on CPU tensors, checked equal), ``boundary`` (the ``Boundary`` and the source).
"""
