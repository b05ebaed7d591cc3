"""Time of work on one device: GEMM, memory-bound, attention kernels (``kernels``) and a
transformer layer's passes with their in-layer collectives and overlap interference
(``layer``). The same closed forms the fitters in ``calibrate.fit`` fit."""
