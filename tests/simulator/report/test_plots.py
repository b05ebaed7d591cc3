"""Pictures people keep: a roofline whose labels do not overlap and that leaves ops without
FLOPs off the roofline, and the Gantt chart of a simulated step."""
from __future__ import annotations

import itertools

import pytest

import hardware_db
from simulator.api.catalog import make_cluster
from simulator.engine.simulate import simulate
from simulator.errors import InvalidInputError
from simulator.parallel.plan import Plan
from simulator.planning.whatif import roofline_ops
from simulator.workload import get_preset

pytest.importorskip("matplotlib")


def _setup():
    m = get_preset("llama2-7b")
    cluster = make_cluster("h100-sxm", 8, None, None, None, None, None, None, 1.0)
    return m, cluster, hardware_db.load_profile("h100-sxm")


def _overlaps(boxes) -> list:
    return [(a, b) for a, b in itertools.combinations(boxes, 2) if a.overlaps(b)]


def _text_boxes(texts, fig):
    """Extents of the label texts themselves (an Annotation's own extent includes its
    leader line, which may cross others by design)."""
    from matplotlib.text import Text
    r = fig.canvas.get_renderer()
    return [Text.get_window_extent(t, r) for t in texts]


def test_roofline_labels_do_not_overlap_and_zero_flop_ops_are_not_on_it(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from simulator.report import roofline
    from simulator.report.plots import plot_roofline
    m, cluster, prof = _setup()
    plan = Plan(tp=2, dp=4, global_batch=64)
    ops = roofline_ops(m, plan, cluster, prof)
    figs = []
    monkeypatch.setattr(roofline, "_save", lambda fig, path, tight=True: figs.append(fig) or path)
    plot_roofline(ops, cluster.gpu.peak(plan.precision), cluster.gpu.mem_bw_gbytes_per_s,
                  tmp_path / "r.png", top=10)
    fig = figs[0]
    fig.canvas.draw()
    ax, ax_bw = fig.axes[:2]
    labels = [c for c in ax.texts] + [c for c in ax.get_children()
                                      if type(c).__name__ == "Annotation"]
    labels = list({id(x): x for x in labels}.values())
    timed = [o for o in ops if o.roofline.value in ("compute-bound", "memory-bound")
             and o.time_s > 0 and o.bytes_moved > 0]
    with_flops = [o for o in timed if o.flops > 0]
    assert len(labels) == min(10, len(with_flops))
    assert _overlaps(_text_boxes(labels, fig)) == []
    on_roofline = sum(len(c.get_offsets()) for c in ax.collections)
    assert on_roofline == len(with_flops)                 # no zero-FLOP op on the roofline
    assert len(ax_bw.patches) == min(10, len(timed) - len(with_flops))   # they are here
    plt.close(fig)


def test_label_column_separates_coincident_points():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from simulator.report.roofline import label_column
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([1, 1, 1, 1, 1, 1, 1, 1], [1] * 8)
    label_column(ax, [(1.0, 1.0, f"op number {i}") for i in range(8)])
    fig.canvas.draw()
    assert len(ax.texts) == 8 and _overlaps(_text_boxes(ax.texts, fig)) == []
    plt.close(fig)


def test_timeline_picture(tmp_path):
    from simulator.report.gantt import plot_timeline
    m, cluster, prof = _setup()
    plan = Plan(tp=2, pp=2, dp=2, global_batch=16)
    res = simulate(m, plan, cluster, prof, keep_timeline=True)
    out = plot_timeline(res, tmp_path / "step.png")
    assert out.stat().st_size > 10_000
    with pytest.raises(InvalidInputError):
        plot_timeline(simulate(m, plan, cluster, prof, engine="analytic"), tmp_path / "x.png")


def test_report_html_has_the_validation_plots(tmp_path, capsys):
    import csv

    from pathlib import Path

    from simulator.cli.main import main
    repo = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
    with (repo / "validation" / "published_runs.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    runs = tmp_path / "runs.csv"
    with runs.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows([r for r in rows if r["id"].startswith("megatron_sc21_0")][:3])
    for d in ("a", "b"):
        assert main(["report", "--runs", str(runs), "--out-dir", str(tmp_path / d), "--html"]) == 0
    page = (tmp_path / "a" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "megatron_sc21_01" in page
    assert page == (tmp_path / "b" / "report.html").read_text()        # same inputs, same bytes
    assert "report.html" in capsys.readouterr().out
