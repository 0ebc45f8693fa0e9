"""The scenario model and the trace generator: validation, and trace invariants as properties."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamassign.files import MAX_TOML_BYTES
from streamassign.pipeline import PipelineError, ScenarioModel, Workload, generate_trace
from streamassign.pipeline.scenarios import EVENTS, Trace

from .conftest import CLICKSTREAM, ORDERS, TOPOLOGIES

WORKLOADS = [Workload.from_file(p) for p in sorted(TOPOLOGIES.glob("*.toml"))]


@st.composite
def models(draw: st.DrawFn) -> ScenarioModel:
    """Valid models over the whole parameter space, kept small so traces are quick."""
    min_clients = draw(st.integers(1, 4))
    min_initial = draw(st.integers(min_clients, 6))
    max_initial = draw(st.integers(min_initial, 8))
    max_clients = draw(st.integers(max_initial, 10))
    rate = st.sampled_from([0.0, 0.01, 0.3, 2.0])
    rates = [draw(rate) for _ in range(6)]
    if not any(rates):
        rates[0] = 1.0
    return ScenarioModel(
        steps=draw(st.integers(0, 25)),
        min_initial_clients=min_initial,
        max_initial_clients=max_initial,
        min_clients=min_clients,
        max_clients=max_clients,
        threads=tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))),
        racks=draw(st.integers(1, 4)),
        max_scale_step=draw(st.integers(1, 3)),
        scale_out_per_hour=rates[0],
        scale_in_per_hour=rates[1],
        crash_per_client_hour=rates[2],
        rolling_restart_per_hour=rates[3],
        expansion_per_hour=rates[4],
        rack_loss_per_hour=rates[5],
        restart_downtime_s=draw(st.sampled_from([0.0, 30.0, 60.0])),
        crash_downtime_s=draw(st.sampled_from([0.0, 600.0, 7200.0])),
        rack_downtime_s=draw(st.sampled_from([0.0, 1800.0])),
        disk_loss_probability=draw(st.sampled_from([0.0, 0.5, 1.0])),
        expansion_factor=draw(st.integers(2, 3)),
        expansion_limit=draw(st.integers(1, 9)),
    )


def check_trace(trace: Trace, model: ScenarioModel, workload: Workload) -> None:
    """Every invariant a trace must hold (see the docstrings of Step and generate_trace)."""
    steps = trace.steps
    assert 1 <= len(steps) <= model.steps + 1
    first = steps[0]
    assert (first.index, first.time_s, first.event) == (0, 0.0, "initial")
    assert first.layout == workload.initial_layout()
    assert set(first.joined) == {m.pid for m in first.members}
    assert model.min_initial_clients <= len(first.members) <= model.max_initial_clients

    seen: dict[str, tuple[int, str]] = {}
    gone_for_good: set[str] = set()
    down: dict[str, float] = {}  # crashed, not back yet -> crash time
    previous: set[str] = set()
    layouts = trace.layouts()
    initial = dict(workload.counts)
    for i, step in enumerate(steps):
        assert step.index == i
        assert step.event in EVENTS
        assert i == 0 or step.time_s >= steps[i - 1].time_s
        pids = [m.pid for m in step.members]
        assert pids == sorted(set(pids)), "members sorted, unique"
        assert 1 <= len(pids) <= model.max_clients, "never zero clients, never above the max"
        for m in step.members:
            assert m.threads in model.threads
            assert m.rack in {f"rack-{k}" for k in range(model.racks)}
            assert seen.setdefault(m.pid, (m.threads, m.rack)) == (m.threads, m.rack)
        current = set(pids)
        joined, left, crashed = set(step.joined), set(step.left), set(step.crashed)
        if i == 0:
            previous = current
            continue
        assert not joined & (previous | gone_for_good | set(down)), "new clients are new"
        assert left <= previous and crashed <= previous and not left & crashed
        back = {r.pid: r for r in step.returning}
        in_place = {p for p in back if p in previous}
        recovered = set(back) - in_place
        for pid, r in back.items():
            assert pid in current and r.down_since_s <= step.time_s
            if pid in in_place:
                assert step.event == "rolling_restart" and r.disk_kept
            else:
                assert step.event == "recover" and down.pop(pid) == r.down_since_s
        assert current == (previous - left - crashed) | joined | recovered
        assert not current & gone_for_good
        gone_for_good |= left
        for pid in crashed:
            down[pid] = step.time_s
        assert len(current) + len(down) <= model.max_clients, "crashed clients count too"
        expected_change = {
            "scale_out": bool(joined) and not (left | crashed | set(back)),
            "scale_in": bool(left) and not (joined | crashed | set(back)),
            "crash": len(crashed) == 1 and not (joined | left | set(back)),
            "rack_loss": bool(crashed) and not (joined | left | set(back)),
            "recover": bool(recovered) and not in_place,
            "rolling_restart": len(in_place) == 1 and not recovered,
            "partition_expansion": not (joined | left | crashed | set(back)),
        }
        assert expected_change[step.event], step
        if step.event == "scale_in":
            assert len(current) >= model.min_clients
        if step.event == "rack_loss":
            racks = {seen[p][1] for p in crashed}
            assert len(racks) == 1 and all(seen[p][1] not in racks for p in current)
        layout = layouts[i]
        assert (step.layout is not None) == (step.event == "partition_expansion")
        before = dict(layouts[i - 1].counts)
        now = dict(layout.counts)
        assert all(now[t] >= before[t] for t in now)
        assert all(now[t] <= initial[t] * model.expansion_limit for t in now)
        if step.layout is not None:
            assert now != before and layout == workload.layout(now, layout.version)
        previous = current


@given(models(), st.sampled_from(WORKLOADS), st.integers(0, 10_000), st.integers(0, 3))
def test_generated_traces_are_valid_and_deterministic(
    model: ScenarioModel, workload: Workload, scenario: int, seed: int
) -> None:
    trace = generate_trace(model, workload, scenario, seed)
    check_trace(trace, model, workload)
    assert generate_trace(model, workload, scenario, seed) == trace


def test_busy_traces_use_every_event() -> None:
    from .conftest import BUSY

    workload = Workload.from_file(ORDERS)
    events = {s.event for sc in range(40) for s in generate_trace(BUSY, workload, sc).steps}
    assert events == set(EVENTS)


def test_seeds_and_scenarios_give_different_traces() -> None:
    workload = Workload.from_file(ORDERS)
    model = ScenarioModel()
    traces = {generate_trace(model, workload, sc, seed) for sc in range(5) for seed in range(3)}
    assert len(traces) == 15


def test_partition_expansion_keeps_copartitioned_topics_equal() -> None:
    workload = Workload.from_file(CLICKSTREAM)
    model = ScenarioModel(expansion_per_hour=50.0, steps=10)
    trace = generate_trace(model, workload, 0)
    last = dict(trace.layouts()[-1].counts)
    assert trace.layouts()[-1].version > 0
    # clicks-by-user (computed) is co-partitioned with user-profiles: grouping still succeeds.
    assert workload.layout(last, 0).task_counts


def test_a_model_where_nothing_can_happen_ends_the_trace_early() -> None:
    model = ScenarioModel(
        min_initial_clients=3,
        max_initial_clients=3,
        max_clients=3,
        scale_out_per_hour=1.0,
        scale_in_per_hour=0.0,
        crash_per_client_hour=0.0,
        rolling_restart_per_hour=0.0,
        expansion_per_hour=0.0,
        rack_loss_per_hour=0.0,
    )
    trace = generate_trace(model, Workload.from_file(ORDERS), 0)
    assert [s.event for s in trace.steps] == ["initial"]


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"max_initial_clients": 0}, "max_initial_clients must be an integer >= 1"),
        ({"min_clients": 0}, "min_clients must be an integer >= 1"),
        ({"crash_per_client_hour": -1}, "crash_per_client_hour must be a finite number >= 0"),
        ({"scale_out_per_hour": float("nan")}, "scale_out_per_hour must be a finite number"),
        ({"disk_loss_probability": 1.5}, "disk_loss_probability must be a probability"),
        ({"threads": ()}, "threads must be a non-empty list"),
        ({"threads": (2, 0)}, "threads must be a non-empty list"),
        ({"min_initial_clients": 5, "max_initial_clients": 3}, "min_initial_clients <= max"),
        ({"max_initial_clients": 12, "max_clients": 10}, "exceeds max_clients"),
        ({"expansion_factor": 1}, "expansion_factor must be an integer >= 2"),
        ({"steps": -1}, "steps must be an integer >= 0"),
    ],
)
def test_impossible_models_are_rejected_with_the_parameter_named(
    params: dict[str, object], message: str
) -> None:
    with pytest.raises(PipelineError, match=message):
        ScenarioModel(**params)  # type: ignore[arg-type]


def test_a_model_with_no_event_rate_but_steps_is_rejected() -> None:
    zero = dict.fromkeys(ScenarioModel().rates(), 0.0)
    names = {
        "scale_out": "scale_out_per_hour",
        "scale_in": "scale_in_per_hour",
        "crash": "crash_per_client_hour",
        "rolling_restart": "rolling_restart_per_hour",
        "partition_expansion": "expansion_per_hour",
        "rack_loss": "rack_loss_per_hour",
    }
    params = {names[k]: v for k, v in zero.items()}
    with pytest.raises(PipelineError, match="every event rate is 0"):
        ScenarioModel().evolve(params)
    assert ScenarioModel().evolve({**params, "steps": 0}).steps == 0


def test_evolve_parses_strings_and_rejects_unknown_names(tmp_path: Path) -> None:
    model = ScenarioModel().evolve({"threads": "1, 8", "steps": "7", "write_rate": "2_000"})
    assert (model.threads, model.steps, model.write_rate) == ((1, 8), 7, 2000.0)
    with pytest.raises(PipelineError, match="unknown parameter 'crash_rate'"):
        ScenarioModel().evolve({"crash_rate": "1"})
    with pytest.raises(PipelineError, match="steps must be an integer"):
        ScenarioModel().evolve({"steps": "many"})
    path = tmp_path / "model.toml"
    path.write_text("steps = 5\nthreads = [2]\ncrash_per_client_hour = 1\n")
    loaded = ScenarioModel.load(path, {"steps": "6"})
    assert (loaded.steps, loaded.threads, loaded.crash_per_client_hour) == (6, (2,), 1.0)
    path.write_text("racks = 0\n")
    with pytest.raises(PipelineError, match=r"model.toml: scenario model: racks"):
        ScenarioModel.load(path)
    # Read as every TOML input: a byte-order mark skipped, bad bytes and size named with the file.
    path.write_bytes(b"\xef\xbb\xbfsteps = 4\n")
    assert ScenarioModel.load(path).steps == 4
    path.write_bytes(b"steps = 4 # \xff\n")
    with pytest.raises(PipelineError, match=r"model.toml: scenario model is not UTF-8"):
        ScenarioModel.load(path)
    path.write_bytes(b"#" * (MAX_TOML_BYTES + 1))
    with pytest.raises(PipelineError, match=r"model.toml: scenario model larger than"):
        ScenarioModel.load(path)
    with pytest.raises(PipelineError, match=r"missing.toml: cannot read scenario model"):
        ScenarioModel.load(tmp_path / "missing.toml")


def test_workloads_fail_early_on_bad_topologies(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="fails grouping: topics not co-partitioned"):
        Workload.from_file(ORDERS, {"orders": 8})
    with pytest.raises(PipelineError, match="not external source topics of the topology: nope"):
        Workload.from_file(ORDERS, {"nope": 3})
    bare = tmp_path / "bare.toml"
    bare.write_text('[[subtopology]]\nid = 0\nsource_topics = ["a"]\n')
    missing = r"bare\.toml: topology bare: no partition count for external topics a"
    with pytest.raises(PipelineError, match=missing):
        Workload.from_file(bare)
    named = tmp_path / "named.toml"
    named.write_text('name = "x"\n')
    with pytest.raises(PipelineError, match=r"named\.toml: topology x has no tasks"):
        Workload.from_file(named)
    broken = tmp_path / "broken.toml"
    broken.write_text("[[subtopology]]\nid = 0\n")
    with pytest.raises(PipelineError, match="missing required key 'source_topics'"):
        Workload.from_file(broken)
