"""The one error the engine adapter raises for anything a user can fix or must know about."""
from __future__ import annotations


class EngineError(RuntimeError):
    """An engine could not be used: a bad spec, an unknown version, an unreachable registry, a failed
    import, or an API the adapter does not know. The message names what was tried; the CLI prints it
    and exits 2, never with a traceback."""
