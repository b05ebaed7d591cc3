"""Chrome trace (Perfetto-compatible) of a simulated step's timeline."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..engine.result import Result


def chrome_trace(result: Result) -> dict[str, Any]:
    """Trace-event JSON: one process per pipeline stage, one thread per resource,
    complete ("X") events with microsecond timestamps."""
    events: list[dict[str, Any]] = []
    tids: dict[str, int] = {}
    for ev in result.timeline:
        res = ev["resource"]
        stage = int(ev.get("stage", 0))
        if res not in tids:
            tids[res] = len(tids) + 1
            events.append({"ph": "M", "name": "thread_name", "pid": stage, "tid": tids[res],
                           "args": {"name": res.split(".", 1)[-1]}})
        events.append({"ph": "X", "name": ev["name"], "cat": ev.get("kind", ""), "pid": stage,
                       "tid": tids[res], "ts": round(ev["start_s"] * 1e6, 3),
                       "dur": round((ev["end_s"] - ev["start_s"]) * 1e6, 3),
                       "args": {k: v for k, v in ev.items()
                                if k not in ("name", "resource", "start_s", "end_s")}})
    for stage in sorted({int(e.get("stage", 0)) for e in result.timeline}):
        events.append({"ph": "M", "name": "process_name", "pid": stage, "tid": 0,
                       "args": {"name": f"pipeline stage {stage}"}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"step_time_s": result.step_time_s, "engine": result.engine}}


def write_chrome_trace(path: str | Path, result: Result) -> None:
    Path(path).write_text(json.dumps(chrome_trace(result), sort_keys=True) + "\n")
