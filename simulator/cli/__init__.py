"""The ``complexity`` command line: sub-command registry (``registry``), entry point
(``main``), and the commands by family (``commands``, ``module``, ``search``) with their
text formatting (``format``)."""
