"""The sub-command registry: each command module registers its argument builder with
``@command(name, help)``; ``simulator.cli.main`` builds the parser from ``COMMANDS``.
(Kept apart from ``main`` so command modules never import the entry point.)"""
from __future__ import annotations

import argparse
from typing import Callable

COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {}


def command(name: str, help_text: str):
    """Register ``add_arguments`` for a sub-command; the parser's ``func`` runs it."""
    def wrap(fn: Callable[[argparse.ArgumentParser], None]):
        COMMANDS[name] = (help_text, fn)
        return fn
    return wrap
