"""Small end-to-end checks of a release's write path, callable in-process or through engine_path.isolate.

:func:`b1_write` is bug B1 (#29460) in the real code: three requests of 14 real tokens allocated by
the release's allocator, ``out_cache_loc`` DP-padded with zeros, translated by the backend's own
path in the release, ``loc`` narrowed to the real tokens as a piecewise-graph layer sees it, the
release's ``KVWriteLoc`` built and handed to the release's ``SWAKVPool.set_kv_buffer`` with K/V rows
of ``len(loc)``. Every step is the engine's; only the orchestration is ours.
"""
from __future__ import annotations

from typing import Optional

import torch

from simulator.memory.allocator import RequestSlots

from .allocator import EngineAllocator
from .api import load
from .pool import EnginePool
from .writeloc import Translator, make_write_loc


def b1_write(dp_pad: int = 3, swa_len: Optional[int] = None, backend: str = "torch_native",
             counts: tuple[int, ...] = (5, 5, 4), page_size: int = 1) -> dict:
    """Lengths after ``KVWriteLoc`` and the outcome of the full and the SWA layer's store.

    ``swa_len`` None: ``swa_loc`` is the translation of the DP-padded ``out_cache_loc`` (B1: longer);
    an int: ``swa_loc`` is cut to that many entries before ``KVWriteLoc`` (shorter: the fix's gap)."""
    api = load()
    layers = [(0, "swa", 0), (1, "full", 0)]
    full_size, swa_size = 256, 192
    pool = EnginePool(api, full_size=full_size, swa_size=swa_size, page_size=page_size, layers=layers)
    alloc = EngineAllocator(api, full_size, swa_size, page_size, kvcache=pool.pool)
    reqs = [RequestSlots(64) for _ in counts]
    locs = [alloc.extend(r, n) for r, n in zip(reqs, counts)]
    real = torch.from_numpy(__import__("numpy").concatenate(locs))
    n_real = int(real.shape[0])
    out_cache_loc = torch.cat([real, torch.zeros(dp_pad, dtype=torch.int64)])
    tr = Translator(api, pool.pool, alloc.engine, page_size)
    swa = tr.translate(out_cache_loc, backend, num_token_non_padded=n_real)
    if swa_len is not None:
        swa = swa[:swa_len]
    loc = out_cache_loc[:n_real]                       # piecewise graph: the layer sees the real tokens
    wl = make_write_loc(api, loc, swa)
    tags = torch.arange(1, n_real + 1, dtype=torch.int64)
    result = {"version": api.info.version, "has_post_init_slice": api.features.has_post_init_slice,
              "translation": tr.source(backend), "out_cache_loc_len": int(out_cache_loc.shape[0]),
              "loc_len": int(wl.loc.shape[0]), "swa_len": int(wl.swa_loc.shape[0])}
    for g, kind, index in layers:
        k, v = pool.make_rows(tags, g, kind)
        try:
            pool.set_kv_buffer(g, wl, k, v, kind=kind, index=index)
            slots = torch.from_numpy(alloc.full_to_swa[real.numpy()] if kind == "swa" else real.numpy())
            got_k, got_v = pool.read_tags(kind, slots)
            ok = bool((got_k[index] == tags).all() and (got_v[index] == tags).all())
            result[kind] = "ok" if ok else "wrong rows"
        except Exception as e:  # the outcome under test: the release's own error, as text
            result[kind] = f"{type(e).__name__}: {e}"
    return result


