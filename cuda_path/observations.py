"""The GPU step's boundary observations: a group's first backend's, held until delivery; the other members' made from them."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from simulator.core.observe import BackendRows, EvenlyTimed
from simulator.core.writes import loc_shapes

if TYPE_CHECKING:
    from .plans import BackendPlan


class ObservationQueue:
    """Boundary observations of one backend, held until its findings are delivered (same order). A lone batch
    of them (a graph replay's ``BackendRows``) is kept as it came: its tuples are made only where read."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls: Sequence[tuple] = []

    def on_boundary(self, *args) -> None:
        self._list().append(args)

    def on_boundaries(self, rows) -> None:
        if not self.calls and isinstance(rows, BackendRows):
            self.calls = rows
        else:
            self._list().extend(rows)

    def _list(self) -> list:
        """The observations as a list (a lone batch kept as it came made one now: more come)."""
        if not isinstance(self.calls, list):
            self.calls = list(self.calls)
        return self.calls


def call_kinds(calls: Sequence[tuple], layers) -> Optional[dict]:
    """Per kind what every one of a group's first backend's observations of that kind holds but its step,
    backend and times: (loc_len, swa_len, loc_dtype, swa_dtype, error); None where they are not one per
    layer, in layer order, alike within a kind. A graph replay's (``BackendRows`` of an :class:`EvenlyTimed`)
    from its static part, once per graph and layers (:data:`_STATIC_KINDS`)."""
    if len(calls) != len(layers):
        return None
    tails = getattr(calls, "tails", None)
    if isinstance(tails, EvenlyTimed):      # (the kinds hold no times: those of any one replay of the graph)
        got = _STATIC_KINDS.get(id(tails.static))
        if got is None or got[0] is not tails.static or got[1] is not layers:
            if len(_STATIC_KINDS) >= 4096:      # (graphs of runs gone: their parts are kept only until here)
                _STATIC_KINDS.clear()
            got = _STATIC_KINDS[id(tails.static)] = (tails.static, layers, _kinds_of(calls, layers))
        return got[2]
    return _kinds_of(calls, layers)


#: id(an EvenlyTimed's static part) -> (that part, the layers, :func:`_kinds_of` their rows): kept with the part
#: (a graph's, alive while its graph is) so that an id is never taken for another's
_STATIC_KINDS: dict[int, tuple] = {}


def _kinds_of(calls: Sequence[tuple], layers) -> Optional[dict]:
    """:func:`call_kinds` row by row (as many rows as layers)."""
    got: dict[str, tuple] = {}
    for li, c in zip(layers, calls):
        t = c[3:7] + (c[9],)
        if c[2] != li.layer or got.setdefault(li.kind, t) != t:
            return None
    return got


def observations_of(step: int, name: str, per_kind: dict, layers, lead: "BackendPlan") -> Sequence[tuple]:
    """A backend's boundary observations from its own write locations, in layer order, timed as its group's
    first backend's (a graph replay, a grouped store: one observation per layer, in the same order). Where
    its own per kind are what the first backend's hold (:func:`call_kinds`; asked once per step for each
    ``per_kind``, which twins share), those under its own name (a ``BackendRows`` of the first backend's
    observations but their step and backend)."""
    if lead.call_kinds is False:
        lead.call_kinds, lead.same_kinds = call_kinds(lead.calls, layers), {}
    same, seen = lead.same_kinds.get(id(per_kind)), None     # (the plans hold every per_kind through the step)
    if same is None:
        seen = _seen_kinds(per_kind)
        same = lead.same_kinds[id(per_kind)] = lead.call_kinds is not None and \
            lead.call_kinds == {k: seen[k] + (per_kind[k][2],) for k in seen}
    if same:
        if lead.tails is None:
            calls = lead.calls
            lead.tails = calls.tails if isinstance(calls, BackendRows) else [c[2:] for c in calls]
        return BackendRows((step, name), lead.tails)
    if seen is None:
        seen = _seen_kinds(per_kind)
    lead_calls = lead.calls
    if len(lead_calls) != len(layers):      # (not reached: the first backend observes every layer)
        lead_calls = [(None,) * 7 + (0, 0)] * len(layers)
    # (step, backend, layer, loc_len, swa_len, loc_dtype, swa_dtype, t0, t1, err)
    return [(step, name, li.layer, *seen[li.kind], c[7], c[8], per_kind[li.kind][2])
            for li, c in zip(layers, lead_calls)]


def _seen_kinds(per_kind: dict) -> dict:
    """Per kind what its observations hold of its write location: (loc_len, swa_len, loc_dtype, swa_dtype)."""
    return {kind: loc_shapes(wl) for kind, (wl, _, _) in per_kind.items()}
