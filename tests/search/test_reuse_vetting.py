"""Reuse's transfers vetted by the prior: a transfer the prior scores below a share of its own
pick among random samples gives its place to that pick (``StormConfig.transfer_vetting``)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
from tvm.s_tir import Schedule

from stormdrop.records import MeasureResult, Phase, Record
from stormdrop.search.options import SearchOptions
from stormdrop.search.reuse_phase import Reuse
from stormdrop.search.sketches import make_context
from stormdrop.search.space import Candidate
from stormdrop.search.storm import StormConfig
from stormdrop.storage.database import Database
from stormdrop.target import canonical, host_target
from stormdrop.tuning.kernel_tune import tune_kernel
from stormdrop.tuning.options import KernelOptions
from stormdrop.workloads import parse_kernel


class _Storm:
    """A storm whose picks are given, and a cost model whose prior scores candidates by name."""

    ranks = True

    def __init__(self, scores: dict[str, float], picks: list[str]) -> None:
        self.scores, self.picks, self.asked = scores, picks, []

    def rivals(self, n: int) -> list:
        self.asked.append(n)
        return [SimpleNamespace(key=k) for k in self.picks[:n]]

    def predict(self, cands: list, learn: bool = True) -> list[float]:
        return [self.scores[c.key] for c in cands]


def _vetted(scores, transfers, picks, share=0.5, vet=True, exact=frozenset()):
    storm = _Storm(scores, picks)
    reuse = Reuse(None, SimpleNamespace(name="task"), "llvm", None, storm, storm=storm if vet else None,
                  budget=len(transfers), config=replace(StormConfig(), transfer_vetting=share))
    return [c.key for c in reuse._vetted([SimpleNamespace(key=k) for k in transfers], set(exact))], storm.asked


def test_a_transfer_scored_below_half_a_pick_gives_way_to_it_and_no_other():
    scores = {"t0": 0.1, "t1": 0.5, "p0": 0.8, "p1": 0.3}
    # t1 stays though p0 scores higher (0.5 >= 0.5 x 0.8); t0 (0.1 < 0.4) gives way to p0
    assert _vetted(scores, ["t0", "t1"], ["p0", "p1"]) == (["t1", "p0"], [2])
    assert _vetted(scores, ["t0", "t1"], ["p0", "p1"], share=0.0) == (["t0", "t1"], [])  # off
    assert _vetted(scores, ["t0", "t1"], ["p0", "p1"], vet=False) == (["t0", "t1"], [])  # no storm phase
    # a schedule of this very workload (the hub's) is never replaced, and no pick is drawn for it
    assert _vetted(scores, ["t0", "t1"], ["p0", "p1"], exact={"t0"}) == (["t0", "t1"], [1])
    assert _vetted(scores, ["t0"], ["p0"], exact={"t0"}) == (["t0"], [])


def _degenerate(kernel) -> Candidate:
    """A schedule of ``kernel`` whose tiles put each loop whole in its outermost level: no vector
    loop, no register tile (what a chain of transfers from briefly tuned siblings handed on)."""
    space = make_context(kernel.mod, host_target(), seed=0).generate_design_space()[0]
    sch = Schedule(kernel.mod)

    def outer(inst, inputs, attrs, decision):
        if inst.kind.name == "SamplePerfectTile":
            return [int(sch.get(inputs[0]).extent)] + [1] * (len(decision) - 1)
        return decision

    space.trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=outer)
    return Candidate.from_schedule(sch, Phase.STORM)


def _donor_db(path, spec: str) -> None:
    with Database(path) as d:
        k = parse_kernel(spec)
        entry = d.commit_workload(k.mod, name=k.name, op_class=k.op_class, flops=k.flops)
        cand = _degenerate(k)
        d.commit_record(Record(entry.workload_id, canonical(host_target()), cand.key, cand.trace_json, "[]",
                               MeasureResult(run_secs=(1e-6,) * 3), Phase.STORM, 0.0))


@pytest.mark.slow
def test_a_degenerate_sibling_transfer_gives_way_to_the_priors_pick_unless_it_is_this_workload(tmp_path):
    """A sibling's schedule without a vector loop (stored as very fast) transfers to a matmul of
    another shape: vetted (``transfer_vetting=0.5``) the one trial goes to the prior's pick among
    random samples (a storm trial); by default, or with reuse alone (no storm phase), the transfer
    is measured. The same workload's stored schedule (another database, as the hub) is measured
    as it is."""
    donor = tmp_path / "donor.db"
    _donor_db(donor, "matmul:M=64,N=64,K=64")
    spec = "matmul:M=48,N=80,K=64"

    # the vector veto (on by default) would give the degenerate transfer register tiles first: off here, so
    # that the vetting alone decides (tests/search/test_vectors.py has the veto)
    vetting = replace(StormConfig(), transfer_vetting=0.5, vector_veto=False)

    def one_trial(db, **kw):
        search = SearchOptions(reuse=1, reuse_from=[donor], **{"storm": vetting, **kw})
        return tune_kernel(spec, KernelOptions(trials=1, exploit_trials=0, seed=0, search=search),
                           db=tmp_path / db).tasks[0].trials

    vetted = one_trial("vetted.db")
    assert (vetted["reuse"], vetted["storm"]) == (0, 1), vetted
    plain = one_trial("plain.db", storm=StormConfig())  # the default: not vetted
    assert (plain["reuse"], plain["storm"]) == (1, 0), plain
    alone = one_trial("alone.db", phases=(Phase.REUSE,))
    assert alone["reuse"] == 1 and alone["storm"] == 0, alone
    exact = tmp_path / "exact.db"
    _donor_db(exact, spec)
    same = tune_kernel(spec, KernelOptions(trials=1, exploit_trials=0, seed=0,
                                           search=SearchOptions(reuse=1, reuse_from=[exact], storm=vetting)),
                       db=tmp_path / "same.db").tasks[0].trials
    assert (same["reuse"], same["storm"]) == (1, 0), same
