"""One step of a run: the backend boundary where designs are called, the executors that write (per layer,
the CPU's shared pools), the read check, the model sides (target and draft) and the run's observers."""
