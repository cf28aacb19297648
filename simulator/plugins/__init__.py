"""What sits around a step without being part of it: the overlap scheduler's timeline (scheduler writes
landing between a forward's layers), the unified pool's per-forward plan (virtual to physical ids), and
fault injection (``--inject``)."""
