"""Pinned results: exact finding counts and first findings of every shipped bug scenario and corpus case.

Every case of the known-bug corpus (scenarios/corpus.toml, run by ``slotscope bugs``) under the design that had
the bug and the one that fixed it, and the shipped path scenarios under their own (fixed) design and under a
design that had a known bug, on all eight backends. Per backend the pin is (writes, the finding classes that
are non-zero with their counts, the first finding as (step, layer, class)); a class missing from a pin must be
zero (classes added later, e.g. ``design_error``, included). A silent drift in the scheduler, the allocator,
a backend or the checker changes these numbers and fails here: check the new numbers by hand (the comments say
how each one follows from its scenario), then update the pin in the same commit as the change.

The bug scenarios (b1-..., b2-..., b3-..., b4-..., gap-...) are pinned through their corpus cases: each one's
declared design is its case's ``buggy`` design, so the case runs it under its own design and under the fix.
"""
from __future__ import annotations

import pytest

from simulator.scenario import BACKENDS, load_scenario
from slotscope.corpus import load_corpus, run_case
from slotscope.pipeline import RunOptions, run_scenario

from helpers import ROOT


def pinned(design: str, steps: int, every: tuple, **per_backend: tuple) -> dict:
    """The pin of one run: its design, its step count, and per backend (writes, {class: count}, first)."""
    return {"design": design, "steps": steps, "backends": {b: per_backend.get(b, every) for b in BACKENDS}}


def observed(summary: dict) -> dict:
    backends = {}
    for b, s in summary["backends"].items():
        ff = s["first_finding"]
        backends[b] = (s["writes"], {c: n for c, n in s["findings"].items() if n},
                       None if ff is None else (ff["step"], ff["layer"], ff["class"]))
    return {"design": summary["design"], "steps": summary["steps"], "backends": backends}


#: F1 (flashinfer) and F2 (aiter) in P6's runs, P6 (xpu) and F2 in F1's, P6 in F2's: all live in 0.5.23
F1_P6 = (138, {"stale_read": 1120}, (9, 0, "stale_read"))
F2_P6 = (138, {"stale_read": 355}, (7, 4, "stale_read"))
F2_F1 = (142, {"stale_read": 342}, (14, 4, "stale_read"))
P6_F2 = (100, {"missed": 47, "clobbered": 12, "evicted_slot": 20}, (10, 5, "evicted_slot"))
P6_F2_P16 = (100, {"missed": 36, "clobbered": 12, "evicted_slot": 20}, (10, 5, "evicted_slot"))
P6_F1 = (142, {"missed": 66, "clobbered": 15, "evicted_slot": 32}, (14, 5, "evicted_slot"))
P6_F1_P16 = (142, {"missed": 32, "clobbered": 15, "evicted_slot": 32}, (14, 5, "evicted_slot"))

