"""Words for the first divergence: what went wrong, where, and the likely mechanism.

Why: a new user opening a report sees "clobbered, slot 428" and learns nothing. This module turns
the first finding, the batch that produced it (steps.jsonl) and the loc / swa_loc lengths the backend
saw (shapes.jsonl) into a few factual sentences, keyed on the finding class and the batch's mode and
graph path. It states only what the files show; where a mechanism is inferred (e.g. DP padding
as the source of a longer swa_loc) the numbers that support it are quoted with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .data import FindingRecord, Owner, RunData

GRAPH_WORDS = {
    "eager": "run eagerly (no CUDA graph)",
    "decode_graph": "replayed in a decode CUDA graph",
    "piecewise": "run under piecewise CUDA graphs (PCG)",
    "draft_graph": "replayed in the EAGLE draft model's decode CUDA graph",
    "draft_extend_graph": "replayed in the EAGLE draft-extend CUDA graph",
}

CLASS_WORDS = {
    "missed": "a token's row never reached its slot",
    "clobbered": "a live slot was overwritten by another row",
    "padding_slot": "a real token's row went to the reserved padding slot",
    "evicted_slot": "a row landed in a slot that holds no live token",
    "out_of_range": "an index outside the pool reached the store",
    "length_mismatch": "loc and swa_loc lengths disagreed; the store refused the write",
    "design_error": "a design hook raised, or returned an index no kernel would take; that write was skipped",
    "torn_write": "the layers of one token wrote different slots (a mapping change between its layers)",
    "stale_read": "attention read a slot that does not hold the token's rows (freed, reassigned or the sink)",
}


@dataclass(frozen=True)
class Fact:
    """One labelled line of the divergence box; ``code`` shows the value as code (kernel text)."""

    label: str
    value: str
    code: bool = False


@dataclass(frozen=True)
class Divergence:
    """The first divergence of a run, with the facts and the explanation in words."""

    headline: str
    facts: tuple[Fact, ...]
    why: tuple[str, ...]
    step: int
    backend: str
    layer: int
    cls: str


def _owner(o: Optional[Owner], none: str) -> str:
    return none if o is None else o.label


def _pool(kind: str) -> str:
    return {"swa": "SWA pool", "full": "full pool"}.get(kind, f"{kind} pool")


def earliest_finding(run: RunData) -> tuple[Optional[FindingRecord], Optional[tuple[str, int, int, str]]]:
    """The earliest finding by step (then backend order of the summary) and its summary entry (backend, step,
    layer, class): where first_divergence and the overlap timeline (timeline.py) both start."""
    order = {b.name: i for i, b in enumerate(run.backends)}
    firsts = [(b.first.step, order[b.name], b.name, b.first) for b in run.backends if b.first is not None]
    if firsts:
        step, _, name, ff = min(firsts, key=lambda t: (t[0], t[1]))
        for rec in run.findings:
            if rec.backend == name and rec.step == step and rec.layer == ff.layer and rec.cls == ff.cls:
                return rec, (name, step, ff.layer, ff.cls)
        for rec in run.findings:
            if rec.backend == name and rec.step == step:
                return rec, (name, step, ff.layer, ff.cls)
        return None, (name, step, ff.layer, ff.cls)
    if run.findings:
        rec = min(run.findings, key=lambda r: (r.step, order.get(r.backend, len(order))))
        return rec, (rec.backend, rec.step, rec.layer, rec.cls)
    return None, None


def _batch_words(run: RunData, step: int) -> tuple[str, Optional[dict[str, object]]]:
    i = run.steps.index_of(step)
    if i is None:
        return "not in steps.jsonl", None
    st = run.steps
    b = {"mode": st.mode[i], "graph": st.graph[i], "requests": int(st.num_requests[i]),
         "real": int(st.real_tokens[i]), "dp": int(st.dp_padded_tokens[i]), "padded": int(st.padded_tokens[i])}
    text = (f"{b['mode']} batch, {GRAPH_WORDS.get(str(b['graph']), str(b['graph']))}: {b['requests']} request(s), "
            f"{b['real']} real token(s)")
    if b["dp"] != b["real"]:
        text += f", DP-padded to {b['dp']}"
    if b["padded"] != b["dp"]:
        text += f", graph-padded to {b['padded']}"
    return text, b


def _lengths(run: RunData, backend: str, step: int) -> dict[str, tuple[int, int]]:
    out = {}
    for kind in ("swa", "full"):
        s = run.shape(backend, kind)
        if s is not None:
            at = s.at(step)
            if at is not None:
                out[kind] = at
    return out


def _length_words(lengths: dict[str, tuple[int, int]]) -> str:
    parts = []
    for kind, (loc, swa) in lengths.items():
        name = "SWA layers" if kind == "swa" else "full layers"
        parts.append(f"{name}: loc {loc}, swa_loc {'none' if swa < 0 else swa}")
    return "; ".join(parts) if parts else "not recorded (no shapes.jsonl entry)"


def _why_length(rec: Optional[FindingRecord], lengths: dict[str, tuple[int, int]],
                batch: Optional[dict[str, object]]) -> list[str]:
    out = []
    loc, swa = lengths.get("swa", (-1, -1))
    if loc >= 0 and swa >= 0 and swa > loc:
        head = f"swa_loc has {swa} entries but loc has {loc}"
        if batch and batch["graph"] == "piecewise" and batch["dp"] == swa and batch["real"] == loc:
            out.append(f"{head}: the backend's metadata was built from the DP-padded out_cache_loc ({swa} "
                       f"entries), and the layer narrowed loc (and K, V) to the {loc} real tokens under the "
                       "piecewise CUDA graph. Nothing narrowed swa_loc. This is the pattern of SGLang bug B1 "
                       "(#29460).")
        elif batch and batch["graph"] == "piecewise" and batch["real"] == loc:
            out.append(f"{head}: the metadata's swa_loc was computed from a padded out_cache_loc ({swa} "
                       f"entries), while the layer narrowed loc to the {loc} real tokens of the piecewise "
                       "CUDA graph batch; nothing narrowed swa_loc.")
        else:
            out.append(f"{head}: swa_loc was translated from a longer out_cache_loc than the one this layer "
                       "writes with.")
    elif loc >= 0 and swa >= 0 and swa < loc:
        out.append(f"swa_loc has {swa} entries but loc has {loc}: swa_loc is shorter than loc. Keeping the first "
                   "len(loc) entries of swa_loc (the #29460 fix) only repairs a longer swa_loc; a shorter one "
                   "passes through unchanged.")
    msg = rec.message if rec is not None and rec.message else ""
    if msg:
        out.append(f"The store checks that K, V and the index tensor have the same length, and raised: "
                   f"\u201c{msg}\u201d. Nothing was written by this layer.")
    else:
        out.append("The store checks that K, V and the index tensor have the same length and raised before "
                   "writing; nothing was written by this layer.")
    return out


def _why(rec: Optional[FindingRecord], cls: str, kind: str, batch: Optional[dict[str, object]],
         lengths: dict[str, tuple[int, int]]) -> list[str]:
    if cls == "length_mismatch":
        return _why_length(rec, lengths, batch)
    if rec is None:
        return [f"{cls}: {CLASS_WORDS.get(cls, 'see the findings table')}. The detailed record of this finding "
                "is not in findings.jsonl (detail truncated or file missing)."]
    pool, slot = _pool(kind), rec.slot
    exp, obs = _owner(rec.expected, "nobody"), _owner(rec.observed, "nothing")
    graph = batch["graph"] if batch else None
    padding = rec.observed is not None and rec.observed.is_padding
    if cls == "clobbered":
        if padding and graph == "decode_graph" and batch:
            pad = int(batch["padded"]) - int(batch["real"])  # type: ignore[call-overload]
            return [f"A padding row of the decode graph wrote into a live slot of the {pool}: slot {slot} of "
                    f"{exp}.",
                    f"The batch had {batch['real']} real token(s) and replayed the graph captured for "
                    f"{batch['padded']}, so {pad} row(s) were padding. Padding rows should write to the reserved "
                    f"slot 0; this one carried a {'swa_loc' if kind == 'swa' else 'loc'} entry pointing at a live "
                    "slot (stale values left from an earlier replay fit this: SGLang bug B2, #24743).",
                    "No error is raised: the token's K/V is silently replaced, and every later attention read of "
                    "it sees garbage."]
        if padding:
            return [f"A padding row wrote into a live slot of the {pool}: slot {slot} of {exp}. A padded token's "
                    "location should be the reserved slot 0. No error is raised: silent corruption."]
        return [f"The row of {obs} was written into slot {slot} of the {pool}, which belongs to {exp}: two tokens "
                "were given the same slot (a wrong translation or stale locations). No error is raised."]
    if cls == "evicted_slot":
        who = "A padding row" + (" of the decode graph" if graph == "decode_graph" else "") if padding \
            else f"The row of {obs}"
        return [f"{who} landed in slot {slot} of the {pool}, which holds no live token: its token left the "
                "sliding window and the slot was freed, or it was never allocated.",
                "No live token is damaged by this write, but it writes through a location the allocator no "
                "longer owns; once the slot is reused the same write would clobber a live token."]
    if cls == "padding_slot":
        return [f"The row of {exp if rec.expected else obs} went to the reserved padding slot instead of its own "
                f"(slot {slot} of the {pool}; observed there: {obs}): its write location was the padding value, so the "
                f"token's K/V is missing from the {pool}."
                + (f" The checker: \u201c{rec.message}\u201d." if rec.message else "")]
    if cls == "missed":
        return [f"Slot {slot} of the {pool} should hold {exp} after this step but holds {obs}: that token's "
                "write never reached its slot (skipped, or sent somewhere else)."]
    if cls == "design_error":
        what = f": \u201c{rec.message}\u201d" if rec.message else ""
        return [f"The design under test failed at this boundary{what}.",
                "The write it should have located was skipped; the reference pool still expects it, so later "
                "findings on this backend may follow from it. Fix the design's hook and run again."]
    if cls == "out_of_range":
        tail = f" ({rec.message})" if rec.message else ""
        return [f"An index outside the {pool}'s rows reached the store{tail}. slotscope catches it before the "
                "write; on a GPU the kernel's bounds assert would have failed and killed the CUDA context."]
    tail = f": {rec.message}" if rec.message else ""
    return [f"Finding class {cls!r}{tail}."]


def first_divergence(run: RunData) -> Optional[Divergence]:
    """The earliest finding of the run explained, or None for a clean run."""
    rec, entry = earliest_finding(run)
    if entry is None:
        return None
    backend, step, layer, cls = entry
    kind = rec.kind if rec is not None else (run.layer_kind(layer) or "?")
    batch_text, batch = _batch_words(run, step)
    lengths = _lengths(run, backend, step)
    facts = [
        Fact("Step", f"{step} \u2014 {batch_text}"),
        Fact("Backend", backend),
        Fact("Layer", f"{layer} ({kind} layer, writes the {_pool(kind)})" if layer >= 0
             else "none (before any layer: the backend's metadata)"),
        Fact("Class", f"{cls}: {CLASS_WORDS.get(cls, 'unknown class')}"),
    ]
    if rec is not None:
        facts.append(Fact("Slot", "none (nothing was written)" if rec.slot < 0 else f"{rec.slot} in the {_pool(kind)}"))
        facts.append(Fact("Expected owner", _owner(rec.expected, "nobody (no live token)")))
        facts.append(Fact("Observed owner", _owner(rec.observed, "\u2014")))
    facts.append(Fact("loc / swa_loc lengths", f"at step {step} on {backend}: {_length_words(lengths)}"))
    if rec is not None and rec.message and cls in ("length_mismatch", "out_of_range"):
        facts.append(Fact("Kernel message", rec.message, code=True))
    if rec is not None and rec.message and cls == "design_error":
        facts.append(Fact("Design error", rec.message, code=True))
    same = [b.name for b in run.backends if b.first is not None and b.name != backend
            and (b.first.step, b.first.layer, b.first.cls) == (step, layer, cls)]
    clean = [b.name for b in run.backends if b.clean]
    if same or clean:
        parts = []
        if same:
            parts.append(f"same first divergence on {len(same)} other backend(s): {', '.join(same)}")
        if clean:
            label = "clean" if run.complete else "no findings in the steps that ran (the run did not finish)"
            parts.append(f"{label}: {', '.join(clean)}")
        facts.append(Fact("Other backends", "; ".join(parts)))
    where = f"layer {layer} ({kind})" if layer >= 0 else "metadata"
    headline = f"First divergence: step {step}, {backend}, {where} \u2014 {cls}"
    return Divergence(headline, tuple(facts), tuple(_why(rec, cls, kind, batch, lengths)), step, backend, layer, cls)


def _steps_done(run: RunData) -> str:
    inc = run.incomplete
    n = inc.steps_done if inc is not None and inc.steps_done is not None else run.num_steps
    return f"{n:,} step(s)"


def incomplete_sentence(run: RunData) -> Optional[str]:
    """The banner of a run that did not finish (None for a complete run): why, and how far it got."""
    inc = run.incomplete
    if inc is None:
        return None
    limit = f" (max_steps {inc.max_steps:,})" if inc.max_steps is not None else ""
    return (f"Incomplete run: {inc.message}. {_steps_done(run)} done{limit}. Everything below covers only "
            "those steps: this is not a clean verdict.")


def batches_clause(engine: dict) -> str:
    """Whose scheduler made an engine run's batches, as the verdict says it (engine["scheduler"]: release | model);
    "" where the run does not say."""
    return {"release": "; its own scheduler made the batches",
            "model": "; slotscope's model of its scheduler made the batches"}.get(engine.get("scheduler"), "")


def verdict_subject(run: RunData) -> str:
    """What an engine run's verdict is about: the release (and its patches), the scenario's design it replaced, and
    whose scheduler made the batches; "" for a model run (its design is the page's subject)."""
    label = run.provenance.engine_label
    if not label:
        return ""
    engine = run.provenance.engine or {}
    replaced = engine.get("replaces_design")
    return (f"About {label}'s own code" + (f", run instead of the scenario's design {replaced}" if replaced else "")
            + batches_clause(engine) + ". ")


def verdict_sentence(run: RunData) -> str:
    """One plain sentence for the top of the page. "Clean" only for a complete run without findings; an engine
    run's names the release it is about (:func:`verdict_subject`)."""
    return verdict_subject(run) + _verdict(run)


def _verdict(run: RunData) -> str:
    n = len(run.backends)
    if run.clean:
        writes = sum(b.writes or 0 for b in run.backends)
        return (f"Clean: on all {n} backend(s), every one of {writes:,} checked writes went to the slot the "
                f"reference pool expects, over {run.num_steps:,} steps.")
    bad = [b for b in run.backends if not b.clean]
    if not bad and run.findings_total == 0:
        return (f"No verdict: no findings on {n} backend(s) in the {_steps_done(run)} that ran, but the run did "
                "not finish, so nothing shows it is clean.")
    totals = run.class_totals()
    classes = ", ".join(f"{c} {totals[c]:,}" for c in run.classes if totals.get(c))
    tail = "" if run.complete else f", in the {_steps_done(run)} that ran before the run stopped"
    return (f"Not clean: {len(bad)} of {n} backend(s) diverge from the reference pool, "
            f"{run.findings_total:,} finding(s) in all ({classes}){tail}.")
