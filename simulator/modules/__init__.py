"""Any ``torch.nn.Module``, traced on the meta device into an op graph (``trace_torch``):
per-op roofline (``op_report``), DDP (``ddp``) and FSDP (``fsdp``) step simulation,
gradient compression (``compression``, ``compression_whatif``), precision what-ifs
(``precision_whatif``), real runs on this host (``run``) and profiles measured under
load (``calib``). torch is imported only inside the functions that need it."""