# How the numbers follow from the scenarios (L = layers, S = SWA layers; writes = one per layer per forward):
#  B1      gpt-oss-120b, L 36 / S 18, 9 forwards: writes 36 x 9 = 324; one DP-padded piecewise batch (step 1)
#          -> one length_mismatch per SWA layer = 18, first at SWA layer 0, on every backend (none slices its
#          own swa_loc in a release: 0.5.14's trtllm_mha neither).
#  B1/p16  the same schedule on pages of 16: the same counts.
#  B2      gpt-oss-20b, L 24 / S 12, 61 forwards: 1464 writes; every stale tail row is counted once per SWA layer
#          (360 = 12 x 30 clobbered live slots, 264 = 12 x 22 freed ones), backend-independent; skip-1 has the
#          same stale SWA indices (its -1 sits in loc only); the dummy request leaves no tail: clean.
#  B2/p16  the same schedule, and the same stale rows, on pages of 16: the same counts.
#  gap     gpt-oss-20b, 5 forwards: 120 writes; one unshrunk piecewise batch -> 12 length_mismatch, every backend.
#  B3      SFSF + draft F: 23 extend and 10 verify target forwards x 4 layers + 63 draft forwards x 1 = 195;
#          out_of_range only at the draft layer (global id 4).
#  B4      SFSF + draft FS: (27 + 10) x 4 + 67 x 2 = 282; only triton, first at the draft's SWA layer (id 5).
#  reads   (stale_read, one per (forward, request, position) read wrongly; a kind's layers share one table)
#          B3, paths-spec(-paged) under pre-17630: the draft's layers read the target's indices in its smaller
#          pools: every read past the draft pool's end is "outside the pool" (#17630's out-of-bounds, read side).
#          B4, paths-spec under post-29460, triton only: without window indices the draft-extend graph's SWA
#          layer reads the whole prefix through full-pool ids in the SWA pool: outside the pool (the
#          illegal memory access of #29858), freed, evicted or another token's slots. Correct runs read clean.
#  W7      aiter: its store kernel maps each SWA slot at its own layer (0.5.23's launch_reshape_and_cache_flash with
#          the live mapping), so a scheduler write landing between layers tears its writes: more padding_slot and
#          torn_write without the barrier; with it (W7's fix) clean, as ROCm's decode graphs publish their
#          read-done only after the replay (HIP graphs have no in-graph marker).
#  P6      SFSF + draft FS, 12 EAGLE rounds (0.5.23: 2 draft steps, a verify, a draft extend over the window each):
#          (3 extends + 12 verifies) x 4 + (3 + 12 draft extends + 24 draft steps) x 2 = 138 writes; xpu only, at
#          the draft's SWA layer (global id 5): each step writes at the first SWA ids of the round's window.
#  P6/p16  the same schedule on pages of 16: the same writes, clobbered and evicted_slot counts, 46 missed.
#          Both P6 runs: flashinfer's F1 (live in 0.5.23: the verify's SWA table holds the request's first slots):
#          one stale_read per position of the verify's window span (32 + 4 - 1 = 35) per (verify, request past its
#          window), 32 of them: 1120, first at the first such verify's SWA layer 0.
#  F1      SFSF + draft FS, eager, 7 extends and 10 rounds: (7 + 10 verifies) x 4 + (7 + 10 draft extends + 20
#          draft steps) x 2 = 142 writes; flashinfer 35 x 38 (verify, request past its window) = 1330 stale_read
#          (the draft extend is eager: a plain extend's table, clean); xpu's P6 in both runs (it is 0.5.23's too).
#          F1/p16: the same, xpu 32 missed on pages. P6's and F1's runs: aiter's F2 at the draft steps (P6 355,
#          F1 342), live in 0.5.23 too.
#  F2      SFSF + draft FS (window 128: every request inside it), eager, 5 extends and 7 rounds: (5 + 7 verifies)
#          x 4 + (5 + 7 draft extends + 14 draft steps) x 2 = 100 writes; aiter's draft step i reads the committed
#          keys only: i + 1 positions left out of its full table and i + 1 of its SWA window, per request: 2 + 4 = 6
#          a (request, round) over its two steps, 27 of them = 162; xpu's P6 in both runs. F2/p16: the same, xpu 36
#          missed on pages.
#  smoke   16 layers / S 8, 34 forwards: 544 writes; under pre-29460 4 DP-padded piecewise MIXED batches x 8
#          SWA layers = 32 length_mismatch, every backend.
#  paths-paged      4 layers x 57 = 228; B2's stale tail: 7 rows x 2 SWA layers = 14, each on an SWA slot
#                   evicted out of its owner's window (evicted_slot).
#  paths-spec       36 target forwards x 4 + 111 draft forwards x 2 = 366; B4 on triton only, first at the
#                   draft's SWA layer (id 5); B3's undersized pools: out_of_range from the draft's SWA layer on.
#  paths-spec-paged 40 target forwards x 4 + 103 draft forwards x 2 = 366; B3: the draft's full pool has
#                   256 + 16 rows and position p sits in slot 16 + p, so the prefill chunk over positions
#                   256..319 (its draft extend is step 9) is the first out of range, at the draft's full layer (id 4).
#  paths-noshrink   4 layers x 28 = 112; under post-29460 (the gap) 5 piecewise batches x 2 SWA layers = 10.
#  paths-big-pool   2 layers x 14 = 28; B2's stale tail: steps 6-8 replay 3 rows in capture size 4, one stale row
#                   each x 1 SWA layer = 3 clobbered.
#  U1      gemma4-31b, 6 layers (1 full, 5 SWA); SWA pages cost 5x full ones, so the SWA table of the buggy pool has
#          615 entries (614 pages and the sentinel) while the full side mints virtual pages 5 .. 3,073 (its first
#          four pages are the sink floor): 28 forwards x 6 = 168 writes, then the bind of virtual page 615 is the
#          device-side assert: one out_of_range per backend. Fixed: 66 x 6 = 396.
#  U2      gpt-oss-20b, 4 layers, 180 forwards: 720 writes; flashattention and musa translate each request's whole
#          row into their SWA page table: under U2 a tombstoned page is -1 in 89 (forward, request) pairs, from
#          step 49; the other backends translate the window only.
#  U1/p16  pages of 16: the SWA table has 39 entries (38 pages), the full side 194 pages (ids from 5); 31 forwards
#          x 6 = 186, then the bind of virtual page 39 (token 624). Fixed: 73 x 6 = 438.
#  U2/p16  pages of 16: 197 forwards x 4 = 788; 104 (forward, request) pairs meet a tombstoned page, from step 49.
#  R2, R7 2 layers (SF), 31 forwards: 62 writes. R2: request 0 (A) reads its prefix's full slots [53, 70), freed by
#          B's locked recovery in the result group after step 0, at its full layer in each of its 30 decodes:
#          17 x 30 = 510 stale_read from step 1. R7: B (request 1) reads the node's window through the mapping the
#          flush cleared (slot 0) in its decodes, steps 1..6 (15, 14, .., 10 positions as its window slides): 75.
#  R3      2 layers, 85 forwards (170 writes, the run's end: no over-free on this schedule); 5359 stale_read of
#          SWA slots the stale mapping freed and handed out again, first request 9's position 104 at step 28.
#          Fixed: 104 x 2 = 208.
#  R8      2 layers, page 16, 94 forwards (188 writes); the sink page handed to request 12 at step 45, then to
#          others: 9042 stale_read on slots 0..15 (the sink is no token's, even where it holds the reader's own
#          token: 573 of them). Fixed (the filter): 121 x 2 = 242.
#  A1, A2  a PD decode node (2 layers: S F, draft F; EAGLE 4 tokens), page 16, 48 requests: a write per layer per
#          forward (target verify 2, draft decode / extend 1 each); every backend the same (the allocator's bugs):
#          the SWA page freed under a live request is handed to another, whose tags the first one then reads
#          (stale_read); the buggy runs stop at the over-free (A1 step 330, A2 step 390).
#  P7      paths-spec's schedule (366 writes); the pre-planned speculative forwards under DP padding: 10
#          length_mismatch at the draft's SWA layer (id 5), first at step 4.
PINNED_CORPUS = {
    ("B1", "buggy"): pinned("sglang-pre-29460", steps=9,
        every=(324, {"length_mismatch": 18}, (1, 0, "length_mismatch"))),
    ("B1", "fixed"): pinned("sglang-post-29460", steps=9,
        every=(324, {}, None)),
    ("B1/p16", "buggy"): pinned("sglang-pre-29460", steps=9,
        every=(324, {"length_mismatch": 18}, (1, 0, "length_mismatch"))),
    ("B1/p16", "fixed"): pinned("sglang-post-29460", steps=9,
        every=(324, {}, None)),
    ("B2", "buggy"): pinned("sglang-pre-24743", steps=61,
        every=(1464, {"clobbered": 360, "evicted_slot": 264}, (7, 0, "clobbered"))),
    ("B2", "fixed"): pinned("sglang-post-29460", steps=61,
        every=(1464, {}, None)),
    ("B2/skip-1", "buggy"): pinned("sglang-skip-minus-1-pre-24743", steps=61,
        every=(1464, {"clobbered": 360, "evicted_slot": 264}, (7, 0, "clobbered"))),
    ("B2/skip-1", "fixed"): pinned("sglang-skip-minus-1", steps=61,
        every=(1464, {}, None)),
    ("B2/dummy", "buggy"): pinned("mini-sglang-dummy-pre-24743", steps=61,
        every=(1464, {}, None)),
    ("B2/dummy", "fixed"): pinned("mini-sglang-dummy", steps=61,
        every=(1464, {}, None)),
    ("B2/p16", "buggy"): pinned("sglang-pre-24743", steps=61,
        every=(1464, {"clobbered": 360, "evicted_slot": 264}, (7, 0, "clobbered"))),
    ("B2/p16", "fixed"): pinned("sglang-post-29460", steps=61,
        every=(1464, {}, None)),
    ("gap", "buggy"): pinned("sglang-post-29460", steps=5,
        every=(120, {"length_mismatch": 12}, (0, 0, "length_mismatch"))),
    ("gap", "fixed"): pinned("kvwriteloc-strict", steps=5,
        every=(120, {}, None)),
    ("B3", "buggy"): pinned("sglang-pre-17630", steps=96,
        every=(195, {"stale_read": 14475, "out_of_range": 526}, (33, 4, "out_of_range"))),
    ("B3", "fixed"): pinned("sglang-post-29460", steps=96,
        every=(195, {}, None)),
    ("B4", "buggy"): pinned("sglang-post-29460", steps=104,
        every=(282, {}, None),
        triton=(282, {"missed": 12, "clobbered": 2, "evicted_slot": 10, "stale_read": 9790, "out_of_range": 49},
                (58, 5, "out_of_range"))),
    ("B4", "fixed"): pinned("sglang-pr-29858", steps=104,
        every=(282, {}, None)),
    # The W-series (engine.overlap = true; docs/OVERLAP.md): L 4 (W5: 8) layers, writes = L x forwards on every
    # backend. The counts are where the seed's landing stream (simulator.scheduling.timeline.landing_rng) put a mapping clear
    # before metadata init (W1, W2, W7: the token's SWA write to slot 0, 2 or 4 padding_slot, one per SWA layer;
    # its window reads through the cleared entry, stale_read) or between trtllm_mha's SWA layers (W5: the late
    # layers' writes to slot 0, padding_slot, and the token's layers disagreeing, torn_write). The fixes: clean.
    ("W1", "buggy"): pinned("sglang-pre-26380", steps=130,
        every=(520, {"padding_slot": 2, "stale_read": 59}, (28, 0, "padding_slot"))),
    ("W1", "fixed"): pinned("sglang-post-33587", steps=130,
        every=(520, {}, None)),
    ("W2", "buggy"): pinned("sglang-pre-31687", steps=27,
        every=(108, {"padding_slot": 2, "stale_read": 44}, (21, 0, "padding_slot"))),
    ("W2", "fixed"): pinned("sglang-post-33587", steps=27,
        every=(108, {}, None)),
    ("W5", "buggy"): pinned("sglang-pre-33587", steps=95,
        every=(760, {}, None),
        trtllm_mha=(760, {"padding_slot": 25, "torn_write": 9}, (14, 6, "torn_write"))),
    ("W5", "fixed"): pinned("sglang-post-33587", steps=95,
        every=(760, {}, None)),
    ("W7", "buggy"): pinned("sglang-0.5.23", steps=31,
        every=(124, {"padding_slot": 4, "stale_read": 107}, (13, 0, "padding_slot")),
        aiter=(124, {"padding_slot": 25, "torn_write": 5, "stale_read": 107}, (10, 0, "padding_slot"))),
    ("W7", "fixed"): pinned("sglang-0.5.23-war-barrier", steps=31,
        every=(124, {}, None)),
    ("R2", "buggy"): pinned("radix-r2", steps=31,
        every=(62, {"stale_read": 510}, (1, 1, "stale_read"))),
    ("R2", "fixed"): pinned("radix-fixed", steps=31,
        every=(62, {}, None)),
    ("R3", "buggy"): pinned("radix-r3", steps=85,
        every=(170, {"stale_read": 5359}, (28, 0, "stale_read"))),
    ("R3", "fixed"): pinned("radix-fixed", steps=104,
        every=(208, {}, None)),
    ("R7", "buggy"): pinned("radix-r7", steps=31,
        every=(62, {"stale_read": 75}, (1, 0, "stale_read"))),
    ("R7", "fixed"): pinned("radix-fixed", steps=31,
        every=(62, {}, None)),
    ("R8", "buggy"): pinned("sglang-0.5.23", steps=94,
        every=(188, {"stale_read": 9042}, (45, 0, "stale_read"))),
    ("R8", "fixed"): pinned("radix-fixed", steps=121,
        every=(242, {}, None)),
    ("A1", "buggy"): pinned("pd-decode-pre-25805", steps=330,
        every=(396, {"stale_read": 373}, (198, 0, "stale_read"))),
    ("A1", "fixed"): pinned("pd-decode-pre-25805-post-27779", steps=395,
        every=(474, {}, None)),
    ("A2", "buggy"): pinned("pd-decode-pre-25805", steps=390,
        every=(468, {"stale_read": 400}, (83, 0, "stale_read"))),
    ("A2", "fixed"): pinned("pd-decode-post-25805", steps=405,
        every=(486, {}, None)),
    ("P7", "buggy"): pinned("dots-eagle-preplan", steps=147,
        every=(366, {"length_mismatch": 10}, (4, 5, "length_mismatch"))),
    ("P7", "fixed"): pinned("dots-eagle-preplan-rebuild", steps=147,
        every=(366, {}, None)),
    ("P6", "buggy"): pinned("sglang-0.5.23", steps=54, every=(138, {}, None), flashinfer=F1_P6, aiter=F2_P6,
        xpu=(138, {"missed": 74, "clobbered": 16, "evicted_slot": 40}, (7, 5, "evicted_slot"))),
    ("P6", "fixed"): pinned("sglang-0.5.23-draft-step-swa", steps=54, every=(138, {}, None), flashinfer=F1_P6,
        aiter=F2_P6),
    ("P6/p16", "buggy"): pinned("sglang-0.5.23", steps=54, every=(138, {}, None), flashinfer=F1_P6, aiter=F2_P6,
        xpu=(138, {"missed": 46, "clobbered": 16, "evicted_slot": 40}, (7, 5, "evicted_slot"))),
    ("P6/p16", "fixed"): pinned("sglang-0.5.23-draft-step-swa", steps=54, every=(138, {}, None), flashinfer=F1_P6,
        aiter=F2_P6),
    ("F1", "buggy"): pinned("sglang-0.5.23", steps=54, every=(142, {}, None), xpu=P6_F1, aiter=F2_F1,
        flashinfer=(142, {"stale_read": 1330}, (16, 0, "stale_read"))),
    ("F1", "fixed"): pinned("sglang-0.5.23-round-swa-start", steps=54, every=(142, {}, None), xpu=P6_F1, aiter=F2_F1),
    ("F1/p16", "buggy"): pinned("sglang-0.5.23", steps=54, every=(142, {}, None), xpu=P6_F1_P16, aiter=F2_F1,
        flashinfer=(142, {"stale_read": 1330}, (16, 0, "stale_read"))),
    ("F1/p16", "fixed"): pinned("sglang-0.5.23-round-swa-start", steps=54, every=(142, {}, None), xpu=P6_F1_P16,
        aiter=F2_F1),
    ("F2", "buggy"): pinned("sglang-0.5.23", steps=38, every=(100, {}, None), xpu=P6_F2,
        aiter=(100, {"stale_read": 162}, (10, 4, "stale_read"))),
    ("F2", "fixed"): pinned("sglang-0.5.23-draft-step-keys", steps=38, every=(100, {}, None), xpu=P6_F2),
    ("F2/p16", "buggy"): pinned("sglang-0.5.23", steps=38, every=(100, {}, None), xpu=P6_F2_P16,
        aiter=(100, {"stale_read": 162}, (10, 4, "stale_read"))),
    ("F2/p16", "fixed"): pinned("sglang-0.5.23-draft-step-keys", steps=38, every=(100, {}, None), xpu=P6_F2_P16),
    ("U1", "buggy"): pinned("sglang-unified-pre-37560", steps=28,
        every=(168, {"out_of_range": 1}, (28, -1, "out_of_range"))),
    ("U1", "fixed"): pinned("sglang-0.5.23-unified", steps=66,
        every=(396, {}, None)),
    ("U2", "buggy"): pinned("sglang-unified-pre-35933", steps=180,
        every=(720, {}, None),
        flashattention=(720, {"out_of_range": 89}, (49, -1, "out_of_range")),
        musa=(720, {"out_of_range": 89}, (49, -1, "out_of_range"))),
    ("U2", "fixed"): pinned("sglang-0.5.23-unified", steps=180,
        every=(720, {}, None)),
    ("U1/p16", "buggy"): pinned("sglang-unified-pre-37560", steps=31,
        every=(186, {"out_of_range": 1}, (31, -1, "out_of_range"))),
    ("U1/p16", "fixed"): pinned("sglang-0.5.23-unified", steps=73,
        every=(438, {}, None)),
    ("U2/p16", "buggy"): pinned("sglang-unified-pre-35933", steps=197,
        every=(788, {}, None),
        flashattention=(788, {"out_of_range": 104}, (49, -1, "out_of_range")),
        musa=(788, {"out_of_range": 104}, (49, -1, "out_of_range"))),
    ("U2/p16", "fixed"): pinned("sglang-0.5.23-unified", steps=197,
        every=(788, {}, None)),
}

