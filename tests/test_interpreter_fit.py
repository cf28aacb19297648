"""engine_path.interpreter_fit: a Triton <= 3.6 interpreter under NumPy 2.4 converts a loaded scalar with
``int(one-element array)``, which raises; the fit squeezes first (vLLM's slot-mapping kernel bounds a loop that way:
its interpreted run stopped at step 0 on the device machine's Triton 3.6)."""
from __future__ import annotations

import numpy as np
import pytest

from engine_path import interpreter_fit

interpreter = pytest.importorskip("triton.runtime.interpreter")


class _Scope:
    def set_attr(self, obj, name, value):
        setattr(obj, name, value)


def _old_patch_lang_tensor(tensor, scope):          # Triton 3.6's conversion, as its source has it
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))


class _Handle:
    data = np.array([7], dtype=np.int32)


def test_an_old_interpreter_under_numpy_2_4_is_fitted(monkeypatch):
    monkeypatch.setattr(interpreter, "_patch_lang_tensor", _old_patch_lang_tensor)
    monkeypatch.setattr(interpreter_fit, "_FITTED", False)

    class T:
        handle = _Handle()

    _old_patch_lang_tensor(T, _Scope())
    needs = not _converts_one_element_arrays()
    if needs:
        with pytest.raises(TypeError):
            range(T())[0]
    assert interpreter_fit.fit() is needs
    interpreter._patch_lang_tensor(T, _Scope())
    assert list(range(T())) == list(range(7))


def test_an_interpreter_that_squeezes_is_left_alone(monkeypatch):
    def squeezing(tensor, scope):
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", squeezing)
    monkeypatch.setattr(interpreter_fit, "_FITTED", False)
    assert interpreter_fit.fit() is False and interpreter._patch_lang_tensor is squeezing


def _converts_one_element_arrays() -> bool:
    try:
        int(np.zeros(1))
        return True
    except TypeError:
        return False