def allocator_run(page_size: int, seed: int = 0, ops: int = 300) -> dict:
    """A random sequence of extends, evictions, truncations and frees on the release's allocator, with
    the model's allocator invariants asserted after every operation; returns what was done."""
    import numpy as np

    from simulator.memory.allocator import OutOfSlots

    api = load()
    alloc = EngineAllocator(api, 512, 384, page_size)
    rng = np.random.default_rng(seed)
    reqs: list[RequestSlots] = []
    done = dict.fromkeys(("extend", "decode", "evict", "truncate", "free", "refused"), 0)
    for _ in range(ops):
        op = int(rng.integers(0, 5))
        try:
            if op == 0 or not reqs:
                r = RequestSlots(256)
                alloc.extend(r, int(rng.integers(1, 48)))
                reqs.append(r)
                done["extend"] += 1
            elif op == 1:
                r = reqs[int(rng.integers(len(reqs)))]
                n = 1 if rng.random() < 0.7 else int(rng.integers(2, 30))
                alloc.extend(r, n)
                done["decode" if n == 1 else "extend"] += 1
            elif op == 2:
                r = reqs[int(rng.integers(len(reqs)))]
                done["evict"] += alloc.evict_swa(r, r.length - int(rng.integers(1, 40))) > 0
            elif op == 3:
                r = reqs[int(rng.integers(len(reqs)))]
                keep = max(r.swa_evicted, r.length - int(rng.integers(0, 6)))
                done["truncate"] += alloc.truncate(r, keep) > 0
            else:
                alloc.free(reqs.pop(int(rng.integers(len(reqs)))))
                done["free"] += 1
        except (OutOfSlots, ValueError):
            done["refused"] += 1
        alloc.check_invariants(reqs)
    for r in reqs:
        alloc.free(r)
    alloc.check_invariants([])
    done.update(full_used_at_end=alloc.full_used, swa_used_at_end=alloc.swa_used, version=api.info.version)
    return done


def scenario_run(path: str, backends: Optional[list[str]] = None, max_steps: Optional[int] = None) -> dict:
    """A shipped scenario through ``run_simulation`` with the release in the write path: its allocator
    (``run_simulation``'s ``allocator_factory`` seam), translation, ``KVWriteLoc`` and pool (the seams of
    :class:`~engine_path.runtime.EngineRuntime`)."""
    import dataclasses

    from simulator.run import run_simulation
    from simulator.scenario import load_scenario

    from .runtime import EngineRuntime

    api = load()
    sc = load_scenario(path)
    if backends:
        sc = dataclasses.replace(sc, backends=tuple(backends))
    rt = EngineRuntime(api)
    res = run_simulation(sc, rt.design, rt.pool_factory(sc.model), device="cpu", max_steps=max_steps,
                         allocator_factory=rt.allocator_factory)
    return {"version": api.info.version, "design": rt.design.name, "steps": len(res.steps),
            "backends": {b: s.to_json() for b, s in res.backends.items()},
            "swa_ids": {b: rt.translator.source(b) for b in sc.backends},
            "engine_calls": dict(rt.allocator.calls), "page_size": rt.allocator.page_size,
            "wall_s": round(res.wall_s, 3)}


def shared_step_run(path: str) -> dict:
    """A shipped scenario with the release in the write path twice: through the shared step (simulator.core.eager
    SharedStep: one release pool per class of backends with the same writes, the release's store once per class
    and layer, its errors every member's) and through the run's own step (every backend on its own release pool
    and store, layer after layer). The findings of each in order, the counts, the classes and the stores."""
    from simulator.core.eager import EagerExecutor
    from simulator.run import run_simulation
    from simulator.scenario import load_scenario

    from .pool import EnginePool
    from .runtime import EngineRuntime


    api = load()
    sc = load_scenario(path)
    stores = {"n": 0}
    real = EnginePool.set_kv_buffer

    def counted(self, *a, **kw):
        stores["n"] += 1
        return real(self, *a, **kw)

    out = {}
    EnginePool.set_kv_buffer = counted
    try:
        for how, executor in (("shared", EagerExecutor()), ("own", EagerExecutor(shared=False))):
            stores["n"] = 0
            rt = EngineRuntime(api)
            res = run_simulation(sc, rt.design, rt.pool_factory(sc.model), device="cpu", executor=executor,
                                 allocator_factory=rt.allocator_factory)
            classes = None
            if how == "shared":
                (_, pc), = executor.stepwise._classes.values()
                groups: dict[int, list[str]] = {}
                for name, cid in pc.of.items():
                    groups.setdefault(cid, []).append(name)
                classes = sorted(groups.values())
            out[how] = {"findings": [f.to_json() for f in res.findings], "classes": classes,
                        "backends": {b: st.to_json() for b, st in res.backends.items()},
                        "crossings": res.crossings, "stores": stores["n"]}
    finally:
        EnginePool.set_kv_buffer = real
    return out