#: shipped path scenarios: (scenario, design or "own") -> pin
PINNED_SCENARIOS = {
    ("smoke", "own"): pinned("sglang-post-29460", steps=34,
        every=(544, {}, None)),
    ("smoke", "sglang-pre-29460"): pinned("sglang-pre-29460", steps=34,
        every=(544, {"length_mismatch": 32}, (5, 0, "length_mismatch"))),
    ("paths-paged", "own"): pinned("sglang-post-29460", steps=57,
        every=(228, {}, None)),
    ("paths-paged", "sglang-pre-24743"): pinned("sglang-pre-24743", steps=57,
        every=(228, {"evicted_slot": 14}, (36, 0, "evicted_slot"))),
    ("paths-spec", "own"): pinned("sglang-pr-29858", steps=147,
        every=(366, {}, None)),
    ("paths-spec", "sglang-post-29460"): pinned("sglang-post-29460", steps=147,
        every=(366, {}, None),
        triton=(366, {"missed": 65, "evicted_slot": 72, "stale_read": 8200, "out_of_range": 13}, (37, 5, "missed"))),
    ("paths-spec", "sglang-pre-17630"): pinned("sglang-pre-17630", steps=147,
        every=(366, {"stale_read": 6934, "out_of_range": 836}, (6, 5, "out_of_range"))),
    ("paths-spec-paged", "own"): pinned("sglang-pr-29858", steps=143,
        every=(366, {}, None)),
    ("paths-spec-paged", "sglang-pre-17630"): pinned("sglang-pre-17630", steps=143,
        every=(366, {"stale_read": 13234, "out_of_range": 881}, (9, 4, "out_of_range"))),
    ("paths-noshrink", "own"): pinned("kvwriteloc-strict", steps=28,
        every=(112, {}, None)),
    ("paths-noshrink", "sglang-post-29460"): pinned("sglang-post-29460", steps=28,
        every=(112, {"length_mismatch": 10}, (1, 0, "length_mismatch"))),
    ("paths-big-pool", "own"): pinned("sglang-post-29460", steps=14,
        every=(28, {}, None)),
    ("paths-big-pool", "sglang-pre-24743"): pinned("sglang-pre-24743", steps=14,
        every=(28, {"clobbered": 3}, (6, 0, "clobbered"))),
}

