"""The one error the engine adapter raises for anything a user can fix or must know about."""
from __future__ import annotations


class EngineError(RuntimeError):
    """An engine could not be used: a bad spec, an unknown version, an unreachable registry, a failed
    import, or an API the adapter does not know. The message names what was tried; the CLI prints it
    and exits 2, never with a traceback."""


class ReleaseLacks(EngineError):
    """The release has not got a piece the scenario needs (0.5.14 has no unified memory pool): this release
    cannot run this scenario, other releases may. ``slotscope bisect`` lists such a release as "cannot run" and
    looks for the change among the releases that can; a single run exits 2 with the message, as for any
    EngineError."""


class AdapterLacks(EngineError):
    """slotscope's adapter of the release has no piece for what the scenario asks (an fp8 KV pool): the scenario
    cannot run in engine mode, though the release may have it. A run exits 2 with the message; a fuzz search
    counts the draw as rejected."""


class SchedulerStalled(EngineError):
    """The release's own scheduler made no forward for many passes of its loop with requests waiting: its pools
    cannot hold a waiting request (the model refuses such a scenario before it runs). A fuzz search counts the
    draw as rejected."""


class ReleaseBroke(RuntimeError):
    """The release broke an invariant of its own that no write or read shows (vLLM's block pool not getting every
    block back once every request finished: a leak). Not a refusal: the run ends as a failed run (exit 3, summary.json
    "incomplete" with the message), as one of the release's own asserts would end it."""
