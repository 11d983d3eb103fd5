"""Reading a torch.profiler trace (its Chrome-trace events) of replayed decode steps: how much of the window the
device was busy, the gaps between kernels (launch latency inside graphs, the host between replays), and the kernels
that cost most. ``specdec.profile`` times forwards; this reads what the profiler recorded of a whole call.
"""

from __future__ import annotations


def step_timeline(events: list[dict]) -> dict:
    """Device time against gaps in a trace's replayed steps (Kineto's Chrome-trace events, times in us): the window
    from the first ``cudaGraphLaunch`` (else the first device event) to the end of the last device event; busy, the
    union of device intervals (kernels, copies, sets) in it; gaps, the rest; per step, each over the launches."""
    device = [event for event in events if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
              and "dur" in event]
    launches = sorted(event["ts"] for event in events if event.get("cat") == "cuda_runtime"
                      and str(event.get("name", "")).startswith("cudaGraphLaunch"))
    empty = {"graph_launches": len(launches), "window_us": 0.0, "busy_us": 0.0, "gap_us": 0.0, "busy_share": None,
             "step_us": None, "kernel_us_per_step": None, "kernels_per_step": None, "top_kernels": []}
    if not device:
        return empty
    start = launches[0] if launches else min(event["ts"] for event in device)
    window = [event for event in device if event["ts"] >= start]
    if not window:
        return empty
    end = max(event["ts"] + event["dur"] for event in window)
    busy = union_length([(event["ts"], event["ts"] + event["dur"]) for event in window])
    kernels = [event for event in window if event["cat"] == "kernel"]
    steps = max(len(launches), 1)
    totals: dict[str, list[float]] = {}
    for event in kernels:
        totals.setdefault(event["name"], []).append(event["dur"])
    kernel_time = sum(sum(durations) for durations in totals.values())
    top = sorted(totals.items(), key=lambda item: -sum(item[1]))[:15]
    return {
        "graph_launches": len(launches), "window_us": round(end - start, 1), "busy_us": round(busy, 1),
        "gap_us": round(end - start - busy, 1), "busy_share": round(busy / (end - start), 3) if end > start else None,
        "step_us": round((end - start) / steps, 1), "kernel_us_per_step": round(kernel_time / steps, 1),
        "kernels_per_step": round(len(kernels) / steps, 1),
        "top_kernels": [{"kernel": name[:90], "count": len(durations), "total_us": round(sum(durations), 1),
                         "share_of_kernel_time": round(sum(durations) / kernel_time, 3)} for name, durations in top],
    }


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by [start, end) intervals (overlaps counted once)."""
    total, reached = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reached:
            total += end - max(start, reached)
            reached = end
    return total
