"""The Pollux workloads and profiles shipped as package data, and `ones simulate --workload pollux:...`."""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from pathlib import Path

import pytest

from ones_pipeline.cli import main
from ones_pipeline.sim import packaged
from ones_pipeline.sim.ones_catalogue import catalogue
from ones_pipeline.sim.ones_trace import load_ones_trace
from ones_pipeline.sim.runner import detect_workload
from ones_pipeline.sim.truth import TraceError
from ones_pipeline.sim.workloads import load_pollux_workload

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ["ONES_TRACES"]) if os.environ.get("ONES_TRACES") else ROOT.parent / "shared" / "traces"
SHARED_POLLUX = SHARED / "pollux"
MODELS = ("cifar10", "ncf", "deepspeech2", "bert", "yolov3", "imagenet")
SETS = ("workloads", "workloads-0.5", "workloads-1.5")
ALLOWED = ("allowed: pollux:workload-1 ... 8, pollux-0.5:workload-1 ... 8, pollux-1.5:workload-1 ... 8, "
           "or a CSV path")


def _shared_pollux() -> Path:
    if not (SHARED_POLLUX / "workloads").is_dir():
        reason = f"public Pollux traces not found at {SHARED_POLLUX} (set ONES_TRACES)"
        print(f"skipped: {reason}")
        pytest.skip(reason)
    return SHARED_POLLUX


def _packaged_files() -> list[Path]:
    return sorted(p.relative_to(packaged.DATA_DIR) for p in packaged.DATA_DIR.rglob("*") if p.is_file())


def _sim(*extra: str) -> list[str]:
    return ["simulate", "--policies", "fifo", "--processes", "1", "--no-progress", *extra]


# ------------------------------------------------------------------ the data files
def test_packaged_files_are_byte_identical_to_the_public_traces():
    shared = _shared_pollux()
    data = _packaged_files()
    csvs = [p for p in data if p.suffix == ".csv"]
    assert sorted(set(data) - set(csvs)) == [Path("LICENSE"), Path("README.md")]
    expected = sorted(p.relative_to(shared) for p in shared.rglob("*.csv")
                      if p.relative_to(shared).parts[0] in SETS
                      or (p.parent.parent == shared / "traces" and p.parent.name in MODELS))
    assert csvs == expected and sum(p.parts[0] in SETS for p in csvs) == 3 * 8
    assert {p.parts[1] for p in csvs if p.parts[0] == "traces"} == set(MODELS)
    for rel in csvs:
        assert (packaged.DATA_DIR / rel).read_bytes() == (shared / rel).read_bytes(), rel
    assert not (packaged.DATA_DIR / "traces" / "philly.csv").exists()


def test_notice_keeps_the_licence_and_credit():
    text = (packaged.DATA_DIR / "README.md").read_text()
    for needle in ("Apache License 2.0", "Petuum, Inc. / Pollux authors (Qiao et al., OSDI 2021)", "petuum/adaptdl",
                   "osdi21-artifact", "c793c7089bd307462686339d29707925c461f9a9", "simulator/", "unmodified"):
        assert needle in text
    assert "Apache License" in (packaged.DATA_DIR / "LICENSE").read_text()


