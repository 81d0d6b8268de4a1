"""The router's collector settings before it serves (router/main.py settle_gc)."""

from __future__ import annotations

import gc

from llmgw.router.main import GC_GEN0, settle_gc


class TestSettleGc:
    """The router's garbage collector settings before it serves."""

    def test_settle_gc_freezes_what_is_alive_and_raises_the_young_threshold(self) -> None:
        """settle_gc freezes what is alive and raises the young threshold."""
        before = gc.get_threshold()
        try:
            settle_gc()
            assert gc.get_threshold() == (GC_GEN0, before[1], before[2])
            assert gc.get_freeze_count() > 0
            # Net new objects below the threshold trigger no young collection.
            gc.collect()
            counts: list[int] = []
            gc.callbacks.append(lambda phase, info: counts.append(info["generation"]))
            try:
                keep = [[] for _ in range(GC_GEN0 // 2)]
                assert len(keep) == GC_GEN0 // 2
                assert 0 not in counts
            finally:
                gc.callbacks.pop()
        finally:
            gc.unfreeze()
            gc.set_threshold(*before)
