"""The Python entry points: ``ComplexityAnalyzer`` with its experiment ledger
(``analyzer``), analysis of any torch module (``modules``), and name resolution through
``hardware_db`` (``catalog``). Like the CLI, this layer may load ``hardware_db``."""
