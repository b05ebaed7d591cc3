"""Communication over the fabric.

``fabric``: the cluster's tiers (scale-up port, PCIe, NIC, leaf-spine, spine-core) from
counts and capacities, and where a parallel group lands on them; ``flows``: the flows each
collective algorithm sends (ring, double binary tree, NVLS / NVLSTree, SHARP,
hierarchical, pairwise all-to-all, point-to-point); ``maxmin``: max-min fair sharing of
links; ``price``: a collective's time (latency + slowest flow at its fair rate), cached;
``collectives``: the single-link alpha-beta forms calibration fits; ``topology``: vertex
layout and routes of hardware_db's optional graph (small clusters, tests)."""
