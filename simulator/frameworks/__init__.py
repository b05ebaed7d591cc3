"""What each training framework does when a run does not say: attention kernel, overlap,
pipeline send style, optimizer conventions. Facts with sources live in
``frameworks.json``; ``defaults`` loads them."""
from __future__ import annotations

from .defaults import (
    CONVENTIONS,
    DEFAULT_FRAMEWORK,
    FRAMEWORKS,
    Conventions,
    FrameworkDefaults,
)
from .host import HOST, FrameworkHost, HostFacts, HostMechanism, HostMode

__all__ = ["CONVENTIONS", "DEFAULT_FRAMEWORK", "FRAMEWORKS", "HOST", "Conventions",
           "FrameworkDefaults", "FrameworkHost", "HostFacts", "HostMechanism", "HostMode"]
