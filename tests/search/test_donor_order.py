"""Which donor reuse tries first with ``fastest_of`` (``search.donors.donors``,
``StormConfig.fastest_donors``): of the nearest k by the class-then-shape order, the fastest whose
shapes are near the nearest's."""

from __future__ import annotations

from stormdrop.records import MeasureResult, Phase, Record
from stormdrop.search.donors import donors
from stormdrop.search.sketches import make_context
from stormdrop.search.space import Candidate
from stormdrop.storage.database import Database
from stormdrop.target import canonical, host_target
from stormdrop.workloads import parse_kernel

TASK = "matmul:M=64,N=64,K=64"
# nearest first by shape; each donor's best record timed this many x 0.1 ms (FLOPs differ too)
DONORS = (("M=64,N=64,K=80", 8.0), ("M=64,N=64,K=96", 1.0), ("M=64,N=80,K=112", 4.0), ("M=128,N=128,K=128", 1.0))


def _commit(d: Database, spec: str, secs: float | None = None):
    k = parse_kernel(spec)
    entry = d.commit_workload(k.mod, name=k.name, op_class=k.op_class, flops=k.flops)
    if secs is not None:
        sch = make_context(k.mod, host_target(), seed=0).generate_design_space()[0]
        cand = Candidate.from_schedule(sch, Phase.STORM)
        d.commit_record(Record(entry.workload_id, canonical(host_target()), cand.key, cand.trace_json, "[]",
                               MeasureResult(run_secs=(secs,) * 3), Phase.STORM, 0.0))
    return entry


def _order(path, fastest_of: int, others=(), exact_too: bool = False) -> list[str]:
    with Database(path) as d:
        task = _commit(d, TASK)
        return [e.name for e, _ in donors(d, task, canonical(host_target()), others, fastest_of=fastest_of,
                                          exact_too=exact_too)]


def _names(tmp_path):
    path = tmp_path / "d.db"
    with Database(path) as d:
        names = [_commit(d, f"matmul:{shape}", 1e-4 * t).name for shape, t in DONORS]
    return path, names


def test_the_nearest_donor_comes_first_with_fastest_of_1(tmp_path):
    path, names = _names(tmp_path)
    assert _order(path, 1) == names


def test_the_fastest_of_the_nearest_k_comes_first_unless_its_shapes_are_far_from_the_nearests(tmp_path):
    path, names = _names(tmp_path)
    # FLOPs a second (x 64*64*2 / 0.1 ms): 80/8, 96/1, 112*80/64/4, 128^3/64^3: the fourth is the
    # fastest but its shapes are 4.2 from the task's, the nearest's 0.45 (FASTEST_WITHIN 2): the second
    # comes first, the others in order
    assert _order(path, 3) == [names[1], names[0], names[2], names[3]]
    assert _order(path, 8) == [names[1], names[0], names[2], names[3]]
    assert _order(path, 2) == [names[1], names[0], names[2], names[3]]


def test_the_tasks_very_workload_elsewhere_stays_first(tmp_path):
    path, names = _names(tmp_path)
    other = tmp_path / "other.db"
    with Database(other) as o:
        _commit(o, TASK, 9e-4)  # slower than every donor, but this very workload
    with Database(other, read_only=True) as o:
        assert _order(path, 3, [o])[:2] == [parse_kernel(TASK).name, names[1]]


def test_with_exact_too_the_very_workload_elsewhere_competes_on_speed(tmp_path):
    """``exact_too`` (``StormConfig.fastest_exact``): this very workload tuned elsewhere is one of the
    nearest k at distance 0, first only where it is the fastest of them."""
    path, names = _names(tmp_path)
    task = parse_kernel(TASK).name
    for secs, first in ((9e-4, names[1]), (1e-5, task)):  # slower than the fastest donor, then faster
        other = tmp_path / f"other{secs}.db"
        with Database(other) as o:
            _commit(o, TASK, secs)
        with Database(other, read_only=True) as o:
            order = _order(path, 3, [o], exact_too=True)
            assert order[0] == first and set(order) == {task, *names}
            assert _order(path, 3, [o])[0] == task  # without it: always first
