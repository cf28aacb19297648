"""simulator.core.observe.boundary_sink: a list of crossings reaches every observer exactly as one on_boundary
call per row would (ShapeTimeline's own on_boundaries, the fanout, the loop default for observers without one),
and so does a BackendRows (one backend's rows of one step, made when read)."""
from __future__ import annotations

import itertools

from simulator.core.observe import BackendRows, NullObserver, ObserverFanout, boundary_sink
from slotscope.outputs import ShapeTimeline


class _Calls(NullObserver):
    def __init__(self):
        self.calls = []

    def on_boundary(self, *args):
        self.calls.append(args)


def _rows() -> list[tuple]:
    rows = []
    for step, backend in itertools.product((3, 4), ("fa3", "triton", "fa3")):     # a (step, backend) twice
        for layer in range(6):
            rows.append((step, backend, layer, 10 + layer + step, -1 if layer % 2 else 7, "torch.int64",
                         "" if layer % 2 else "torch.int32", 100 * layer, 100 * layer + 50,
                         None if layer != 4 else "length mismatch"))
    return rows


def _timeline() -> ShapeTimeline:
    tl = ShapeTimeline()
    tl._kind = {i: ("swa" if i % 3 else "full") for i in range(6)}
    return tl


def test_shape_timeline_rows_batched_equal_per_call():
    rows = _rows()
    one, many = _timeline(), _timeline()
    for r in rows:
        one.on_boundary(*r)
    sink = boundary_sink(many)
    assert sink == many.on_boundaries
    sink(rows[:20])
    sink(rows[20:])
    assert many.rows == one.rows and many._seen == one._seen
    assert len(one.rows) == 8      # per (step, backend, kind) the first layer's lengths
    assert one.rows[:2] == [(3, "fa3", "full", 13, 7), (3, "fa3", "swa", 14, -1)]


def test_an_observer_with_on_boundary_only_gets_each_row_in_order():
    rows = _rows()
    o = _Calls()                            # NullObserver's on_boundaries must not swallow its calls
    boundary_sink(o)(rows)
    assert o.calls == rows

    class Mine(ShapeTimeline):              # overrides on_boundary alone: its own is called
        def __init__(self):
            super().__init__()
            self.n = 0

        def on_boundary(self, *args):
            self.n += 1
            super().on_boundary(*args)

    m = Mine()
    m._kind = _timeline()._kind
    boundary_sink(m)(rows)
    assert m.n == len(rows) and m.rows == _timeline_rows(rows)

    t = _timeline()
    seen = []
    t.on_boundary = lambda *a: seen.append(a)   # an instance given its own on_boundary keeps it
    boundary_sink(t)(rows)
    assert seen == rows and t.rows == []


def _timeline_rows(rows):
    t = _timeline()
    for r in rows:
        t.on_boundary(*r)
    return t.rows


def test_fanout_batched_equals_per_call():
    rows = _rows()
    a, b = _Calls(), _timeline()
    ObserverFanout([a, NullObserver(), b]).on_boundaries(rows)
    c, d = _Calls(), _timeline()
    fan = ObserverFanout([c, NullObserver(), d])
    for r in rows:
        fan.on_boundary(*r)
    assert a.calls == c.calls == rows and b.rows == d.rows == _timeline_rows(rows)
    assert boundary_sink(fan) == fan.on_boundaries


def _backend_rows(rows) -> list[BackendRows]:
    """The rows as one BackendRows per run of equal (step, backend)."""
    out = []
    for head, group in itertools.groupby(rows, key=lambda r: r[:2]):
        out.append(BackendRows(head, [r[2:] for r in group]))
    return out


