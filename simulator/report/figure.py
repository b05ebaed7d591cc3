"""matplotlib, imported only when a picture is drawn (optional extra ``plot``), and saving
a figure so that the same inputs give the same bytes."""
from __future__ import annotations

from pathlib import Path

from ..errors import UnsupportedError


def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UnsupportedError("plots need the optional extra: pip install "
                               "'complexity-framework[plot]' (matplotlib)") from None
    return plt


def save(fig, path: str | Path, tight: bool = True) -> Path:
    """Write ``fig``; ``tight=False``: keep the layout, crop to everything drawn (labels
    placed outside the axes included)."""
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    if tight:
        fig.tight_layout()
    fig.savefig(p, dpi=120, metadata={"Software": None} if p.suffix == ".png" else None,
                bbox_inches=None if tight else "tight")
    pyplot().close(fig)
    return p
