"""Decisions on top of search: time-to-train, GPUs for a deadline, cost and energy,
hardware comparison (``capacity``); scaling curves (``scaling``); sensitivities and
bottlenecks (``whatif``); framework launch arguments for a chosen plan
(``launch_args``)."""
