"""Strategy search: the candidate space and its memory pruning (``space``), evaluation on
the analytic and event engines (``executor``), resumable result storage (``store``) and
the ranked search itself (``driver``)."""
