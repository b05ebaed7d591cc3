"""The gloo host-link fit's small-message bandwidth (stop 40's CI failure: a loaded
host's quick calibration fitted a small-message bandwidth 3856x the large one and the profile
was refused). An unidentified small-message bandwidth is held at the schema's bound and said."""
from __future__ import annotations

from calibrate.cpu_profile import _small_eff, fit_host_link
from calibrate.fit import FitResult
from simulator.hardware.profile_schema import MAX_MEASURED_FRACTION
from simulator.network.collectives import Collective, ring_steps_and_traffic

SIZES = [1 << k for k in range(10, 27, 2)]   # 1 KiB .. 64 MiB


def _rows(small_gbytes_per_s: float | None, n: int = 2) -> list[dict]:
    """all_reduce rows: small regime = 40 us/step (+ bandwidth if given), large regime =
    200 us + wire / 1.5 GB/s; each point takes the faster, as alpha_beta_time_s does."""
    out = []
    for size in SIZES:
        steps, wire = ring_steps_and_traffic(Collective.ALL_REDUCE, n, size)
        small = steps * 40e-6 + (wire / (small_gbytes_per_s * 1e9) if small_gbytes_per_s else 0)
        large = 200e-6 + wire / 1.5e9
        t = min(small, large)
        out.append({"op": "all_reduce", "size_bytes": size, "n_ranks": n, "mean_s": t,
                    "median_s": t})
    return out


def test_unidentified_small_bandwidth_holds_the_bound_and_says_so():
    """The CI host's fit: small-message bandwidth 5729.667 GB/s, large 1.48 GB/s."""
    f = FitResult(values={"alpha_us": 30.0, "small_bw_eff": 5729.667, "base_us": 300.0,
                          "bw_eff": 1.48},
                  stderr={"alpha_us": 1.0, "small_bw_eff": 9e5, "base_us": 5.0, "bw_eff": 0.01},
                  fixed=(), train_mape_pct=5.0, heldout_mape_pct=6.0, n_points=12,
                  n_heldout=4, dof=8)
    rows = _rows(0.75, n=2) + _rows(0.75, n=4)
    c = _small_eff(f, 1.48, rows, "src")
    assert c.value == MAX_MEASURED_FRACTION
    assert "unidentified" in c.source and c.stderr is None
    # the shift named in the source: the 1 MiB all-reduce over 4 ranks (wire 1.5 MiB)
    wire = ring_steps_and_traffic(Collective.ALL_REDUCE, 4, 1 << 20)[1]
    shift_us = wire / 1.48e9 * (1 / MAX_MEASURED_FRACTION - 1.48 / 5729.667) * 1e6
    assert f"adds {shift_us:.3f} us to a {wire / 1e6:.3f} MB" in c.source
    assert 0 < shift_us < 1.0


def test_fitted_ratio_within_the_bound_is_kept():
    f = FitResult(values={"small_bw_eff": 0.74}, stderr={"small_bw_eff": 0.02}, fixed=(),
                  train_mape_pct=1.0, heldout_mape_pct=2.0, n_points=12, n_heldout=4, dof=8)
    c = _small_eff(f, 1.48, _rows(0.75), "src")
    assert abs(c.value - 0.5) < 1e-9 and abs(c.stderr - 0.02 / 1.48) < 1e-9
    assert "unidentified" not in c.source


def test_identified_small_bandwidth_is_the_fitted_ratio():
    bw, c, _ = fit_host_link(_rows(0.75))
    assert abs(c.small_bw_eff.value - 0.5) < 0.05
    assert "unidentified" not in c.small_bw_eff.source
