"""Showing a result: the terminal table (``table``), the Chrome/Perfetto trace (``trace``)
and plots (``plots``, matplotlib imported when drawn)."""
