"""What each training framework does when a run does not say: attention kernel, overlap,
pipeline send style, optimizer conventions. Facts with sources live in
``frameworks.json``; ``defaults`` loads them."""
from __future__ import annotations

from .defaults import (
    CONVENTIONS,
    DEFAULT_FRAMEWORK,
    FRAMEWORKS,
    LOSS_BYTES,
    MEMORY,
    Conventions,
    FrameworkDefaults,
    LossBytes,
    FrameworkMemory,
    canonical_framework,
    framework_defaults,
    framework_for_hardware,
    framework_memory,
    framework_names,
)
from .host import HOST, FrameworkHost, HostFacts, HostMechanism, HostMode

__all__ = ["CONVENTIONS", "DEFAULT_FRAMEWORK", "FRAMEWORKS", "HOST", "LOSS_BYTES", "MEMORY",
           "Conventions", "FrameworkDefaults", "FrameworkHost", "FrameworkMemory", "HostFacts",
           "HostMechanism", "HostMode", "LossBytes", "canonical_framework", "framework_defaults",
           "framework_for_hardware", "framework_memory", "framework_names"]