def test_package_data_globs_cover_every_packaged_file():
    """What pyproject's package-data selects is what a non-editable install (wheel) contains."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["ones_pipeline"]
    assert {"sim/*.json", "core/*.json"} <= set(globs)
    pkg = ROOT / "ones_pipeline"
    selected = {p for g in globs for p in pkg.glob(g) if p.is_file()}
    assert {packaged.DATA_DIR / rel for rel in _packaged_files()} <= selected


# ------------------------------------------------------------------ names
def test_every_name_resolves_to_a_packaged_csv():
    names = packaged.workload_names()
    assert len(names) == 24 and names[0] == "pollux:workload-1" and names[-1] == "pollux-1.5:workload-8"
    for name in names:
        path = packaged.workload_path(name)
        assert path.is_file() and path.is_relative_to(packaged.DATA_DIR)
    assert packaged.workload_path("pollux:workload-6") == packaged.DATA_DIR / "workloads" / "workload-6.csv"
    assert packaged.workload_path("pollux-0.5:workload-2") == packaged.DATA_DIR / "workloads-0.5" / "workload-2.csv"
    assert packaged.workload_path(" Pollux-1.5:Workload-3 ").name == "workload-3.csv"
    assert (packaged.profiles_dir() / "bert" / "placements.csv").is_file()


@pytest.mark.parametrize("name", ["pollux:workload-9", "pollux:workload-0", "pollux-2.0:workload-1", "pollux:",
                                  "pollux:workload-6.csv", "ones:trace-1"])
def test_unknown_names_list_the_allowed_ones(name):
    with pytest.raises(TraceError) as info:
        packaged.workload_path(name)
    assert str(info.value) == f"unknown workload {name!r}; {ALLOWED}"
    with pytest.raises(packaged.UnknownWorkloadError):
        detect_workload(name)


def test_paths_are_not_taken_for_names(tmp_path):
    assert not packaged.looks_like_name("C:\\traces\\w.csv") and not packaged.looks_like_name("w.csv")
    with pytest.raises(TraceError, match="file not found; a workload is pollux:workload-1"):
        detect_workload(tmp_path / "missing.csv")


# ------------------------------------------------------------------ loading
@pytest.mark.parametrize("folder,name", [("workloads", "pollux:workload-6"), ("workloads-0.5", "pollux-0.5:workload-1"),
                                         ("workloads-1.5", "pollux-1.5:workload-8")])
def test_packaged_workload_gives_the_same_jobs_as_the_public_one(folder, name):
    shared = _shared_pollux()
    mine = detect_workload(name)
    assert mine.kind == "pollux" and mine.name == name and mine.profiles == packaged.profiles_dir()
    ours = mine.load()
    theirs = load_pollux_workload(shared / folder / Path(mine.path).name)
    assert [j.spec for j in ours] == [j.spec for j in theirs]
    assert all(j.truth.profile_dir.is_relative_to(packaged.DATA_DIR) for j in ours)
    assert all(j.truth.profile_dir.is_relative_to(shared) for j in theirs)


def test_csv_without_sibling_traces_falls_back_to_the_packaged_profiles(tmp_path):
    csv = tmp_path / "w.csv"
    shutil.copyfile(packaged.workload_path("pollux:workload-3"), csv)
    spec = detect_workload(csv, max_jobs=10)
    assert spec.name is None and spec.profiles == packaged.profiles_dir()
    jobs = load_pollux_workload(csv, max_jobs=10)
    assert [j.spec for j in spec.load()] == [j.spec for j in jobs]
    assert jobs[0].truth.profile_dir.parent == packaged.profiles_dir()


def test_csv_keeps_its_sibling_traces_folder():
    shared = _shared_pollux()
    spec = detect_workload(shared / "workloads" / "workload-1.csv")
    assert spec.profiles == shared / "traces" and spec.name is None


def test_ones_trace_defaults_to_the_packaged_profiles(tmp_path):
    ones = SHARED / "ones_sc21"
    if not (ones / "trace_1.csv").is_file():
        reason = f"ONES trace not found at {ones} (set ONES_TRACES)"
        print(f"skipped: {reason}")
        pytest.skip(reason)
    assert catalogue(ones).pollux_traces_dir == packaged.profiles_dir().resolve()
    spec = detect_workload(ones / "trace_1.csv", max_jobs=3)
    assert spec.kind == "ones" and spec.profiles == packaged.profiles_dir()
    assert len(spec.load()) == 3
    other = tmp_path / "profiles"
    shutil.copytree(packaged.profiles_dir(), other)
    spec = detect_workload(ones / "trace_1.csv", max_jobs=3, profiles=other)
    assert spec.profiles == other
    assert [j.spec for j in spec.load()] == [j.spec for j in load_ones_trace(ones / "trace_1.csv", max_jobs=3)]


def test_ones_catalogue_error_names_the_profiles_option(tmp_path):
    with pytest.raises(TraceError, match="--profiles") as info:
        catalogue(tmp_path, tmp_path / "nope")
    assert str(tmp_path / "nope") in str(info.value)


# ------------------------------------------------------------------ ones simulate
def test_simulate_a_packaged_workload_by_name(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_sim("--workload", "pollux:workload-6", "--jobs", "5", "--out", str(out))) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["policies"]) == {"fifo"}
    assert summary["meta"]["workload_name"] == "pollux:workload-6"
    assert summary["meta"]["profiles"] == str(packaged.profiles_dir())
    assert "simulating pollux:workload-6 (pollux, 5 jobs)" in capsys.readouterr().err


def test_simulate_an_unknown_name_exits_2_with_the_allowed_names(tmp_path, capsys):
    assert main(_sim("--workload", "pollux:workload-9", "--jobs", "5", "--out", str(tmp_path))) == 2
    err = capsys.readouterr().err
    assert f"ones simulate: unknown workload 'pollux:workload-9'; {ALLOWED}" in err
    assert not (tmp_path / "summary.json").exists()


def test_simulate_with_a_missing_profiles_folder_names_it(tmp_path, capsys):
    missing = tmp_path / "no-such-profiles"
    assert main(_sim("--workload", "pollux:workload-6", "--jobs", "5", "--profiles", str(missing))) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "--profiles" in err and "not found" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(_sim("--workload", "pollux:workload-6", "--jobs", "5", "--profiles", str(empty))) == 2
    err = capsys.readouterr().err
    assert str(empty) in err and "profile folder of model" in err


def test_simulate_a_csv_with_other_profiles(tmp_path):
    profiles = tmp_path / "profiles"
    shutil.copytree(packaged.profiles_dir(), profiles)
    csv = tmp_path / "w.csv"
    shutil.copyfile(packaged.workload_path("pollux:workload-2"), csv)
    out = tmp_path / "out"
    assert main(_sim("--workload", str(csv), "--jobs", "4", "--profiles", str(profiles), "--out", str(out))) == 0
    meta = json.loads((out / "summary.json").read_text())["meta"]
    assert meta["workload"] == str(csv) and meta["workload_name"] is None and meta["profiles"] == str(profiles)
