"""The one CSV reader and validator of the simulator's inputs (sim/csv_fields.py), and that loaders use it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ones_pipeline
from ones_pipeline.sim.csv_fields import integer, number, read_header, read_rows, text
from ones_pipeline.sim.ones_history import read_artifact_profile, read_job_history
from ones_pipeline.sim.truth import TraceError

FIELDS = (text("name"), number("time", low=0), integer("gpus", minimum=1, maximum=4096),
          number("acc", low=0, low_open=True, high=1), text("kind", choices=("a", "b"), lower=True))
HEADER = "name,time,gpus,acc,kind"


def _write(tmp_path: Path, body: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def test_rows_are_typed_and_numbered(tmp_path):
    rows = read_rows(_write(tmp_path, f"\n{HEADER}\n x ,1.5,2,0.5,A\ny,0,1e1,1,b\n"), FIELDS)
    assert [r.number for r in rows] == [1, 2]  # leading blank lines are not rows
    assert rows[0].values == {"name": "x", "time": 1.5, "gpus": 2, "acc": 0.5, "kind": "a"}
    assert isinstance(rows[1]["gpus"], int) and rows[1]["gpus"] == 10
    assert rows[0].raw["kind"] == "A"


@pytest.mark.parametrize("field, value, problem, allowed", [
    ("time", "soon", "non-numeric value 'soon'", "a number >= 0"),
    ("time", "", "non-numeric value ''", "a number >= 0"),
    ("time", "-1", "out-of-range value '-1'", "a number >= 0"),
    ("gpus", "inf", "non-finite value 'inf'", "an integer in [1, 4096]"),
    ("gpus", "1.5", "non-integer value '1.5'", "an integer in [1, 4096]"),
    ("gpus", "0", "out-of-range value '0'", "an integer in [1, 4096]"),
    ("gpus", "1e18", "out-of-range value '1e18'", "an integer in [1, 4096]"),
    ("acc", "0", "out-of-range value '0'", "a number in (0, 1]"),
    ("acc", "1.01", "out-of-range value '1.01'", "a number in (0, 1]"),
    ("kind", "c", "unknown value 'c'", "a, b"),
])
def test_a_bad_value_names_file_row_field_value_and_what_is_allowed(tmp_path, field, value, problem, allowed):
    good = ["x", "1", "2", "0.5", "a"]
    bad = list(good)
    bad[HEADER.split(",").index(field)] = value
    path = _write(tmp_path, f"{HEADER}\n{','.join(good)}\n{','.join(bad)}\n")
    with pytest.raises(TraceError) as exc:
        read_rows(path, FIELDS)
    err = exc.value
    assert (err.path, err.row, err.field) == (str(path), 2, field)
    assert str(err) == f"{path}, row 2, field {field!r}: {problem}; allowed: {allowed}"


def test_an_error_quotes_a_short_prefix_of_a_long_value(tmp_path):
    path = _write(tmp_path, f"{HEADER}\nx,1,{'9' * 5000},0.5,a\n")
    with pytest.raises(TraceError, match="non-finite value '9999") as exc:
        read_rows(path, FIELDS)
    assert len(str(exc.value)) < len(str(path)) + 150


@pytest.mark.parametrize("body, match, row, field", [
    ("", "empty file; expected a header with columns name, time, gpus, acc, kind", None, None),
    (f"{HEADER}\n", r"no data rows \(the file has only a header\)", None, None),
    (f"{HEADER},owner\nx,1,2,0.5,a,me\n", "unknown column 'owner' in the header; allowed columns: name, time", None,
     "owner"),
    ("name,time,acc,kind\nx,1,0.5,a\n", "missing column 'gpus' in the header; allowed columns: name", None, "gpus"),
    (f"{HEADER},time\nx,1,2,0.5,a,1\n", "duplicate column 'time'", None, "time"),
    (f"{HEADER}\nx,1,2,0.5,a\n\nx,1,2,0.5,a\n", "blank row", 2, None),
    (f"{HEADER}\nx,1,2,0.5\n", r"4 fields, expected 5 \(name, time, gpus, acc, kind\)", 1, None),
])
def test_file_and_header_problems(tmp_path, body, match, row, field):
    with pytest.raises(TraceError, match=match) as exc:
        read_rows(_write(tmp_path, body), FIELDS)
    assert (exc.value.row, exc.value.field) == (row, field)


def test_extra_columns_can_be_allowed_and_missing_files_are_named(tmp_path):
    path = _write(tmp_path, f"{HEADER},owner\nx,1,2,0.5,a,me\n")
    assert read_rows(path, FIELDS, extra_columns=True)[0].values["gpus"] == 2
    with pytest.raises(TraceError, match="missing columns 'gpus', 'acc' in the header; required columns"):
        read_rows(_write(tmp_path, "name,time,kind\nx,1,a\n", "m.csv"), FIELDS, extra_columns=True)
    with pytest.raises(TraceError, match="trace file not found") as exc:
        read_rows(tmp_path / "nope.csv", FIELDS, what="trace file")
    assert exc.value.path == str(tmp_path / "nope.csv")
    with pytest.raises(TraceError, match="is not a regular file"):
        read_rows(tmp_path, FIELDS)


def test_read_header_strips_names_and_a_bom(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf\n name , time\n1,2\n")
    assert read_header(path) == ["name", "time"]
    with pytest.raises(TraceError, match="empty file"):
        read_header(_write(tmp_path, "\n\n", "blank.csv"))


HISTORY_HEADER = "id,epoch,epoch_size,num_samples,total_workload,batch_size,lr,initial_loss,loss,acc,throughput"


def test_job_history_runs_split_on_id_and_epoch(tmp_path):
    rows = ["0,1,100,100,300,32,0.1,2.0,1.5,0.3,50", "0,2,100,200,300,32,0.1,2.0,1.0,0.5,50",
            "0,1,100,100,200,64,0.2,2.0,1.2,0.4,90", "4,1,50,50,100,32,0.1,1.0,0.9,0.2,40"]
    blocks = read_job_history(_write(tmp_path, "\n".join([HISTORY_HEADER, *rows]) + "\n"))
    assert [(b.job_id, b.first_row, len(b.samples)) for b in blocks] == [(0, 1, 2), (0, 3, 1), (4, 4, 1)]
    assert blocks[0].samples.tolist() == [100.0, 200.0] and blocks[1].batch_sizes.tolist() == [64]
    with pytest.raises(TraceError) as exc:
        read_job_history(_write(tmp_path, f"{HISTORY_HEADER}\n0,1,100,100,300,32,0.1,2.0,1.5,1.3,50\n", "bad.csv"))
    assert (exc.value.row, exc.value.field) == (1, "acc") and "a number in [0, 1]" in str(exc.value)


def test_artifact_profile_rejects_a_repeated_job(tmp_path):
    body = "id,completion_time,execution_time,waiting_time\n0,10,8,2\n1,12,9,3\n0,11,9,2\n"
    with pytest.raises(TraceError, match=r"repeated job id '0' \(first at row 1\)") as exc:
        read_artifact_profile(_write(tmp_path, body))
    assert (exc.value.row, exc.value.field) == (3, "id")
    assert read_artifact_profile(_write(tmp_path, body[: body.rindex("0,11")], "ok.csv")) == {0: 8.0, 1: 9.0}


# Modules that still parse a CSV themselves. sim/runner.py tells trace formats apart by their header and is to
# call csv_fields.read_header; listed exactly, so the list can only shrink.
OWN_CSV_PARSING = {"sim/csv_fields.py"}


def test_trace_loaders_parse_csv_only_through_csv_fields():
    root = Path(ones_pipeline.__file__).parent
    parsing = re.compile(r"\bcsv\.(reader|DictReader)\(|\bread_csv\(")
    found = {str(p.relative_to(root)) for d in ("sim", "calibration") for p in (root / d).rglob("*.py")
             if parsing.search(p.read_text())}
    assert found <= OWN_CSV_PARSING, f"parse CSV files with sim/csv_fields.py: {sorted(found - OWN_CSV_PARSING)}"
