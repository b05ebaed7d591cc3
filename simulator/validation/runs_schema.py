"""The runs CSV (``validation/published_runs.csv`` schema) at its boundary.

* The file: at most ``MAX_CSV_BYTES`` / ``MAX_CSV_ROWS``; comma-delimited (a file whose
  header is one cell holding ``;`` or a tab is refused, naming the delimiter); the header
  names ``REQUIRED`` and either ``model`` or every column of ``MODEL_DIMS``.
* Each row on its own (``check_row``): as many cells as the header, integers where the
  schema has integers (within ``boundary.limits``), a GPU key. A bad row raises one
  ``InvalidInputError`` naming its column; ``predict_row`` turns that into the row's
  status ``invalid: <column>: <why>`` and every other row is still predicted.
* ``measured_value``: the measured step time, ``None`` when empty; ``InvalidInputError``
  when present but not a finite number > 0 (the row is predicted, its error left empty).
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Mapping

from ..boundary import limits as L
from ..boundary.values import parse_float, parse_int
from ..errors import InvalidInputError

REQUIRED = ("gpu", "n_gpus", "tp", "pp", "global_batch")
MODEL_DIMS = ("n_layers", "hidden", "ffn_hidden", "seq_len", "vocab")
G = L.MAX_GPUS
INT_COLUMNS: dict[str, tuple[int, int]] = {
    "n_layers": (1, L.MAX_LAYERS), "hidden": (1, L.MAX_HIDDEN), "ffn_hidden": (1, L.MAX_FFN),
    "n_heads": (1, L.MAX_HEADS), "n_kv_heads": (1, L.MAX_HEADS), "seq_len": (1, L.MAX_SEQ_LEN),
    "vocab": (1, L.MAX_VOCAB), "moe_experts": (1, L.MAX_EXPERTS), "moe_topk": (1, L.MAX_EXPERTS),
    "moe_ffn_hidden": (1, L.MAX_FFN), "moe_shared_experts": (0, L.MAX_EXPERTS),
    "moe_dense_layers": (0, L.MAX_LAYERS),
    "n_gpus": (1, G), "gpus_per_node": (1, L.MAX_GPUS_PER_NODE),
    "nics_per_node": (1, L.MAX_NICS_PER_NODE),
    "tp": (1, G), "pp": (1, G), "dp": (1, G), "cp": (1, G), "ep": (1, G), "vpp": (1, 4096),
    "micro_batch": (1, L.MAX_BATCH), "global_batch": (1, L.MAX_BATCH), "zero_stage": (0, 3),
}
FLOAT_COLUMNS: dict[str, tuple[float, float]] = {"nic_gbps": (0.0, L.MAX_NIC_GBPS)}


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """The rows of a runs CSV, after the file-level checks above."""
    p = Path(path)
    if not p.is_file():
        raise InvalidInputError("runs", str(p), "an existing CSV file")
    if p.stat().st_size > L.MAX_CSV_BYTES:
        raise InvalidInputError("runs", str(p), f"a CSV of at most {L.MAX_CSV_BYTES:,} bytes")
    try:
        with p.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = list(reader.fieldnames or [])
            check_header(str(p), header)
            rows = []
            for row in reader:
                rows.append(row)
                if len(rows) > L.MAX_CSV_ROWS:
                    raise InvalidInputError("runs", str(p),
                                            f"a CSV of at most {L.MAX_CSV_ROWS:,} rows")
    except (UnicodeDecodeError, csv.Error) as exc:
        raise InvalidInputError("runs", str(p), "a UTF-8 CSV file", str(exc)) from None
    if not rows:
        raise InvalidInputError("runs", str(p), "a CSV with a header and at least one row")
    return rows


def check_header(shown: str, header: list[str]) -> None:
    if len(header) <= 1:
        first = header[0] if header else ""
        for sep, name in ((";", "semicolon"), ("\t", "tab"), ("|", "pipe")):
            if sep in first:
                raise InvalidInputError("runs", shown, "a comma-separated CSV",
                                        f"the header is {name}-separated")
    names = [h.strip() for h in header]
    missing = [c for c in REQUIRED if c not in names]
    if "model" not in names:
        missing += [c for c in MODEL_DIMS if c not in names]
    if missing:
        raise InvalidInputError("runs", shown, "a CSV whose header names " + ", ".join(REQUIRED)
                                + " and model (or " + ", ".join(MODEL_DIMS) + ")",
                                "missing column(s): " + ", ".join(missing))


# cells that say "not used" in an integer column; they read as empty (the default: 1 for
# the parallel degrees, no interleaving for vpp, the framework's choice for micro_batch)
NOT_APPLICABLE = ("-", "n/a", "na", "none", "null", "--")


# columns where "not used" is the count 0, not the default (which may be a framework's ZeRO
# stage or a preset's shared experts)
ZERO_WHEN_UNUSED = ("zero_stage", "moe_shared_experts", "moe_dense_layers")


def blank_not_applicable(row: dict) -> None:
    """In place: integer cells holding a not-used marker become empty (0 where the column
    counts something, ``ZERO_WHEN_UNUSED``; 1 for ``vpp``), and a ``vpp`` of 0 (Megatron's
    "no virtual pipeline") becomes 1."""
    for col in INT_COLUMNS:
        v = row.get(col)
        if isinstance(v, str) and v.strip().lower() in NOT_APPLICABLE:
            row[col] = "1" if col == "vpp" else ("0" if col in ZERO_WHEN_UNUSED else "")
    if isinstance(row.get("vpp"), str) and row["vpp"].strip() in ("0", "0.0"):
        row["vpp"] = "1"


def check_row(row: Mapping[str | None, object]) -> None:
    """Raise ``InvalidInputError`` naming the first bad cell of one row."""
    if None in row:
        raise InvalidInputError("row", f"{len(row) - 1 + len(row[None])} cells",
                                f"{len(row) - 1} cells, as many as the header")
    short = [k for k, v in row.items() if v is None]
    if short:
        raise InvalidInputError("row", f"{len(row) - len(short)} cells",
                                f"{len(row)} cells, as many as the header")
    if not str(row.get("gpu") or "").strip():
        raise InvalidInputError("gpu", "", "a GPU key (see `complexity list gpus`)")
    for col, (lo, hi) in INT_COLUMNS.items():
        text = str(row.get(col) or "").strip()
        if text:
            parse_int(col, text, lo, hi)
    for col, (lo, hi) in FLOAT_COLUMNS.items():
        text = str(row.get(col) or "").strip()
        if text:
            parse_float(col, text, lo, hi, lo_open=True)


def measured_value(row: Mapping[str, object], col: str = "measured_step_time_s") -> float | None:
    text = str(row.get(col) or "").strip()
    if not text:
        return None
    return parse_float(col, text, 0.0, lo_open=True)


def invalid_status(exc: InvalidInputError) -> str:
    return f"invalid: {exc.field}: {exc.valid} (got {exc.value!r})"
