"""What the simulator knows about a machine: GPU, link, node and cluster specs
(``specs``), and the calibration profile of measured or published efficiencies
(``profile``). Plain data types; ``hardware_db`` fills them from data files."""
from __future__ import annotations

from .profile import (
                      AttentionModel,
                      Coefficient,
                      GemmModel,
                      LinkCoefficients,
                      MemoryModel,
                      Profile,
)
from .specs import ClusterSpec, Dtype, GPUSpec, LinkKind, LinkSpec, NodeSpec

__all__ = ["AttentionModel", "Coefficient", "GemmModel", "LinkCoefficients", "MemoryModel",
           "Profile", "ClusterSpec", "Dtype", "GPUSpec", "LinkKind", "LinkSpec", "NodeSpec"]
