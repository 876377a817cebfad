"""Fuzzing job specs (issue 40): every spec file, mutated or raw bytes, is accepted or refused with one
clear line within the time budget; an accepted one is within core.limits, and a tick with it beside a good
job does not fail, books no slot twice and still considers the good job."""

from __future__ import annotations

from pathlib import Path

import yaml
from fuzz_values import VALUES, assert_one_clear_line, fuzz_settings, put, within
from hypothesis import given
from hypothesis import strategies as st

from ones_pipeline.config import ConfigError, load_job_spec, load_job_specs
from ones_pipeline.config.jobs import JOB_FIELDS, STOPPING_FIELDS
from ones_pipeline.core.limits import spec_problem
from ones_pipeline.core.types import Cluster
from ones_pipeline.scheduler import SchedulerSettings, TickInputs, plan_tick

GOOD = {"model": "mlp-digits", "per_gpu_batch": 32, "base_lr": 0.05, "max_lr": 0.2, "requested_gpus": 1,
        "max_gpus": 2, "stopping": {"epochs": 2}}
KEYS = sorted(JOB_FIELDS) + [f"stopping.{k}" for k in sorted(STOPPING_FIELDS)] + ["colour", 1, "stopping.x"]
FRAGMENTS = ["model: mlp-digits", "per_gpu_batch: 32", "stopping: {epochs: 1}", "base_lr: 0.1", "max_lr: .nan",
             "max_lr: .inf", "requested_gpus: 100000000000000000000", "a: &a [x, x, x, x, x, x, x, x, x]",
             "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]", "c: [*b, *b, *b, *b, *b, *b, *b, *b, *b]",
             "per_gpu_batch: !!float abc", "d: !!timestamp 2001-13-45", "e: 2001-13-45", "1: a", "? [a]\n: b",
             "- x", "{", "}", "---", "...", "%YAML 1.1", "x: !!python/object/apply:os.system [echo hi]",
             "<<: *a", "name: \"a\\n\"", "  indented: 1", "stopping: {epochs: .inf}", "\t"]


def _write(folder: Path, name: str, data) -> Path:
    path = folder / f"{name}.yaml"
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, allow_unicode=True))
    return path


def check_file(path: Path):
    """The property of one spec file; the spec when accepted."""
    try:
        with within():
            spec = load_job_spec(path)
    except ConfigError as exc:
        assert_one_clear_line(exc, path)
        return None
    assert spec_problem(spec) is None, spec_problem(spec)  # the loader's ranges are the tick's
    return spec


def check_tick(spec, folder: Path) -> None:
    """A tick with ``spec`` beside a good job: no exception, no slot booked twice, the good job not failed."""
    good = load_job_spec(_write(folder, "good", GOOD))
    inputs = TickInputs(now=1000.0, specs={spec.name: spec, "good": good}, finished=frozenset(), runs=[],
                        progress={}, slot_ids=(0, 1), cluster=Cluster((2,)), cursor={})
    with within():
        plan = plan_tick(inputs, SchedulerSettings(params={"generations": 3}))
    slots = [s for launch in plan.launches for s in launch.slot_ids]
    assert len(slots) == len(set(slots))
    assert "good" not in plan.cursor["failed"] and "good" in plan.cursor["viewed"]


@fuzz_settings(40)
@given(st.dictionaries(st.sampled_from(KEYS), VALUES, min_size=1, max_size=3))
def test_a_mutated_spec_is_accepted_or_refused_in_one_line(tmp_path_factory, mutations):
    folder = tmp_path_factory.mktemp("spec")
    data = dict(GOOD)
    for key, value in mutations.items():
        data = put(data, key, value)
    spec = check_file(_write(folder, "job", data))  # a `name` other than "job" is refused by name
    if spec is not None:
        check_tick(spec, folder)


@fuzz_settings(40)
@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=8))
def test_yaml_text_of_hostile_fragments_is_accepted_or_refused_in_one_line(tmp_path_factory, lines):
    folder = tmp_path_factory.mktemp("raw")
    spec = check_file(_write(folder, "job", "\n".join(lines) + "\n"))
    if spec is not None:
        check_tick(spec, folder)


@fuzz_settings(25)
@given(st.binary(max_size=300))
def test_any_bytes_are_accepted_or_refused_in_one_line(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("bytes")
    check_file(_write(folder, "job", data))


@fuzz_settings(10)
@given(st.lists(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=2), min_size=1, max_size=4))
def test_the_sensor_loader_keeps_the_good_specs_beside_any_bad_ones(tmp_path_factory, mutation_sets):
    """``load_job_specs`` (each tick's reader): the good file always loads, each other one is a spec or an
    error naming its file."""
    folder = tmp_path_factory.mktemp("jobs")
    _write(folder, "good", GOOD)
    for i, mutations in enumerate(mutation_sets):
        data = dict(GOOD)
        for key, value in mutations.items():
            data = put(data, key, value)
        data.pop("name", None)
        _write(folder, f"j{i}", data)
    with within():
        specs, errors = load_job_specs(folder)
    assert "good" in specs
    assert len(specs) + len(errors) == len(mutation_sets) + 1
    for err in errors:
        assert_one_clear_line(err, err.path)
