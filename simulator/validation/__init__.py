"""Judging predictions against measured runs: predict every row of a published-runs CSV
with the framework's documented defaults (``predict``) and write the error report
(``report``)."""
