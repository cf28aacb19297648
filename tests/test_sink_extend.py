"""A radix run with the cache linker on at page size 16 (R8's trigger) no longer dies in the allocator (issue 29
point 6): under 0.5.23 (R8 live) a request handed the sink page has SWA slot 0 at a token whose page has room, and
the modelled allocator asserted "the SWA page of a request's last token was evicted" (on main the run below died
after 141 steps). The release continues the page from ``full_to_swa[last_loc]`` (0 there) into the sink page's
slots 1, 2, ... (SharingScheduler._extend does the same), every read of the sink page is a stale read (the
sink is no token's: ReferencePool.reserve), and the run goes on to R8's over-free, which stops it cleanly
(``radix.stopped``). Under radix-fixed (#38519's filter) no request is handed the sink: clean."""
from __future__ import annotations

import numpy as np

from helpers import ROOT, simulate, tiny


def _sharing_paged_linker():
    """sharing-system-prompt (seed 8) on page 16 with the cache linker attached."""
    text = (ROOT / "scenarios" / "sharing-system-prompt.toml").read_text()
    text = text.replace("[pool]\n", "[pool]\npage_size = 16\n", 1)
    text = text.replace("radix_cache = true", "radix_cache = true\ncache_linker = true", 1)
    return tiny(text)


def test_a_request_given_the_sink_page_goes_on_in_it_and_its_reads_there_are_stale():
    r = simulate(_sharing_paged_linker(), "sglang-0.5.23", backends=["triton"])
    assert r.radix["stopped"] == {"step": 113, "class": "over_free", "assert": "available_size() <= size",
                                  "message": "freeing 8 pages leaves 97 free of 96"}
    assert r.radix["events"]["extend:sink_page"] == 19        # where the allocator asserted before
    counts = {c: n for c, n in r.backends["triton"].findings.items() if n}
    assert counts == {"stale_read": 30618}
    got = [f for f in r.findings if f.cls == "stale_read"]
    assert got[0].step == 67 and got[0].message == (
        "req 24 pos 176 reads swa slot 0 at layer 0 (and 1 more swa layers reading the same table): slot 0 is the "
        "sink / padding slot")
    assert {f.slot for f in got} == set(range(16)) and all("sink / padding slot" in f.message for f in got)
    # the reads of sink slots that hold the reader's own token by the reference: only the sink rule sees them
    own = [f for f in got if f.observed == f.expected]
    assert len(own) == 691 and {f.slot for f in own} == set(range(16))
    assert max(rec.step for rec in r.steps) < 113


def test_the_filter_hands_out_no_sink_page_and_the_run_is_clean():
    r = simulate(_sharing_paged_linker(), "radix-fixed", backends=["triton"])
    assert r.total_findings == 0 and "stopped" not in r.radix
    assert "extend:sink_page" not in r.radix["events"]


def test_a_sink_slot_handed_to_a_token_is_live_for_the_writes_and_stale_for_the_reads():
    import torch

    from simulator.designs import ReadIds
    from simulator.oracle.checker import Checker
    from simulator.oracle.read_rules import window_span
    from simulator.oracle.reference import ReferencePool
    from simulator.records import Owner
    from simulator.scheduling.batch import BatchRequests, BatchTruth

    ref = ReferencePool(64, 64)
    ck = Checker(ref, lambda t: Owner(t, 0, t - 1), reserved=np.arange(16))
    tags, slots = np.arange(1, 5, dtype=np.int64), np.array([14, 15, 16, 17], dtype=np.int64)
    e = np.zeros(0, dtype=np.int64)
    ref.apply(BatchTruth(tags=tags, full_slots=slots + 16, swa_slots=slots, freed_full=e, freed_swa=e,
                         evicted_swa=e, mapping_changed=e))
    assert ref.live["swa"][14] and ref.expected["swa"][14] == 1      # the write check's view: as allocated
    one = lambda v: np.array([v], dtype=np.int64)  # noqa: E731
    rq = BatchRequests(rids=one(0), seq_lens=one(4), extend_lens=one(4), slots=(), tag_bases=one(1))
    ids = ReadIds(torch.tensor([0, 4]), torch.from_numpy(slots), torch.tensor([0]))
    found, _ = ck.check_reads(0, "triton", "swa", ids, rq, None, 64, 0, 1,
                              span=window_span(rq.seq_lens, rq.extend_lens, 8))
    assert [(f.slot, f.message.split(": ")[1]) for f in found] == [
        (14, "slot 14 is the sink / padding slot"), (15, "slot 15 is the sink / padding slot")]
