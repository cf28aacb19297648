"""The one error the engine adapter raises for anything a user can fix or must know about."""
from __future__ import annotations

from pathlib import Path
from typing import Optional


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


def raised_in(package: str, what: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, a call into a release's code: an exception its code raises (not one of these errors)
    becomes :class:`ReleaseBroke` naming ``what`` raised it and where, the innermost frame of the release's package
    (or of a function an ``--engine-patch`` recompiled), so a release's own crash ends the run in one line, not as
    slotscope's traceback."""
    try:
        return fn(*args, **kwargs)
    except (EngineError, ReleaseBroke):
        raise
    except Exception as e:
        where = _where(e, package)
        if where is None:            # no frame of the release's: slotscope's own error, its traceback kept
            raise
        text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        raise ReleaseBroke(f"{what} raised {text} {where}") from e


#: this repository's engine adapters (engine_path/vllm/ is slotscope's, not vLLM's)
_OURS = str(Path(__file__).resolve().parent).replace("\\", "/") + "/"


def _where(exc: BaseException, package: str) -> Optional[str]:
    """ "(raised at PATH:LINE in FUNCTION)" of the innermost frame inside ``package`` (PATH from the package root),
    or None where no frame is the release's (slotscope's own modules, engine_path/ included, are not)."""
    tb, at = exc.__traceback__, None
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if (f"/{package}/" in name and not name.startswith(_OURS)) or name.startswith("<patched "):
            at = tb
        tb = tb.tb_next
    if at is None:
        return None
    code = at.tb_frame.f_code
    name = code.co_filename.replace("\\", "/")
    path = name.rsplit(f"/{package}/", 1)[-1] if f"/{package}/" in name else name
    return f"(raised at {path}:{at.tb_lineno} in {code.co_name})"
