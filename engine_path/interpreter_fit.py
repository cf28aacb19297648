"""Triton's interpreter fitted to the NumPy it runs on.

Up to Triton 3.6 the interpreter turns a loaded scalar into a Python int with ``int(handle.data)``; ``handle.data`` is a
one-element array, which NumPy 2.4 no longer converts ("only 0-dimensional arrays can be converted to Python
scalars"). A release kernel that loops over a range bounded by a loaded value (vLLM 0.34's slot-mapping kernel:
``range(start_idx, end_idx, ...)`` from ``query_start_loc``) then fails under that interpreter with that NumPy,
whatever the kernel does. Triton 3.7 on squeezes the array first; :func:`fit` makes older interpreters do the same
(nothing else of the interpreter changes), once per process, and only where its own conversion is the one that fails.
"""
from __future__ import annotations

import inspect

_FITTED = False


def _needs_fit(patch_fn) -> bool:
    import numpy as np

    try:
        int(np.zeros(1, dtype=np.int64))
        return False                     # this NumPy converts one-element arrays: the interpreter's own way works
    except TypeError:
        pass
    try:
        return "int(self.handle.data)" in inspect.getsource(patch_fn)
    except (OSError, TypeError):
        return False


def fit() -> bool:
    """Make Triton's interpreter squeeze a loaded scalar before ``int()`` where it does not; True when it was fitted
    (now or earlier in the process)."""
    global _FITTED
    if _FITTED:
        return True
    try:
        from triton.runtime import interpreter
    except Exception:                    # no Triton, or one without an interpreter: nothing to fit
        return False
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or not _needs_fit(original):
        return False

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_lang_tensor
    _FITTED = True
    return True


__all__ = ["fit"]
