"""Shared CUDA-graph timing helper for the benchmark scripts."""

from __future__ import annotations

import torch


def capture(fn, calls: int = 1):
    """``fn`` run once on a side stream (warm-up: Triton compiles, cuBLAS picks, lazy allocations),
    then captured ``calls`` times into a CUDA graph; returns ``(graph, out)``, ``out`` being what the
    last captured call returned (its tensors are rewritten by every ``graph.replay()``)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    out = None
    with torch.cuda.graph(g):
        for _ in range(calls):
            out = fn()
    return g, out


def graph_ms(fn, replays: int = 10, calls_per_graph: int = 1, blocks: int = 5) -> float:
    """Milliseconds per call of ``fn`` inside a CUDA graph.

    ``fn`` is warmed up and captured ``calls_per_graph`` times into one graph (:func:`capture`), and the graph is replayed ``replays`` times per timed
    block (CUDA events); returns the median over ``blocks`` blocks divided by the calls per block.
    """
    g, _ = capture(fn, calls_per_graph)
    ts = []
    for _ in range(blocks):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(replays):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / (replays * calls_per_graph))
    return sorted(ts)[len(ts) // 2]
