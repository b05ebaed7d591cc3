"""simulator.boundary: typed values, work limits, writable outputs and atomic writes."""
from __future__ import annotations

import json

import pytest

from simulator.boundary.files import (
    atomic_path,
    atomic_write_text,
    check_writable,
    json_depth,
    read_json,
)
from simulator.boundary.limits import check_event_slots, using_limits, work_limits
from simulator.boundary.values import check_bool, check_float, check_int, parse_int
from simulator.errors import InvalidInputError


@pytest.mark.parametrize("value", [True, 1.0, "8", None, [8], 0, 11])
def test_check_int_refuses_what_is_not_a_whole_number_in_range(value):
    with pytest.raises(InvalidInputError, match="f="):
        check_int("f", value, 1, 10)


@pytest.mark.parametrize("text, want", [("8", 8), ("1e3", 1000), ("8.0", 8), (" 12 ", 12)])
def test_parse_int_reads_whole_numbers_written_as_text(text, want):
    assert parse_int("f", text, 1, 10**6) == want


@pytest.mark.parametrize("value", [float("nan"), float("inf"), True, "1", 0.0])
def test_check_float_refuses_non_finite_bools_text_and_the_open_bound(value):
    with pytest.raises(InvalidInputError):
        check_float("f", value, 0.0, 1.0, lo_open=True)


def test_check_bool_refuses_strings():
    with pytest.raises(InvalidInputError, match="true or false"):
        check_bool("tie", "no")


def test_work_limit_names_the_inputs_and_can_be_raised():
    with pytest.raises(InvalidInputError, match="--max-event-slots"):
        check_event_slots(work_limits().max_event_slots + 1, "x")
    with using_limits(max_event_slots=10**9):
        check_event_slots(10**6, "x")
    assert work_limits().max_event_slots == 100_000


def test_check_writable(tmp_path):
    (tmp_path / "f").write_text("x")
    check_writable("out", tmp_path / "new.csv")
    check_writable("out", tmp_path / "new" / "dir", directory=True)     # created later
    for bad, directory in (("", False), (tmp_path, False), (tmp_path / "nodir" / "x", False),
                           (tmp_path / "f" / "x", False), (tmp_path / "f", True),
                           (tmp_path / "f" / "x", True)):
        with pytest.raises(InvalidInputError, match="out="):
            check_writable("out", bad, directory)


def test_atomic_write_leaves_the_old_file_when_interrupted(tmp_path):
    p = tmp_path / "out.txt"
    atomic_write_text(p, "old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(p) as tmp:
            tmp.write_text("half")
            raise KeyboardInterrupt
    assert p.read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["out.txt"]


def test_json_depth_and_read_json_limits(tmp_path):
    assert json_depth('{"a": [1, {"b": "[[[["}]}') == 3
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100 + "]" * 100)
    with pytest.raises(InvalidInputError, match="nested at most 64"):
        read_json("cfg", deep, "config")
    nan = tmp_path / "nan.json"
    nan.write_text('{"x": NaN}')
    with pytest.raises(InvalidInputError, match="valid JSON"):
        read_json("cfg", nan, "config")
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"a": [1, 2]}))
    assert read_json("cfg", ok, "config") == {"a": [1, 2]}


def test_atomic_write_gives_the_permissions_a_plain_write_would(tmp_path):
    import os
    import stat

    from simulator.boundary.files import atomic_write_text
    plain, atomic = tmp_path / "plain.txt", tmp_path / "atomic.txt"
    plain.write_text("x")
    atomic_write_text(atomic, "x")
    assert stat.S_IMODE(atomic.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)
    os.chmod(atomic, 0o640)                       # an existing file keeps its mode
    atomic_write_text(atomic, "y")
    assert stat.S_IMODE(atomic.stat().st_mode) == 0o640
