"""Designs: the write-location logic under test, and the hook interface a design implements.

A design models the fix (or the bug) under test; the engine it runs in is the engine model
(:mod:`simulator.engine_model`). ``from simulator.designs import Design, KVWriteLoc`` is all a user's
design file needs (docs/GUIDE.md). The modules:

* :mod:`~simulator.designs.base`: :class:`Design`, its hooks and what it declares;
* :mod:`~simulator.designs.types`: the values hooks take and return (``KVWriteLoc``, ``ReadTable``,
  ``BoundaryContext``);
* :mod:`~simulator.designs.tables`: helpers to build them (``gather``, ``read_ranges``, ``prefix_reads``);
* :mod:`~simulator.designs.checks`: the run's checks on what hooks return (``HookFailure``);
* :mod:`~simulator.designs.catalogue`: the built-in designs, listed explicitly; one module per family of
  them (``sglang``, ``corpus``, ``releases``, ``radix``, ``unified``, ``eagle_preplan``);
* :mod:`~simulator.designs.loading`: ``--design NAME`` or ``path/to/file.py:ClassName``.
"""
from .base import DECLARATIONS, Design, declare, declared
from .catalogue import BUILTIN_DESIGNS
from .loading import design_instance, design_padding, load_design
from .tables import gather, prefix_reads, read_ranges
from .types import GRAPH_RUNNERS, BoundaryContext, DesignError, KVWriteLoc, ReadIds, ReadTable, graph_runner

__all__ = ["BUILTIN_DESIGNS", "BoundaryContext", "DECLARATIONS", "Design", "DesignError", "GRAPH_RUNNERS",
           "KVWriteLoc", "ReadIds", "ReadTable", "declare", "declared", "design_instance", "design_padding", "gather",
           "graph_runner", "load_design", "prefix_reads", "read_ranges"]
