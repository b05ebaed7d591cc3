"""The pipeline bubble is reported as bubble, not as host time, when a host issue task
sits between the pipeline hand-off and the next pass (regression: after host streams were
added, a stage's wait for its upstream was attributed to the host task that waited too).

Expected value: the 1F1B bubble of Narayanan et al. 2021, (p - 1) x (F + B) per stage,
read from the analytic engine's closed form; the event engine must put its waits there.
"""
from __future__ import annotations

import dataclasses

import hardware_db
from simulator.engine.simulate import simulate
from simulator.parallel.plan import Plan
from simulator.workload import TransformerSpec

MODEL = TransformerSpec("bubble-gpt", n_layers=8, hidden=4096, ffn_hidden=16384, n_heads=32,
                        n_kv_heads=32, vocab=8000, seq_len=2048)


def test_pipeline_wait_is_bubble_not_host():
    prof = hardware_db.load_profile("h100-sxm")
    cluster = hardware_db.build_cluster("h100-sxm", 4)
    plan = Plan(tp=1, pp=4, dp=1, micro_batch=1, global_batch=8,
                host_mechanisms=("megatron_p2p_sync",))   # the host waits at hand-offs
    ev = simulate(MODEL, plan, cluster, prof, engine="event")
    an = simulate(MODEL, plan, cluster, prof, engine="analytic")
    assert an.breakdown.bubble_s > 0.1 * an.step_time_s            # a pipeline with a real bubble
    assert abs(ev.breakdown.bubble_s - an.breakdown.bubble_s) < 0.25 * an.breakdown.bubble_s
    assert ev.breakdown.host_s < 0.5 * ev.breakdown.bubble_s
    without_host = simulate(MODEL, plan, cluster, dataclasses.replace(prof, host=None))
    assert abs(ev.breakdown.bubble_s - without_host.breakdown.bubble_s) < 0.25 * without_host.breakdown.bubble_s