BUG_SCENARIOS = sorted(p.stem for p in (ROOT / "scenarios").glob("*.toml")
                       if p.stem.startswith(("b1-", "b2-", "b3-", "b4-", "b5-", "b6-", "gap-", "w1-", "w2-", "w5-", "w7-", "u1-", "u2-",
                                             "r2-", "r3-", "r7-", "r8-", "p7-", "a1-", "a2-")))
PATH_SCENARIOS = sorted(p.stem for p in (ROOT / "scenarios").glob("*.toml") if p.stem.startswith(("paths-", "smoke")))


def test_every_corpus_case_is_pinned_under_both_designs():
    assert sorted(PINNED_CORPUS) == sorted((c.id, role) for c in load_corpus() for role in ("buggy", "fixed"))


def test_every_bug_scenario_is_a_corpus_case_under_its_own_design():
    plain = {(c.scenario.stem, c.buggy) for c in load_corpus() if not c.overrides}
    assert len(BUG_SCENARIOS) >= 5
    for name in BUG_SCENARIOS:
        own = load_scenario(ROOT / "scenarios" / f"{name}.toml").design
        assert (name, own) in plain, f"{name} under {own} has no corpus case: add one (and its pin)"


def test_every_path_scenario_is_pinned_under_its_own_design():
    assert sorted(n for n, d in PINNED_SCENARIOS if d == "own") == PATH_SCENARIOS