def test_backend_rows_reach_observers_as_their_tuples():
    rows = _rows()
    parts = _backend_rows(rows)
    assert len(parts) == 6 and [list(p) for p in parts] == [rows[i:i + 6] for i in range(0, 36, 6)]
    assert parts[1][2] == rows[8] and parts[1][1:3] == rows[7:9] and len(parts[1]) == 6 and parts[1] == rows[6:12]
    t, c, fan_t, fan_c = _timeline(), _Calls(), _timeline(), _Calls()
    fan = ObserverFanout([fan_c, NullObserver(), fan_t])
    for p in parts:
        boundary_sink(t)(p)
        boundary_sink(c)(p)
        fan.on_boundaries(p)
    # ShapeTimeline reads each BackendRows only up to each kind's first row, with the same result; a repeated
    # (step, backend) (fa3 twice per step here) adds nothing the second time
    one = _timeline()
    for r in rows:
        one.on_boundary(*r)
    assert t.rows == fan_t.rows == one.rows and t._seen == fan_t._seen == one._seen
    assert len(t.rows) == 8 and t.rows[:2] == [(3, "fa3", "full", 13, 7), (3, "fa3", "swa", 14, -1)]
    assert c.calls == fan_c.calls == rows


def test_backend_rows_of_one_kind_only_and_after_plain_rows():
    rows = _rows()
    t = _timeline()
    t.on_boundaries(rows[:1])                     # step 3, fa3, layer 0 (full) seen through a plain list
    t.on_boundaries(BackendRows((3, "fa3"), [r[2:] for r in rows[1:3]]))   # layers 1, 2: swa only
    t.on_boundaries(BackendRows((3, "fa3"), [r[2:] for r in rows[3:4]]))   # layer 3 (full): seen already
    assert t.rows == [(3, "fa3", "full", 13, 7), (3, "fa3", "swa", 14, -1)]


def test_evenly_timed_rows_are_the_replays_per_layer_tuples():
    from simulator.core.observe import EvenlyTimed

    static = tuple((layer, 8, -1 if layer % 2 else 8, "torch.int64", "" if layer % 2 else "torch.int32")
                   for layer in range(6))
    t0, per = 1_000, 37
    want = [(5, "fa3", *o, t0 + i * per, t0 + (i + 1) * per, None) for i, o in enumerate(static)]
    rows = BackendRows((5, "fa3"), EvenlyTimed(static, t0, per))
    assert list(rows) == want and rows == want and len(rows) == 6
    assert rows[0] == want[0] and rows[-1] == want[-1] and rows[1:4] == want[1:4]
    assert rows.tails[-2] == want[-2][2:] and rows.tails[::2] == [w[2:] for w in want[::2]]
    try:
        rows.tails[6]
    except IndexError:
        pass
    else:
        raise AssertionError("EvenlyTimed[6] of 6 rows did not raise IndexError")
    one, lazy = _timeline(), _timeline()     # the timeline reads them as it reads the list
    boundary_sink(one)(want)
    boundary_sink(lazy)(rows)
    assert lazy.rows == one.rows and lazy._seen == one._seen


def test_step_runner_queue_keeps_a_lone_batch_and_gives_the_same_rows_and_kinds():
    from cuda_path.observations import ObservationQueue as _Queue, call_kinds as _call_kinds
    from simulator.core.observe import EvenlyTimed
    from simulator.records import LayerInfo

    layers = tuple(LayerInfo(i, "swa" if i % 2 else "full", i // 2) for i in range(6))
    static = tuple((li.layer, 8, 8 if li.kind == "swa" else -1, "torch.int64", "torch.int32") for li in layers)
    rows = BackendRows((2, "fa3"), EvenlyTimed(static, 0, 10))
    q = _Queue()
    q.on_boundaries(rows)
    assert q.calls is rows                   # kept as it came: no tuple made yet
    assert _call_kinds(rows, layers) == _call_kinds(list(rows), layers) == {
        "full": (8, -1, "torch.int64", "torch.int32", None), "swa": (8, 8, "torch.int64", "torch.int32", None)}
    odd = tuple(o if o[0] != 3 else (3, 9) + o[2:] for o in static)      # one layer's lengths unlike its kind's
    assert _call_kinds(BackendRows((2, "fa3"), EvenlyTimed(odd, 0, 10)), layers) is None
    q.on_boundary(2, "fa3", 6, 1, 1, "torch.int64", "torch.int32", 70, 80, None)
    assert q.calls == list(rows) + [(2, "fa3", 6, 1, 1, "torch.int64", "torch.int32", 70, 80, None)]
