"""Reference calibration profiles for GPUs we cannot measure here.

``python -m calibrate.reference`` rebuilds ``hardware_db/data/profiles/<gpu>.json`` from the
public microbenchmark rows in ``hardware_db/data/measurements/*.csv`` (copies of
``shared/validation/kernels.csv`` / ``kernels_more.csv`` / ``collectives.csv`` plus
``kernels_extra.csv``; GEMM models in ``calibrate.reference_gemm``) and the
datasheet peaks below (from ``shared/hardware/gpus.csv`` / ``links.csv``; same values as
``hardware_db/data/gpus.json``). Every coefficient names the CSV lines it came from, or says
"assumed"/"transferred". Output is deterministic on one machine and reproducible within
each coefficient's standard error across machines (``calibrate.profile_io``).

CSV line numbers count the header as line 1 (``sed -n Np`` shows line N).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Mapping, Sequence

from simulator.hardware.profile import (
    AttentionModel,
    Coefficient,
    GemmModel,
    LinkCoefficients,
    MemoryModel,
    Profile,
)

from . import reference_links as L
from . import reference_network as N
from .csvrows import Row, cite, load_rows, select
from .profile_io import write_profile
from .reference_attention import AttentionRefs, attention_curves, build_attention_refs
from .reference_data import AMPERE_A100, ATTENTION, LAUNCH_SRC, LAUNCH_US
from .reference_gemm import GemmRefs
from .reference_gaudi import GAUDI_GPUS
from .reference_gemm_build import build_refs, gemm_for
from .reference_host import host_for

REPO = Path(__file__).resolve().parent.parent
PROFILE_DIR = REPO / "hardware_db" / "data" / "profiles"
GPU_KEYS = ("v100-sxm-32gb", "a100-sxm-40gb", "a100-sxm-80gb", "a100-pcie-80gb", "a800-sxm-80gb",
            "h100-sxm", "h100-pcie", "h800", "gh200", "h200-sxm", "b200", "gb200", "b300",
            "gb300", "mi250x", "mi300x", "mi325x", "mi355x", "l40s", "gaudi2", "gaudi3")
FINGERPRINT = {"built_from": "hardware_db/data/measurements/*.csv",
               "builder": "calibrate.reference"}


# ---- memory and attention -----------------------------------------------------------------
def memory_model(kern: Sequence[Row], key: str) -> MemoryModel:
    """bw_eff from the H100 device-to-device copy row; other GPUs transfer it (said so)."""
    row = select(kern, lambda d: d["kernel"].startswith("GPU device-to-device copy"))[0]
    meas, peak = float(row.data["value"]), float(row.data["peak_spec"])
    src = (f"{cite([row])}: H100 SXM D2D copy {meas:g} GB/s of {peak:g} GB/s HBM3 peak "
           "(aigatech/vpbenchmarking, large copy so launch time negligible)")
    if key != "h100-sxm":
        src = f"transferred from H100 to {key} (no memory-bandwidth row for it): {src}"
    return MemoryModel(bw_eff=Coefficient(meas / peak, "fraction", src),
                       launch_us=Coefficient(LAUNCH_US, "us", LAUNCH_SRC))


def attention_model(key: str, gemm: GemmModel, a100_bf16_eff: float,
                    refs: AttentionRefs) -> AttentionModel:
    """Fitted curves where a sweep exists (``calibrate.reference_attention``); elsewhere
    flash-attention fractions of the bf16 peak (published papers; see reference_data).

    Plain dtype keys hold FlashAttention-2-class kernels; ``flash3:<dtype>`` keys hold the
    Hopper-specific kernels (FA3 / cuDNN fused attention) where the GPU has them.
    """
    def pair(family: str, scale: float, why: str) -> tuple[Coefficient, Coefficient]:
        f, b = ATTENTION[family]["fwd"], ATTENTION[family]["bwd"]
        pre = f"{why}: " if why else ""
        return (Coefficient(f[0] * scale, "fraction", pre + f[1]),
                Coefficient(b[0] * scale, "fraction", pre + b[1]))
    fitted = attention_curves(key, refs)
    if fitted is not None:
        return fitted
    fa3 = None
    if key.startswith(AMPERE_A100):
        fwd, bwd = pair("a100", 1.0, "")
    elif key in ("h100-sxm", "h200-sxm"):
        why = "" if key == "h100-sxm" else "H200 = H100 compute (same GH100 die)"
        fwd, bwd = pair("h100", 1.0, why)
        fa3 = pair("h100-flash3", 1.0, why)
    elif key in ("b200", "gb200"):
        why = (f"assumed: {key} achieves the H100 fraction (no Blackwell attention "
               "microbenchmark in shared data)")
        fwd, bwd = pair("h100", 1.0, why)
        fa3 = pair("h100-flash3", 1.0, why)
    elif key == "v100-sxm-32gb":
        fwd, bwd = pair("a100", 0.7, "assumed: 0.7 x the A100 FlashAttention-2 fraction "
                        "(FlashAttention-2 does not support sm70; V100 runs non-flash or "
                        "memory-efficient kernels)")
    else:
        # never above A100's measured fraction: a GEMM level near peak (Gaudi 2's 97 %) says
        # nothing of the softmax, which no such device's row measures
        r = min(1.0, gemm.eff_max["bf16"].value / a100_bf16_eff)
        label = key.upper().replace("-", " ")
        fwd, bwd = pair("a100", r, f"assumed: A100 FlashAttention-2 fraction x {r:.3f} "
                        f"({label}/A100 bf16 GEMM efficiency ratio, at most 1; no {label} "
                        "attention row)")
    dtypes = ("fp16",) if key == "v100-sxm-32gb" else ("bf16", "fp16")
    f_map = {d: fwd for d in dtypes}
    b_map = {d: bwd for d in dtypes}
    if fa3:
        f_map.update({f"flash3:{d}": fa3[0] for d in dtypes})
        b_map.update({f"flash3:{d}": fa3[1] for d in dtypes})
    return AttentionModel(fwd_eff=f_map, bwd_eff=b_map)


# ---- links per GPU ------------------------------------------------------------------------
def links_for(key: str, coll: Sequence[Row]) -> tuple[dict[str, LinkCoefficients], dict]:
    """All link kinds a cluster of this GPU can use, plus the fits behind them."""
    a100 = L.nvlink_a100(coll)
    fits = {"nvlink_a100": a100.fit}
    if key in ("h100-sxm", "h200-sxm", "h800", "gh200"):
        nv = L.nvlink_h200(coll)
        fits["nvlink_h200"] = nv.fit
        if key == "gh200":
            nv = L.transferred_link(nv, "GH200 (the same NVLink 4 ports as H100/H200, wired "
                                    "as a 4-GPU mesh without NVSwitch: efficiencies carried; "
                                    "a group of m GPUs of the node reaches (m - 1) / 3 of "
                                    "450 GB/s, Fabric.scale_up_share; no NVLS)")
        if key == "h800":
            nv = L.transferred_link(nv, "H800 (the same NVLink 4 ports and NVSwitch gen3 as "
                                    "H100/H200, fewer of them: efficiencies carried, the "
                                    "bandwidth is the H800 link's 200 GB/s)")
    elif key in ("b200", "gb200", "b300", "gb300"):
        b200 = L.nvlink_b200(coll, L.nvlink_h200(coll))
        fits["nvlink_b200"] = b200.fit
        if key == "b200":
            nv = b200
        elif key == "b300":
            nv = L.transferred_link(b200, "B300 (HGX B300: the same NVLink5 switch "
                                    "generation, 900 GB/s per GPU; no B300 sweep)")
        else:
            nv = L.nvlink_gb200(coll, b200)
            if key == "gb300":
                nv = L.transferred_link(nv, "GB300 (the same NVL72 NVLink5 domain; no GB300 "
                                        "row)")
    elif key == "v100-sxm-32gb":
        nv = L.nvlink_v100(coll, a100)
    elif key == "a800-sxm-80gb":
        nv = L.transferred_link(a100, "A800 (the A100's NVLink 3 ports and NVSwitch gen2, "
                                "fewer of them: efficiencies carried, the bandwidth is the "
                                "A800 link's 200 GB/s)")
    else:
        nv = a100
    sharp = L.ib_sharp_speedup(coll) if key in ("h100-sxm", "h200-sxm", "h800") else None
    links = L.scale_out_links(coll, sharp)
    links["pcie"] = L.pcie(coll, a100)
    links["host"] = L.host_from(links["pcie"])
    if key in ("mi300x", "mi325x", "mi355x", "mi250x"):
        links["xgmi"] = L.xgmi_from(a100, key.upper())
    elif key in GAUDI_GPUS:    # scale-up and scale-out are the chip's RoCE ports (kind roce)
        links["roce"] = L.transferred_link(L.LinkFit(links["roce"]), (
            f"{key} on-die RoCE ports, in the box's all-to-all mesh and to the network, "
            "through HCCL (assumed: the NCCL RoCE/IB rows' coefficients; no HCCL row in "
            "shared data)")).coefs
    else:
        links["nvlink"] = nv.coefs
    return links, fits


# ---- profiles -----------------------------------------------------------------------------
NOTES = {
    "h100-sxm": "GEMM: one shape model (tile/wave fill, k-loop saturation, level) fitted to "
                "every H100/H200 16-bit shape sweep in the measurements, capped by the "
                "sustained (MSMF, power-limited) rate measured on H200 (same die).",
    "h200-sxm": "GEMM shares the H100 fit (same GH100 die).",
    "b200": "GEMM shape terms transferred from the Hopper fit; level from the B200 MAMF rows; "
            "sustained ceiling from the B200 MSMF row.",
    "gb200": "GB200 NVLink latency terms transferred from the B200 sweep.",
    "mi300x": "MI300X GEMM from the MAMF v2 table (kernels_extra.csv, TunableOp on); links and "
              "attention are assumptions (no RCCL / attention rows in shared data).",
    "v100-sxm-32gb": "No V100 GEMM or attention microbenchmark: A100 efficiencies transferred.",
    "a100-sxm-80gb": "No sustained-clock (MSMF) GEMM measurement is published for A100: no "
                     "power-limit ceiling is applied (the shape fit is to short runs), so long "
                     "runs may be optimistic where the 400 W limit lowers the clock.",
    "a100-pcie-80gb": "A100 PCIe: the A100 SXM fits (same GA100 die), its own MAMF row for the "
                      "power-limited ceiling (300 W), PCIe Gen4 between the GPUs of a node "
                      "(the 2-GPU NVLink bridge is not modelled).",
    "b300": "B300 (Blackwell Ultra): B200 shape fits, levels and ceiling carried by its own "
            "MAMF rows (bf16, fp8); NVLink, attention and network transferred from B200.",
    "h100-pcie": "H100 PCIe: the H100 SXM shape terms and levels, the SXM ceilings scaled by "
                 "one tool's MAMF ratio of the two cards (kernels_extra.csv lines 11-12), PCIe "
                 "Gen5 between the GPUs of a node (the 2-GPU NVLink bridge is not modelled).",
    "h800": "H800 = H100 compute (same GH100 die): the H100 model, NVLink efficiencies from the "
            "H200 sweep on the H800's 200 GB/s per direction (0.804 x 200 = 161 GB/s, against "
            "DeepSeek-V3's measured 160 GB/s usable).",
    "a800-sxm-80gb": "A800 = A100 SXM 80GB compute (same GA100 die): the A100 model, NVLink "
                     "efficiencies from the A100 sweep on the A800's 200 GB/s per direction "
                     "(no A800 microbenchmark in shared data). As for A100, no sustained-clock "
                     "(MSMF) GEMM row: long runs may be optimistic at the 400 W limit.",
    "gh200": "GH200 = H100 compute (same GH100 die, 132 SMs): the H100 model. The JUPITER "
             "configuration (96 GB HBM3 at 4 TB/s, 680 W for the whole superchip, 4 GPUs in an "
             "NVLink mesh, 4 x NDR200). The GEMM ceiling is H100 SXM's (700 W): a 900 W GH200 "
             "measured 4.3 % (bf16) and 9.4 % (fp8) above H100 SXM in one MAMF table "
             "(kernels.csv lines 4-5, 9 and 11), so 900 W superchips may run faster; 680 W shared "
             "with the CPU may run slower (not measured). Grace host: its own Linear row.",
    "l40s": "L40S (Ada): the A100 family's shape terms with its own MAMF row for the level "
            "(kernels_extra.csv line 13); HBM-measured memory efficiency on its GDDR6, A100 "
            "FlashAttention-2 fractions, PCIe Gen4 between the GPUs (all assumed).",
    "gb300": "GB300: the larger of its B300 die's and GB200's MAMF rows (no GB300 GEMM row; "
             "the pessimistic side at 1400 W), NVL72 links from GB200, Grace host as GB200's.",
    "mi250x": "MI250X: one GCD is one device (8 per HPE Cray EX235a node: Frontier, LUMI-G). "
              "GEMM level from its own MAMF row (ROCm 6.2, older method; likely optimistic: 16 % "
              "above another user's 127 TF, and the older method measured MI300X 17 % above "
              "the newer), Hopper shape terms carried (assumed). Infinity Fabric: 200 GB/s to "
              "the sibling GCD, 150 GB/s over the other six; link efficiencies, attention, "
              "memory efficiency and the Slingshot NICs (priced as RoCE) are assumptions (no "
              "RCCL, attention or Slingshot rows in shared data).",
    "mi325x": "MI325X (the MI300X die at 1000 W): GEMM level from its own MAMF row (14.8 % "
              "above MI300X's), MI300X's links and attention assumptions, its own memory "
              "bandwidth.",
    "mi355x": "MI355X (CDNA4, 1400 W): GEMM level from its own MAMF row (1565 TF, TunableOp "
              "off), Hopper shape terms carried (assumed); xGMI, attention, memory efficiency "
              "and fp8 (at the bf16 fraction) are assumptions (no RCCL, attention or fp8 rows).",
    "gaudi2": "Gaudi 2: GEMM levels from its own MAMF rows (bf16 418.7, fp8 826.5 TF; lazy "
              "mode) on its 2 MMEs with 256x256 tiles and no k-loop term (assumed); the 8 cards "
              "of an HLS-Gaudi2 box are an all-to-all mesh of on-die 100GbE RoCE ports priced "
              "with the RoCE coefficients (assumed: no HCCL row), its 3 scale-out ports on the "
              "chip (no PCIe hop); attention (at most A100's fraction), memory efficiency and "
              "host time are transferred (assumed); the power-limit ceiling is the row at the "
              "lowest MME clock its author saw, 1550 of 1650 MHz (393 TF).",
    "gaudi3": "Gaudi 3: GEMM levels from its own MAMF rows (bf16 1243.0, fp8 1289.5 TF at the "
              "1600 MHz MME clock it ships with; lazy mode) on its 8 MMEs with 256x256 tiles "
              "and no k-loop term (assumed); HLS-3's all-to-all mesh of 200GbE RoCE ports "
              "priced with the RoCE coefficients (assumed: no HCCL row), its 3 scale-out ports "
              "on the chip (no PCIe hop); attention, memory efficiency, host time and the "
              "power-limit ceiling (the H200/B200 MSMF/MAMF ratio) are transferred (assumed).",
    "a100-sxm-40gb": "No sustained-clock (MSMF) GEMM measurement is published for A100: no "
                     "power-limit ceiling is applied.",
}


def build_profile(key: str, kern: Sequence[Row], coll: Sequence[Row],
                  refs: GemmRefs, attn: AttentionRefs, net: N.NetworkRef
                  ) -> tuple[Profile, dict]:
    gemm = gemm_for(key, refs)
    a100_bf16 = gemm_for("a100-sxm-80gb", refs).eff_max["bf16"].value
    links, fits = links_for(key, coll)
    prof = Profile(
        name=f"{key}-reference", device_key=key, gemm=gemm, memory=memory_model(kern, key),
        attention=attention_model(key, gemm, a100_bf16, attn), links=links,
        overlap_slowdown=Coefficient(
            1.189, "multiplier",
            "Lee et al. 2025, 'Characterizing Compute-Communication Overlap in GPU-Accelerated "
            "Distributed Deep Learning' (arXiv:2507.03114): compute kernels overlapped with "
            "collectives run on average 18.9% slower (max 40%) across A100, H100, MI250, MI210 "
            "with GPT and LLaMA workloads; the average is used for every GPU"),
        step_overhead_s=Coefficient(0.0, "s", "assumed: no per-step overhead microbenchmark "
                                    "in shared data"),
        host=host_for(key),
        fingerprint=dict(FINGERPRINT),
        notes=" ".join(filter(None, [
            "Reference profile built from public microbenchmarks (hardware_db/data/"
            "measurements) and datasheets; coefficients say 'assumed' or 'transferred' where "
            "no row exists for this GPU.", NOTES.get(key, "")])),
        network=N.network_for(key, coll, net))
    return prof.validate(), {**refs.fits, **attn.fits, **fits, "nvls_tree_latency": net.fit}


def build_all(out_dir: Path = PROFILE_DIR) -> dict[str, tuple[Profile, dict]]:
    kern, coll = load_rows("kernels.csv"), load_rows("collectives.csv")
    more = load_rows("kernels_more.csv")
    refs = build_refs(kern, load_rows("kernels_extra.csv"), more)
    attn = build_attention_refs(more, load_rows("attention_blackwell.csv"),
                                load_rows("attention_fa1.csv"))
    net = N.network_reference(coll, links_for("h100-sxm", coll)[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    built = {}
    for key in GPU_KEYS:
        prof, fits = build_profile(key, kern, coll, refs, attn, net)
        write_profile(prof, out_dir / f"{key}.json")
        built[key] = (prof, fits)
    return built


def summary_lines(built: Mapping[str, tuple[Profile, dict]]) -> list[str]:
    """One line per GPU: the headline coefficients and held-out errors."""
    def v(c: Coefficient | None, fmt: str = ".3f") -> str:
        return "-" if c is None else format(c.value, fmt)
    lines = ["gpu             eff_bf16 eff_fp8 k_half launch_us nvl_bw_eff nvl_alpha_us "
             "nvl_base_us nvl_speedup ib_bw_eff"]
    for key, (p, _) in built.items():
        nv = p.links.get("nvlink") or p.links.get("xgmi") or p.links["roce"]   # Gaudi: RoCE
        e = p.gemm.eff_max
        lines.append(f"{key:15s} {v(e.get('bf16') or e.get('fp16')):8s} {v(e.get('fp8')):7s} "
                     f"{v(p.gemm.k_half, '.0f'):6s} {v(p.gemm.launch_us, '.1f'):9s} "
                     f"{v(nv.bw_eff):10s} {v(nv.alpha_us, '.2f'):12s} {v(nv.base_us, '.1f'):11s} "
                     f"{v(nv.in_switch_speedup):11s} {v(p.links['infiniband'].bw_eff)}")
    fits = {}
    for _, (_, f) in built.items():
        fits.update(f)
    for name, f in sorted(fits.items()):
        lines.append(f"fit {name}: n={f.n_points} train MAPE {f.train_mape_pct:.1f}% held-out "
                     f"MAPE {f.heldout_mape_pct if f.heldout_mape_pct is None else round(f.heldout_mape_pct, 1)}% "
                     f"values {{{', '.join(f'{k}: {x:.4g}' for k, x in sorted(f.values.items()))}}}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m calibrate.reference",
                                 description="Rebuild the shipped reference profiles from "
                                 "the datasheets and published measurements.")
    ap.add_argument("out_dir", nargs="?", type=Path, default=PROFILE_DIR,
                    help=f"folder to write <gpu>.json into (default: {PROFILE_DIR})")
    out = ap.parse_args(argv).out_dir
    built = build_all(out)
    print("\n".join(summary_lines(built)))
    print(f"wrote {len(built)} profiles to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