@pytest.mark.parametrize("key", list(PINNED_CORPUS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_corpus_case_counts_are_pinned(key):
    case = next(c for c in load_corpus() if c.id == key[0])
    outcome = run_case(case, key[1])
    assert "incomplete" not in outcome.summary
    assert observed(outcome.summary) == PINNED_CORPUS[key]
    assert outcome.holds                        # and the corpus's own verdict agrees


@pytest.mark.parametrize("key", list(PINNED_SCENARIOS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_path_scenario_counts_are_pinned(key):
    name, design = key
    res = run_scenario(ROOT / "scenarios" / f"{name}.toml", None,
                       RunOptions(design=None if design == "own" else design, device="cpu", trace_level="off",
                                  report=False))
    assert "incomplete" not in res.summary
    assert observed(res.summary) == PINNED_SCENARIOS[key]


# A1 (#27779) and A2 (#25805) under the state that had them: a PD decode node of May 2026 (engine.pd_decode,
# simulator/scheduling/pd_decode.py; corpus rows A1, A2). A1 lives in the token-level paged free_swa (PrefixCache.
# _resolve_tokens, reached through free), A2 in alloc_extend_swa_tail (PrefixCache.extend_swa_tail): the decode
# node's finish and its pre-allocation call them once per request. On R8's paged radix scenario (no decode node)
# neither is called: every free there is a segment free.
A_SWITCH_PATHS = ("_resolve_tokens", "free_swa", "free", "extend_swa_tail")


def _count_switch_paths(monkeypatch) -> dict[str, int]:
    from simulator.scheduling import prefix_cache

    calls: dict[str, int] = dict.fromkeys(A_SWITCH_PATHS, 0)
    for name in A_SWITCH_PATHS:
        orig = getattr(prefix_cache.PrefixCache, name)

        def counted(self, *a, _orig=orig, _name=name, **k):
            calls[_name] += 1
            return _orig(self, *a, **k)
        monkeypatch.setattr(prefix_cache.PrefixCache, name, counted)
    return calls


# (design) -> steps, triton's (writes, findings, first), where the run stopped, requests transferred
A2_PINNED = {
    "pd-decode-pre-25805": (390, (468, {"stale_read": 400}, (83, 0, "stale_read")), 390, 48),
    "pd-decode-post-25805": (405, (486, {}, None), None, 48),
}


@pytest.mark.parametrize("design", sorted(A2_PINNED))
def test_a2_row_reaches_the_a_switches_on_the_decode_node(design, monkeypatch):
    calls = _count_switch_paths(monkeypatch)
    res = run_scenario(ROOT / "scenarios" / "a2-pd-decode-swa-tail.toml", None,
                       RunOptions(design=design, backends=("triton",), device="cpu", trace_level="off", report=False))
    steps, triton, stopped, transfers = A2_PINNED[design]
    assert res.summary["steps"] == steps
    assert observed(res.summary)["backends"] == {"triton": triton}
    assert res.summary["radix"].get("stopped", {}).get("step") == stopped
    pd = res.summary["radix"]["pd_decode"]
    assert pd["transfers"] == transfers and pd["non_tail_tokens"] == 4416
    # one SWA-tail allocation per transfer; one free (free_swa, then _resolve_tokens) per finish
    assert calls["extend_swa_tail"] == transfers
    assert calls["free"] == calls["free_swa"] == calls["_resolve_tokens"] == res.summary["radix"]["events"][
        "map:full:release"]


def test_a_switches_are_not_reached_without_a_decode_node(monkeypatch):
    import tomllib

    from simulator.scenario import parse_scenario
    from simulator.scenario.toml_write import dumps

    calls = _count_switch_paths(monkeypatch)
    data = tomllib.loads((ROOT / "scenarios" / "r8-sink-free-list.toml").read_text())
    data["engine"]["cache_linker"] = False
    scenario = parse_scenario(dumps(data), "r8-sink-free-list.toml without engine.cache_linker")
    res = run_scenario(scenario, None, RunOptions(design="radix-a1", backends=("triton",), device="cpu",
                                                  trace_level="off", report=False))
    assert calls == dict.fromkeys(A_SWITCH_PATHS, 0)
    assert res.summary["steps"] == 121 and "stopped" not in res.summary["radix"]
    assert observed(res.summary)["backends"] == {"triton": (242, {}, None)}
