"""The Python entry points: ``ComplexityAnalyzer`` (``analyzer``) with its typed config
(``config``), results (``results``) and experiment ledger (``ledger``); the transformer and
``torch.nn.Module`` paths behind it (``transformer_flow``, ``module_flow``); analysis of any
torch module (``modules``); name resolution through ``hardware_db`` (``catalog``). Like the
CLI, this layer may load ``hardware_db``."""
