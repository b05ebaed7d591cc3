"""Datasheet facts and published (non-CSV) numbers the reference profiles use, with sources.

Peaks are copied from ``shared/hardware/gpus.csv`` (dense; the same values as
``hardware_db/data/gpus.json``); link bandwidths and NCCL latency constants from
``shared/hardware/links.csv``. Line numbers count the CSV header as line 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Datasheet:
    """The datasheet numbers a reference fit needs for one GPU."""

    peak: Mapping[str, float]            # dense TFLOP/s per dtype
    mem_bw_gbytes_per_s: float
    sm_count: int
    nvlink_gbytes_per_s: float           # per-GPU per-direction scale-up bandwidth
    cite: str


# key prefixes of GA100 parts, which share the A100's measured GEMM, attention and NVLink
# efficiencies (A800 = A100 with its NVLink cut)
AMPERE_A100 = ("a100", "a800")

DATASHEET: Mapping[str, Datasheet] = {
    "v100-sxm-32gb": Datasheet({"fp32": 15.7, "fp16": 125.0}, 900.0, 80, 150.0,
                               "gpus.csv line 2; links.csv line 4"),
    "a100-sxm-40gb": Datasheet({"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
                               1555.0, 108, 300.0, "gpus.csv line 3; links.csv line 6"),
    "a100-sxm-80gb": Datasheet({"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
                               2039.0, 108, 300.0, "gpus.csv line 4; links.csv line 6"),
    "a800-sxm-80gb": Datasheet({"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
                               2039.0, 108, 200.0,
                               "gpus.json 'a800-sxm-80gb' (the A100 SXM4 80GB row, gpus.csv line "
                               "4: same GA100 die); NVLink 200 GB/s/dir (links.json "
                               "'nvlink3-a800')"),
    "a100-pcie-80gb": Datasheet({"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
                                1935.0, 108, 0.0,
                                "gpus.csv line 5 (300 W; NVLink only as a 2-GPU bridge, the node's "
                                "scale-up is PCIe Gen4); links.csv line 21"),
    "l40s": Datasheet({"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05,
                       "fp8": 733.0}, 864.0, 142, 0.0,
                      "gpus.csv line 8 (350 W, GDDR6, PCIe only); links.csv line 21"),
    "h100-sxm": Datasheet({"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5,
                           "fp8": 1979.0}, 3350.0, 132, 450.0,
                          "gpus.csv line 10; links.csv line 8"),
    "h200-sxm": Datasheet({"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5,
                           "fp8": 1979.0}, 4800.0, 132, 450.0,
                          "gpus.csv line 13; links.csv line 8"),
    "b200": Datasheet({"fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0,
                       "fp8": 4500.0}, 7700.0, 148, 900.0, "gpus.csv line 16; links.csv line 10"),
    "h100-pcie": Datasheet({"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5,
                            "fp8": 1513.0}, 2000.0, 114, 0.0,
                           "gpus.csv line 11 (350 W; NVLink only as a 2-GPU bridge, the node's "
                           "scale-up is PCIe Gen5); links.csv line 22"),
    "h800": Datasheet({"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5,
                       "fp8": 1979.0}, 3350.0, 132, 200.0,
                      "gpus.json 'h800' (the H100 SXM5 row, gpus.csv line 10: same GH100 die); "
                      "NVLink 200 GB/s/dir (links.json 'nvlink4-h800')"),
    "gh200": Datasheet({"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5,
                        "fp8": 1979.0}, 4000.0, 132, 450.0,
                       "gpus.json 'gh200' (the H100 SXM5 peaks, gpus.csv line 10: same GH100 "
                       "die; 96 GB HBM3 at 4 TB/s and NVLink 150 GB/s/dir to each of 3 peers: "
                       "JSC JUPITER configuration page)"),
    "b300": Datasheet({"fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0,
                       "fp8": 4500.0}, 7700.0, 160, 900.0, "gpus.csv line 18; links.csv line 10"),
    "gb200": Datasheet({"fp32": 80.0, "tf32": 1250.0, "bf16": 2500.0, "fp16": 2500.0,
                        "fp8": 5000.0}, 8000.0, 148, 900.0,
                       "gpus.csv line 17 (SM count empty there; 148 = B200 die, line 16); "
                       "links.csv line 19"),
    "gb300": Datasheet({"fp32": 80.0, "tf32": 1250.0, "bf16": 2500.0, "fp16": 2500.0,
                        "fp8": 5000.0}, 8000.0, 160, 900.0,
                       "gpus.csv line 19 (SM count empty there; 160 = B300 die, line 18); "
                       "links.csv line 19"),
    "mi325x": Datasheet({"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4,
                         "fp8": 2614.9}, 6000.0, 304, 448.0, "gpus.csv line 22; links.csv line 43"),
    "mi250x": Datasheet({"fp32": 47.85, "bf16": 191.5, "fp16": 191.5}, 1600.0, 110, 350.0,
                        "gpus.json 'mi250x' (gpus.csv line 20 halved: one GCD of the card); "
                        "links.json 'xgmi-mi250x'"),
    "mi355x": Datasheet({"fp32": 157.3, "bf16": 2516.6, "fp16": 2516.6, "fp8": 5033.2},
                        8000.0, 256, 537.6, "gpus.csv 'Instinct MI355X' row; links.csv "
                        "'MI350X/MI355X per GPU (7 links, fully connected 8-GPU mesh)' "
                        "537.6 = 7 x 76.8 (AMD ROCm mi350.rst)"),
    "gaudi2": Datasheet({"bf16": 432.0, "fp8": 865.0}, 2460.0, 2, 262.5,
                        "gpus.csv 'Gaudi 2' row (fp8 865 TF from stas00/ml-engineering's TFLOPS "
                        "table, its note 9: Intel Gaudi 2 white paper); sm_count = its 2 MMEs; "
                        "links.csv 'Gaudi 2 scale-up per card' 262.5 GB/s/dir"),
    "gaudi3": Datasheet({"bf16": 1835.0, "fp8": 1835.0}, 3670.0, 8, 525.0,
                        "gpus.csv 'Gaudi 3 (HL-325L OAM)' row (whitepaper 1835 TF at a 1750 MHz "
                        "MME clock; shipping cards run 1600 MHz, 1677 TF); sm_count = its 8 "
                        "MMEs; links.csv 'Gaudi 3 scale-up per card' 525 GB/s/dir"),
    "mi300x": Datasheet({"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4,
                         "fp8": 2614.9}, 5300.0, 304, 448.0, "gpus.csv line 21; links.csv line 43"),
}

# Per-hop latencies the simulator adds to every ring step (hardware_db/data/links.json uses
# the same NCCL LL constants); the fitted alpha/base are on top of these.
NVLINK_HOP_US = 0.6
NVLINK_HOP_SRC = "links.csv line 63 (NCCL model NVLink per-hop latency, Ring LL = 0.6 us)"
PCIE_HOP_US = 1.0
NET_HOP_US = 2.7

# Fixed per-kernel time (GEMM and memory-bound kernels).
LAUNCH_US = 3.0
LAUNCH_SRC = ("assumed: ~3 us fixed cost per CUDA kernel (launch + ramp/tail), the usual "
              "few-microsecond order of a kernel launch; not identifiable from the shared rows "
              "(a free fit of the A100 bf16 sweep gives 0.3 +/- 7.2 us)")

# Published flash-attention throughput (not in the shared CSVs): fraction of the dense bf16
# peak for head_dim 128, causal, seq 2k-8k (representative, not the best case). FLOPs follow
# the papers' convention (causal counted as half of the full attention matrix).
ATTENTION = {
    "a100": {
        "fwd": (0.58, "FlashAttention-2 paper (Dao 2023, arXiv:2307.08691) Figs. 4-6, A100 "
                      "bf16/fp16, head_dim 128, causal, seq 2k-8k: forward ~170-190 TFLOP/s of "
                      "312 (best case 73%); representative 0.58 (~181 TF) used"),
        "bwd": (0.50, "FlashAttention-2 paper (Dao 2023) Figs. 4-6, A100, head_dim 128, causal, "
                      "seq 2k-8k: backward ~150-165 TFLOP/s of 312 (fwd+bwd best 225 TF = 72%); "
                      "representative 0.50 (~156 TF) used"),
    },
    # FlashAttention-2 on Hopper (no wgmma/TMA): the kernel generation of PyTorch SDPA's flash
    # backend and of 2023-24 training stacks outside Transformer Engine.
    "h100": {
        "fwd": (0.35, "FlashAttention-2 on H100 SXM: FA2 paper (Dao 2023, arXiv:2307.08691) "
                      "reports up to 335 TFLOP/s fwd+bwd on H100; the FA3 paper's (Shah et al. "
                      "2024, arXiv:2407.08608) FA2 baseline, bf16, head_dim 128, causal, seq "
                      "2k-8k, runs forward at ~320-370 TFLOP/s of 989; representative 0.35"),
        "bwd": (0.30, "FlashAttention-2 on H100 SXM backward, FA3 paper's FA2 baseline, head_dim "
                      "128, causal, seq 2k-8k: ~270-310 TFLOP/s of 989; representative 0.30"),
    },
    # Hopper-specific kernels (FlashAttention-3 / cuDNN fused attention, as Transformer
    # Engine uses): the "flash3" attention implementation.
    "h100-flash3": {
        "fwd": (0.62, "FlashAttention-3 paper (Shah et al. 2024, arXiv:2407.08608), H100 SXM "
                      "bf16, head_dim 128, causal, seq 2k-8k: forward ~560-660 TFLOP/s of 989 "
                      "(best case ~740 TF = 75%; cuDNN in the same figures is comparable); "
                      "representative 0.62 (~615 TF) used"),
        "bwd": (0.48, "FlashAttention-3 paper (Shah et al. 2024), H100 bf16 backward, head_dim "
                      "128, causal, seq 2k-8k: ~430-520 TFLOP/s of 989; representative 0.48 "
                      "(~475 TF) used"),
    },
}

# NCCL's tuner constants (NVIDIA/nccl master 5067397 = 2.30.7, src/graph/tuning.cc; copies in
# /work/scratch_net). Microseconds. They price collectives across nodes in
# ``simulator.network.price`` (NetworkModel), as NCCL's own tuner prices them.
NCCL_SRC = "NVIDIA/nccl 2.30.7 (master 5067397) src/graph/tuning.cc"
NCCL_LATENCY = {   # (algorithm, protocol): (base l.151, NVLink step l.159, network step l.171)
    ("ring", "LL"): (6.6, 0.6, 2.7), ("ring", "LL128"): (14.0, 1.9, 4.0),
    ("ring", "Simple"): (8.4, 3.4, 14.0),
    ("tree", "LL"): (6.8, 0.6, 5.0), ("tree", "LL128"): (14.0, 1.25, 8.5),
    ("tree", "Simple"): (8.4, 4.0, 14.0),
}
NCCL_TUNING = {
    "net_overhead_us": (1.0, f"{NCCL_SRC} l.228-233, 406-409: network post overhead on x86 "
                        "(Intel), the floor of a multi-node ring's intra-node step (x3 Simple)"),
    "ring_simple_factor": (1.4, f"{NCCL_SRC} l.647-650: multi-node Simple ring all-reduce "
                           "latency x1.4 ('plateau effect of ring', sm >= 80)"),
    "ll128_eff": (0.92, f"{NCCL_SRC} l.328-329: ring LL128 bus bandwidth x0.92 (120 of 128 "
                  "bytes per line carry data)"),
    "tree_eff": (0.92, f"{NCCL_SRC} l.331: tree all-reduce bus bandwidth x0.92"),
}
# The reference fabric the network fits run on (DGX H100 class: 8 x NDR per node).
NDR_GBYTES_PER_S = 50.0
NDR_SRC = "links.csv 'InfiniBand NDR 4x (400 Gb/s)' 50 GB/s/dir (hardware_db links.json ib-ndr)"
PCIE_GEN5_GBYTES_PER_S = 63.0
LEAF_DOWN_PORTS, SWITCH_RADIX = 32, 64     # hardware_db/data/topology.json
