"""``bench_dp.probe_rows``: the CSV rows every warm-protocol bench writes (bench_mcore_ddp,
bench_mcore_optimizer, bench_mcore_loop, bench_megatron_legacy_step, bench_deepspeed_step),
each microsecond figure also in eager ops of the run's own probe. Needs no torch."""
from __future__ import annotations

from calibrate.bench_dp import probe_rows


def test_rows_carry_the_runs_probe_and_its_eager_ops():
    m = {"op": {"fwd": 12.5, "bwd": 13.0}}
    base = {"host": "h", "torch": "t", "date": "d"}
    rows = probe_rows(m, base, "mech", "how", [("a, per step, fixed", 25.0), ("b", -1.25)])
    assert [r["metric"] for r in rows] == ["a, per step, fixed", "b"]
    assert [r["eager_ops"] for r in rows] == [2.0, -0.1]
    assert [r["value_us"] for r in rows] == [25.0, -1.25]
    assert all(r["op_fwd_us_same_run"] == 12.5 and r["mechanism"] == "mech"
               and r["method"] == "how" and r["host"] == "h" for r in rows)
    assert "op_fwd_us_same_run" not in base