def translation_agrees(page_size: int = 1, seed: int = 0) -> dict:
    """Per backend, the release's SWA ids for a DP-padded out_cache_loc against ``full_to_swa[loc]``."""
    import numpy as np

    api = load()
    alloc = EngineAllocator(api, 512, 384, page_size)
    rng = np.random.default_rng(seed)
    reqs = [RequestSlots(128) for _ in range(5)]
    locs = [alloc.extend(r, int(rng.integers(1, 60))) for r in reqs]
    alloc.evict_swa(reqs[0], reqs[0].length - 3)
    real = torch.from_numpy(np.concatenate(locs))
    padded = torch.cat([real, torch.zeros(5, dtype=torch.int64)])
    tr = Translator(api, alloc.kvcache, alloc.engine, page_size)
    want = alloc.mapping[padded]
    out = {}
    for backend in ("flashinfer", "triton", "flashattention", "trtllm_mha", "aiter", "xpu", "torch_native", "musa"):
        got = tr.translate(padded, backend, num_token_non_padded=int(real.shape[0]))
        out[backend] = {"source": tr.source(backend), "equal": bool(torch.equal(got.to(torch.int64), want)),
                        "len": int(got.shape[0])}
    return out


def eviction_run(page_size: int = 1, window: int = 8) -> dict:
    """The release's eviction rule on one growing request: the evicted length after each decode step."""
    from .eviction import EvictionRule

    api = load()
    alloc = EngineAllocator(api, 512, 384, page_size)
    rule = EvictionRule(alloc, window, eviction_interval=1)
    r = RequestSlots(256)
    alloc.extend(r, 40)
    trail = []
    for _ in range(40):
        rule.evict(r, r.length)
        alloc.check_invariants([r])
        trail.append(r.swa_evicted)
        alloc.extend(r, 1)
    return {"evicted": trail, "swa_used": alloc.swa_used, "length": r.length, "api": rule.kind, "found": rule.found}


def pool_roundtrip(page_size: int = 1) -> dict:
    """Tagged rows written through the release's pool at allocator slots read back exactly, both sub-pools."""
    api = load()
    layers = [(0, "swa", 0), (1, "full", 0), (2, "swa", 1), (3, "full", 1)]
    pool = EnginePool(api, full_size=128, swa_size=96, page_size=page_size, layers=layers)
    alloc = EngineAllocator(api, 128, 96, page_size, kvcache=pool.pool)
    r = RequestSlots(64)
    full = torch.from_numpy(alloc.extend(r, 20))
    swa = alloc.mapping[full]
    tags = torch.arange(100, 120, dtype=torch.int64)
    for g, kind, index in layers:
        k, v = pool.make_rows(tags, g, kind)
        pool.store(kind, index, swa if kind == "swa" else full, k, v)
    out = {}
    for kind, slots in (("full", full), ("swa", swa)):
        kt, vt = pool.read_tags(kind, slots)
        out[kind] = bool((kt == tags).all() and (vt == tags).all())
        out[kind + "_mismatch_free"] = not bool(pool.mismatches(kind, slots, tags).any())
    # an index past the buffer: counted out of range, nothing written (torch's IndexError on the CPU)
    k, v = pool.make_rows(tags[:2], 1, "full")
    pool.store("full", 0, torch.tensor([1, 10_000]), k, v)
    out["out_of_range"] = pool.take_out_of_range("full")[0].tolist()
    return out


def release_report(scenarios: Optional[list[str]] = None, shared: Optional[list[str]] = None) -> dict:
    """Everything the engine tests assert on, for one release, from one process (one import); ``shared``: the
    scenarios also run through :func:`shared_step_run`."""
    api = load()
    rep = {"info": api.info.to_json(), "features": api.features.to_json(),
           "b1_longer": {b: b1_write(3, None, b) for b in ("torch_native", "flashinfer")},
           "b1_shorter": b1_write(0, 12),
           "alloc": {str(p): allocator_run(p) for p in (1, 16)},
           "translation": translation_agrees(),
           "eviction": {str(p): eviction_run(p) for p in (1, 4)},
           "pool": pool_roundtrip(),
           "differential": allocator_differentials(),
           "design": design_hooks(),
           "graph_buffers": graph_buffers(),
           "stores": stores(),
           "second_release": second_release("0.5.15" if api.info.version != "0.5.15" else "0.5.14"),
           "scenarios": {}}
    for path in scenarios or []:
        rep["scenarios"][path] = scenario_run(path)
    rep["shared_step"] = {path: shared_step_run(path) for path in shared or []}
    return rep


