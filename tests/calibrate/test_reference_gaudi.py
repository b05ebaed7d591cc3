"""Intel Gaudi 2 / Gaudi 3 reference profiles (``calibrate.reference_gaudi``): each dtype's
GEMM level comes from its own MAMF row (kernels_extra.csv lines 17-20) on the card's MMEs
with 256x256 tiles, and the model gives each row back at its shape; the power limit is
applied once (Gaudi 3's row already ran with its clock dropping)."""
from __future__ import annotations

from dataclasses import replace

import hardware_db as hdb
import pytest

from calibrate.reference import PROFILE_DIR
from simulator.cost.kernels import gemm_time_s
from simulator.hardware.profile import Profile


def _load(gpu: str) -> Profile:
    return Profile.read_json(PROFILE_DIR / f"{gpu}.json")


def _tflops(gpu: str, prof: Profile, shape: tuple[int, int, int], dtype: str) -> float:
    m, n, k = shape
    return 2 * m * n * k / gemm_time_s(m, n, k, dtype, hdb.load_gpu(gpu), prof) / 1e12


@pytest.mark.parametrize("gpu, dtype, line, shape, tf_row", [
    ("gaudi2", "bf16", 17, (14336, 15360, 2048), 418.7),
    ("gaudi2", "fp8", 18, (6144, 11264, 5120), 826.5),
    ("gaudi3", "bf16", 19, (16384, 4096, 768), 1243.0),
    ("gaudi3", "fp8", 20, (16640, 1536, 3072), 1289.5),
])
def test_each_gaudi_level_gives_its_own_mamf_row_back(gpu, dtype, line, shape, tf_row):
    prof = _load(gpu)
    assert f"kernels_extra.csv line {line}" in prof.gemm.eff_max[dtype].source
    burst = replace(prof, gemm=replace(prof.gemm, sustained_eff={}))
    assert _tflops(gpu, burst, shape, dtype) == pytest.approx(tf_row, rel=0.03)


def test_gaudi3_row_already_holds_the_power_limit_gaudi2_gets_a_transferred_ceiling():
    g3, g2 = _load("gaudi3"), _load("gaudi2")
    assert not g3.gemm.sustained_eff and "PR #118" in g3.gemm.eff_max["bf16"].source
    cap = g2.gemm.sustained_eff["bf16"]
    assert cap.value < g2.gemm.eff_max["bf16"].value and "assumed" in cap.source
    assert "issue #115" in g2.gemm.eff_max["bf16"].source


@pytest.mark.parametrize("gpu, mmes", [("gaudi2", 2), ("gaudi3", 8)])
def test_gemm_tiles_are_the_mme_array(gpu, mmes):
    """A 256x256 MAC array per MME: an output one row past a multiple of 256 pads a whole
    tile row, so it runs at (m / padded m) of the aligned shape's rate (k_half = 0, and the
    tile count stays a multiple of the MME count, so no wave tail)."""
    prof = replace(_load(gpu), gemm=replace(_load(gpu).gemm, sustained_eff={}))
    assert hdb.load_gpu(gpu).sm_count == mmes and prof.gemm.tile_shapes() == ((256, 256),)
    n, k = 256 * mmes * 4, 8192
    aligned = _tflops(gpu, prof, (4096, n, k), "bf16")
    padded = _tflops(gpu, prof, (4097, n, k), "bf16")
    assert padded / aligned == pytest.approx(4097 / (4096 + 256), rel=0.01)


def test_gaudi_scale_up_is_an_on_die_roce_mesh():
    for gpu, per_card in (("gaudi2", 262.5), ("gaudi3", 525.0)):
        cl = hdb.build_cluster(gpu, 16)
        assert cl.node.scale_up.kind.value == "roce" and cl.gpus_per_node == 8
        assert cl.node.scale_up.bandwidth_gbytes_per_s == per_card
        prof = _load(gpu)
        assert "roce" in prof.links and "nvlink" not in prof.links
