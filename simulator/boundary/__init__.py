"""Checks at the edges of the program: typed single values (``values``), the documented
size limits that bound the work a request can cause (``limits``), and file output that is
checked before the work starts and written atomically (``files``).

Sits just above ``simulator.errors`` so every layer (the core included) can use it.
"""