def second_release(version: str) -> Optional[str]:
    """What asking this process for a second, different release says (one release per process)."""
    from .errors import EngineError
    from .releases import activate

    try:
        activate(f"sglang=={version}", fetch_missing=False)
    except EngineError as e:
        return str(e)
    return None


def info() -> dict:
    """What the process imported: the release and its features."""
    api = load()
    return {"info": api.info.to_json(), "features": api.features.to_json()}


def allocator_differential(page_size: int, order: str, seed: int = 0, ops: int = 300) -> dict:
    """The same random operations on the model's HybridAllocator (free order ``order``) and the release's:
    the first operation where the slots handed out differ (None: identical throughout)."""
    import numpy as np

    from simulator.memory.allocator import HybridAllocator, OutOfSlots

    api = load()
    model = HybridAllocator(512, 384, page_size, free_order=order)
    eng = EngineAllocator(api, 512, 384, page_size)
    rng = np.random.default_rng(seed)
    pairs: list[tuple[RequestSlots, RequestSlots]] = []
    for i in range(ops):
        op = int(rng.integers(0, 4))
        n = int(rng.integers(1, 48)) if op == 0 else (1 if rng.random() < 0.7 else int(rng.integers(2, 30)))
        cut = int(rng.integers(1, 40))
        pick = int(rng.integers(len(pairs))) if pairs else 0
        if not pairs:
            op = 0
        try:
            if op == 0:
                a, b = RequestSlots(256), RequestSlots(256)
                fa, fb = model.extend(a, n), eng.extend(b, n)
                pairs.append((a, b))
            elif op == 1:
                a, b = pairs[pick]
                fa, fb = model.extend(a, n), eng.extend(b, n)
            elif op == 2:
                a, b = pairs[pick]
                model.evict_swa(a, a.length - cut)
                eng.evict_swa(b, b.length - cut)
                fa = fb = np.zeros(0)
            else:
                a, b = pairs.pop(pick)
                model.free(a)
                eng.free(b)
                fa = fb = np.zeros(0)
        except (OutOfSlots, ValueError) as e:
            return {"first_difference": None, "stopped": f"op {i}: {e}", "ops": i}
        same = (np.array_equal(fa, fb) and a.length == b.length and np.array_equal(a.full[:a.length], b.full[:b.length])
                and np.array_equal(a.swa[:a.length], b.swa[:b.length])
                and model.full_used == eng.full_used and model.swa_used == eng.swa_used)
        if not same:
            return {"first_difference": i, "op": ["extend", "grow", "evict", "free"][op], "n": n,
                    "model": {"out": np.asarray(fa).tolist()[:8], "used": [model.full_used, model.swa_used]},
                    "engine": {"out": np.asarray(fb).tolist()[:8], "used": [eng.full_used, eng.swa_used]}}
    return {"first_difference": None, "ops": ops}


def allocator_differentials(seed: int = 0) -> dict:
    """:func:`allocator_differential` at page sizes 1 and 16, under both of the model's free orders."""
    return {f"page {p} {order}": allocator_differential(p, order, seed) for p in (1, 16) for order in ("lifo", "fifo")}


def design_hooks() -> dict:
    """EngineDesign's hooks against the design interface: copies share the engine objects, backend_spec
    names the release's SWA-id source, make_write_loc returns the simulator's KVWriteLoc as the release
    built it, translate equals the mapping."""
    import copy

    from simulator.engine_model.backends import BACKEND_SPECS
    from simulator.designs.types import KVWriteLoc as SimKVWriteLoc

    from .runtime import EngineRuntime

    api = load()
    rt = EngineRuntime(api)
    alloc = rt.allocator_factory(256, 192, 1)
    r = RequestSlots(64)
    full = torch.from_numpy(alloc.extend(r, 10))
    twin = copy.deepcopy(rt.design)
    padded = torch.cat([full, torch.zeros(3, dtype=torch.int64)])
    ctx = type("Ctx", (), {"backend": "flashinfer", "num_token_non_padded": 10})()
    swa = twin.translate(padded, alloc.mapping, ctx)
    wl = twin.make_write_loc(full, swa, ctx)
    return {
        "name": rt.design.name,
        "shares_translator": twin.translator is rt.design.translator and twin.api is rt.design.api,
        "swa_ids": {b: twin.backend_spec(BACKEND_SPECS[b]).swa_ids for b in BACKEND_SPECS},
        "translate_equal": bool(torch.equal(swa, alloc.mapping[padded])),
        "write_loc_type": type(wl).__module__ + "." + type(wl).__name__,
        "is_sim_write_loc": isinstance(wl, SimKVWriteLoc),
        "lens": [int(wl.loc.shape[0]), int(wl.swa_loc.shape[0])],
        "describe": rt.describe(),
        "found": {"allocator": alloc.found, "translator": rt.translator.found,
                  "pool": rt.pool_factory(_TwoLayerModel())(alloc.full_rows, alloc.swa_rows).found},
    }


def graph_buffers() -> dict:
    """EngineDesign's graph static-buffer hooks on stale buffers, per (runner, backend): the buffer's
    head and tail after the hook, whose code refreshed it, and whether it equals the model's refresh."""
    from types import SimpleNamespace

    from simulator.designs.base import Design

    from .runtime import EngineRuntime

    rt = EngineRuntime(load())
    design, model = rt.design, Design()
    loc = torch.tensor([7, 9, 11], dtype=torch.int64)
    swa = torch.tensor([3, 4, 5], dtype=torch.int64)
    out: dict = {"describe": design.graph_code.describe()}
    for runner, backend in (("decode", "triton"), ("decode", "flashinfer"), ("draft_decode", "triton"),
                            ("target_verify", "trtllm_mha")):
        ctx = SimpleNamespace(runner=runner, backend=backend, loc_pad=0, swa_pad=0)
        row = {}
        for what, hook, ids in (("loc", "fill_graph_loc_buffer", loc), ("swa", "fill_graph_swa_buffer", swa)):
            before = dict(design.graph_code.calls[what])
            bufs = [torch.full((8,), 99, dtype=torch.int64) for _ in range(2)]
            getattr(design, hook)(bufs[0], ids, 5, ctx)
            getattr(model, hook)(bufs[1], ids, 5, ctx)
            whose = "engine" if design.graph_code.calls[what]["engine"] > before["engine"] else "model"
            row[what] = {"whose": whose, "buffer": bufs[0].tolist(), "equals_model_upto_padded":
                         bool(torch.equal(bufs[0][:5], bufs[1][:5]))}
        out[f"{runner}/{backend}"] = row
    return out


def stores() -> dict:
    """What ``release_store`` says for each device here: the CPU fallback, and for CUDA the clear refusal a
    machine without it gets (the release's ``is_cuda()`` was False at import)."""
    from .errors import EngineError
    from .pool import release_store

    api = load()
    out = {"cpu": release_store(api, torch.device("cpu"))}
    try:
        out["cuda"] = release_store(api, torch.device("cuda"))
    except EngineError as e:
        out["cuda"] = {"error": str(e)}
    return out


class _TwoLayerModel:
    """What EngineRuntime.pool_factory reads of a model: its layers (one SWA, one full) and KV dtype."""

    kv_dtype = "bf16"

    def layers(self):
        from simulator.records import LayerInfo

        return (LayerInfo(0, "swa", 0), LayerInfo(1, "full", 0))


def verdicts(paths: list[str]) -> dict:
    """One release's verdict on each scenario (findings by class, summed over backends) and its features:
    one row of a table across releases (what a bisection prints)."""
    api = load()
    out = {"info": api.info.to_json(), "features": api.features.to_json(), "scenarios": {}}
    for path in paths:
        run = scenario_run(path)
        by_class: dict[str, int] = {}
        for st in run["backends"].values():
            for cls, n in st["findings"].items():
                if n:
                    by_class[cls] = by_class.get(cls, 0) + n
        out["scenarios"][path] = {"findings": by_class, "backends_with_findings": sorted(
            b for b, st in run["backends"].items() if sum(st["findings"].values()))}
    return out
