"""The gradient task scheduler on synthetic tasks (no TVM)."""

from __future__ import annotations

import math

import pytest

from stormdrop.tuning.scheduler import GradientScheduler, TaskState


def simulate(tasks, improve, rounds):
    sched = GradientScheduler(tasks)
    order = []
    for _ in range(rounds):
        i = sched.next_task()
        if i is None:
            break
        order.append(i)
        sched.tell(i, improve(i, tasks[i]))
    return sched, order


def test_warm_up_visits_every_task_once_first():
    tasks = [TaskState(1, 1e6, "conv2d") for _ in range(4)]
    _, order = simulate(tasks, lambda i, t: 1e-3, 4)
    assert sorted(order) == [0, 1, 2, 3]


def test_weight_and_latency_attract_rounds():
    # task 0 dominates the model latency (weight 10, slow), task 1 is cheap and done
    tasks = [TaskState(10, 1e9, "conv2d"), TaskState(1, 1e6, "dense")]

    def improve(i, t):
        base = 1e-2 if i == 0 else 1e-5
        return base / (1 + 0.5 * t.rounds)  # keeps improving with more rounds

    _, order = simulate(tasks, improve, 20)
    assert order.count(0) > 3 * order.count(1)


def test_finished_and_dead_tasks_are_skipped():
    tasks = [TaskState(1, 1e6, "a"), TaskState(1, 1e6, "b"), TaskState(1, 1e6, "c")]
    sched = GradientScheduler(tasks)
    for _ in range(3):
        i = sched.next_task()
        sched.tell(i, math.inf if i == 2 else 1e-3, finished=(i == 1))
    assert sched.next_task() == 2  # no valid schedule after its warm-up: one more round first
    sched.tell(2, math.inf)
    picks = {sched.next_task() for _ in range(5)}
    assert picks == {0}  # 1 is finished, 2 still has no valid schedule
    sched.tell(0, 1e-3, finished=True)
    assert sched.next_task() == 2  # only the dead task is left: it keeps being tried
    sched.tell(2, 1e-3, finished=True)
    assert sched.next_task() is None


def test_history_is_monotone():
    t = TaskState(1, 1e6, "a")
    sched = GradientScheduler([t])
    for lat in (3e-3, 2e-3, 5e-3, math.inf, 1e-3):
        sched.tell(0, lat)
    assert t.history == [3e-3, 2e-3, 2e-3, 2e-3, 1e-3]


class _Tuner:
    """A task's tuner that measures ``batch`` candidates a step and never converges."""

    def __init__(self, session, batch=4):
        self.session, self.batch, self.done = session, batch, False

    def step(self, limit=None):
        n = self.batch if limit is None else min(self.batch, limit)
        self.session.result.trials["storm"] += n
        self.session.best = min(self.session.best, 1e-3)

    def finish(self):
        pass


class _Session:
    def __init__(self, best):
        from types import SimpleNamespace

        self.best = best
        self.kernel = SimpleNamespace(flops=1e6, op_class="conv2d")
        self.result = SimpleNamespace(trials={"reuse": 0, "storm": 0, "raindrop": 0, "failed": 0}, tuning_s=0.0,
                                      weight=0)

    def tally(self):
        return {}

    def spent(self):  # the stored records: this run's measurements (no earlier run here)
        t = self.result.trials
        return t["reuse"] + t["storm"] + t["raindrop"]


def _one_builder(build_s, run_s):
    """A gateway's time estimates with one builder: a batch of n candidates takes n builds and n runs."""
    from types import SimpleNamespace

    return SimpleNamespace(candidate_s=lambda: (build_s, run_s), batch_s=lambda n: n * (build_s + run_s),
                           compile_s=lambda n: n * build_s)


def test_a_resumed_drive_goes_on_with_the_tasks_an_earlier_run_never_reached(monkeypatch):
    # tasks 0 and 1 were measured by a killed run (finite best, 8 trials spent); task 2 never was.
    # With 4 trials left, the resumed run must give them to task 2, not restart the warm-up at task 0
    from stormdrop.tuning import budget, driver

    monkeypatch.setattr(driver, "verify_bests", lambda sessions: None)
    sessions = [_Session(2e-3), _Session(3e-3), _Session(math.inf)]
    tuners = [_Tuner(s) for s in sessions]
    stopped = driver.drive(tuners, sessions, [1, 1, 1], budget.Budget(trials=12), used=8)
    assert stopped == "the trial budget"
    assert [driver.measured(s) for s in sessions] == [0, 0, 4]


def test_a_time_budget_covers_the_verification_and_compile_after_the_search(monkeypatch):
    # a fake clock: each step measures one candidate in 10 s, which builds in 5 s and runs in 5 s. Three
    # tasks are verified (10 s each) and the model is compiled (one 5-s build a task) after the
    # search, so a 100-s budget leaves the search until about 100 - 10 - 30 - 15 = 45 s (was: 100 s,
    # and the run ended at 145 s)
    from stormdrop.tuning import budget, driver

    clock = [0.0]
    gateway = _one_builder(5.0, 5.0)

    def verify(sessions):
        clock[0] += 10.0 * len(sessions)

    monkeypatch.setattr(driver, "verify_bests", verify)
    sessions = [_Session(math.inf) for _ in range(3)]
    for s in sessions:
        s.measurer = gateway
    tuners = [_Tuner(s, batch=1) for s in sessions]
    for t in tuners:
        step = t.step

        def timed(limit=None, step=step):
            step(limit)
            clock[0] += 10.0

        t.step = timed
    stopped = driver.drive(tuners, sessions, [1, 1, 1], budget.Budget(deadline=100.0, builds_after=3, clock=lambda: clock[0]))
    assert stopped == "the time budget"
    assert sum(driver.measured(s) for s in sessions) == 5  # steps started at 0, 10, 20, 30 and 40 s
    assert clock[0] + 3 * 5.0 <= 100.0  # verified and compiled by the deadline


def test_a_time_budget_reaches_every_task_before_its_reserve_stops_the_search(monkeypatch):
    # a fake clock: each step takes 10 s, and the gateway's estimate of a lone build + run is huge
    # (60 s: as when a first batch's wall time counted the builders' start-up). The reserve for
    # verifying and compiling afterwards then exceeds the whole budget; still every task gets its
    # first round (a task never reached runs as a naive loop nest) before the search stops
    from stormdrop.tuning import budget, driver

    clock = [0.0]
    monkeypatch.setattr(driver, "verify_bests", lambda sessions: None)
    gateway = _one_builder(30.0, 30.0)
    sessions = [_Session(math.inf) for _ in range(5)]
    for s in sessions:
        s.measurer = gateway
    tuners = [_Tuner(s) for s in sessions]
    for t in tuners:
        def timed(limit=None, step=t.step):
            step(limit)
            clock[0] += 10.0

        t.step = timed
    stopped = driver.drive(tuners, sessions, [1] * 5, budget.Budget(deadline=120.0, builds_after=5, clock=lambda: clock[0]))
    assert stopped == "the time budget"
    measured = [driver.measured(s) for s in sessions]
    assert measured[0] == 4 and min(measured) >= 1  # one round each (the later ones shrunk), then it stops


def _timed_tasks(n, clock, gateway, seconds=2.0):
    """``n`` tasks measuring 8 candidates a step on ``gateway``'s estimates, each candidate moving the
    fake ``clock`` (a one-item list) on by ``seconds``: (sessions, tuners)."""
    from stormdrop.tuning import driver

    sessions = [_Session(math.inf) for _ in range(n)]
    for s in sessions:
        s.measurer = gateway
    tuners = [_Tuner(s, batch=8) for s in sessions]
    for t in tuners:
        def timed(limit=None, step=t.step, t=t):
            before = driver.measured(t.session)
            step(limit)
            clock[0] += seconds * (driver.measured(t.session) - before)

        t.step = timed
    return sessions, tuners


def test_a_trial_cap_under_two_a_task_still_reaches_every_task(monkeypatch, caplog):
    # googlenet at 96x96, 71 tasks, --trials 128: first rounds of 2 reached 63 tasks, the other 8
    # stayed naive loop nests (9 of the model's 15.7 ms). The first rounds keep one trial for each
    # task still waiting; a cap under the task count is said once
    from stormdrop.tuning import budget, driver

    monkeypatch.setattr(driver, "verify_bests", lambda sessions: None)
    sessions = [_Session(math.inf) for _ in range(10)]
    tuners = [_Tuner(s, batch=2) for s in sessions]
    assert driver.drive(tuners, sessions, [1] * 10, budget.Budget(trials=14)) == "the trial budget"
    assert [driver.measured(s) for s in sessions] == [2] * 4 + [1] * 6
    sessions = [_Session(math.inf) for _ in range(10)]
    tuners = [_Tuner(s, batch=2) for s in sessions]
    with caplog.at_level("WARNING", logger="stormdrop.tuning.budget"):
        driver.drive(tuners, sessions, [1] * 10, budget.Budget(trials=7))
    assert [driver.measured(s) for s in sessions] == [1] * 7 + [0] * 3
    told = [r.getMessage() for r in caplog.records if "trial budget too small" in r.getMessage()]
    assert len(told) == 1 and "10 tasks not reached yet and 7 trials left; 3 stay untuned" in told[0], told


def test_first_rounds_that_cannot_all_fit_shrink_so_the_run_ends_by_its_deadline(monkeypatch):
    # a fake clock: a step costs 2 s a candidate; 10 tasks with first rounds of 8 candidates need
    # 160 s, the budget is 100 s. Every task is still reached (a task never reached runs naive), and
    # the later first rounds measure fewer candidates so that the search, its verification (1 s a
    # task) and the model's compile end by the deadline (before: first rounds were never cut: 170 s)
    from stormdrop.tuning import budget, driver

    clock = [0.0]
    monkeypatch.setattr(driver, "verify_bests", lambda sessions: clock.__setitem__(0, clock[0] + len(sessions)))
    sessions, tuners = _timed_tasks(10, clock, _one_builder(0.5, 0.5))
    stopped = driver.drive(tuners, sessions, [1] * 10, budget.Budget(deadline=100.0, builds_after=10, clock=lambda: clock[0]))
    assert stopped == "the time budget"
    measured = [driver.measured(s) for s in sessions]
    # the first round is whole; the second is cut already (the measurer's 1 s a candidate: 9 x 8 do
    # not fit), the later ones by what the rounds took
    assert measured[:2] == [8, 5] and min(measured) >= 1 and sum(measured) < 10 * 8, measured
    assert clock[0] + 10 * 0.5 <= 100.0  # verified, and compiled (one 0.5-s build a task), by the deadline
    warm_up = (30.0, 4)  # the very first round pays the gateway's warm-up: it does not count
    assert budget.first_round_limit(3, [warm_up], 15.0) is None
    assert budget.first_round_limit(3, [warm_up, (10.0, 4)], 40.0) is None  # full rounds fit
    assert budget.first_round_limit(3, [warm_up, (10.0, 4)], 15.0) == 2
    assert budget.first_round_limit(3, [warm_up, (10.0, 4)], -5.0) == 1  # never fewer than one


def test_a_budget_too_short_for_one_candidate_a_task_says_so_once(monkeypatch, caplog):
    # 2 s a candidate, 10 tasks, 40 s: the first two rounds (8 candidates each) take 32 s, and the 8
    # tasks left need 16 s for one candidate each (nothing is left once the finish is kept): 4 are
    # reached by the deadline, 4 stay untuned, and the user is told once (a 62-task model given 60 s
    # came out 8-12x slower than ONNX Runtime, silently)
    from stormdrop.tuning import budget, driver

    clock = [0.0]
    monkeypatch.setattr(driver, "verify_bests", lambda sessions: None)
    sessions, tuners = _timed_tasks(10, clock, _one_builder(0.0, 0.0))
    with caplog.at_level("WARNING", logger="stormdrop.tuning.budget"):
        driver.drive(tuners, sessions, [1] * 10, budget.Budget(deadline=40.0, clock=lambda: clock[0]))
    assert [driver.measured(s) for s in sessions] == [8, 8] + [1] * 4 + [0] * 4
    told = [r.getMessage() for r in caplog.records if "time budget too short" in r.getMessage()]
    assert len(told) == 1 and "8 tasks not reached yet need about 16 s (one candidate each) and 0 s are left" \
        in told[0], told


def test_extensions_rotate_among_the_costliest_tasks():
    # with time left after every task is done, the task with the largest weight x latency over one more
    # than the extensions it had gets the next: one costly task no longer takes every extension (alexnet:
    # one dense layer got 59 raindrop trials while the 5x5 convolution, 2.4 of 4.2 ms lost, got none)
    from stormdrop.tuning.driver import most_costly

    states = [TaskState(1, 1e6, "dense"), TaskState(1, 1e6, "conv2d"), TaskState(1, 1e6, "pool")]
    for t, best in zip(states, (3e-3, 2e-3, 1e-3)):
        t.history.append(best)
    assert most_costly(states, set()) == 0
    assert most_costly(states, set(), {0: 1}) == 1  # 3/2 < 2
    assert most_costly(states, set(), {0: 1, 1: 1}) == 0  # 1.5 > 1 > 1
    assert most_costly(states, {0, 1}, {0: 5}) == 2  # never a task whose extension found nothing new


def test_an_extension_starts_only_if_a_step_as_long_as_the_last_extension_fits(monkeypatch):
    # a fake clock: a step takes 1 s, but an extension's first step (a storm round: evolution on the
    # cost model, then its batch) 30 s. After one extension and 9 short steps, the last 8 steps say
    # 1 s; a second extension at 41 s of a 70.5-s budget would end past 71 s (resnet50's ended 4.9 s
    # past its budget): it is not started
    from stormdrop.tuning import budget, driver

    clock = [0.0]
    monkeypatch.setattr(driver, "verify_bests", lambda sessions: None)

    class Extensible(_Tuner):
        def __init__(self, session):
            super().__init__(session)
            self.plan = [1.0]  # seconds of each step still to come; done when none

        def step(self, limit=None):
            super().step(limit)
            clock[0] += self.plan.pop(0)
            self.done = not self.plan

        def extend(self, storm_trials, exploit_trials):
            self.plan, self.done = [30.0] + [1.0] * 9, False

    sessions = [_Session(math.inf), _Session(math.inf)]
    tuners = [Extensible(s) for s in sessions]
    stopped = driver.drive(tuners, sessions, [2, 1], budget.Budget(deadline=70.5, extend=True, clock=lambda: clock[0]))
    assert stopped == "the time budget"
    assert clock[0] == 41.0  # two first steps, one extension (30 s + 9 x 1 s), no second one
    assert [driver.measured(s) for s in sessions] == [4 * 11, 4]



def test_the_warm_up_takes_the_heaviest_tasks_first(monkeypatch):
    # weight x FLOPs orders the first rounds (ties in the model's order); "in order" keeps the model's.
    # The heaviest convolutions then sample their space before lighter siblings tuned as briefly can
    # hand them a schedule (a many-task model at 120 s kept its heaviest ones at their transfers')
    from stormdrop.tuning import budget, driver

    monkeypatch.setattr(driver, "verify_bests", lambda sessions: None)
    tasks = [TaskState(1, 1e4, "relu"), TaskState(36, 2e7, "conv2d"), TaskState(1, 0, "concat"),
             TaskState(1, 1e5, "relu"), TaskState(1, 1e4, "relu")]
    assert GradientScheduler(tasks, warm_up="heaviest").waiting() == [1, 3, 0, 4, 2]
    assert GradientScheduler(tasks).waiting() == [0, 1, 2, 3, 4]  # the default: the model's order
    with pytest.raises(ValueError, match="warm-up"):
        GradientScheduler(tasks, warm_up="lightest")
    sched = GradientScheduler(tasks, warm_up="heaviest")
    seen = []
    while (i := sched.next_task()) is not None and len(seen) < 5:
        seen.append(i)
        sched.tell(i, 1e-3)
    assert seen == [1, 3, 0, 4, 2]  # every task once before any second round

    order = []

    class Recorded(_Tuner):
        def step(self, limit=None):
            order.append(self.session)
            super().step(limit)
            self.done = True

    for warm_up, want in (("heaviest", [2, 0, 1]), ("in order", [0, 1, 2])):
        sessions = [_Session(math.inf) for _ in range(3)]
        sessions[2].kernel.flops = 1e9
        order.clear()
        driver.drive([Recorded(s) for s in sessions], sessions, [1, 1, 1], budget.Budget(trials=100),
                     warm_up=warm_up)
        assert [sessions.index(s) for s in order] == want, warm_up


def test_diminishing_returns_count_trials_not_rounds():
    """A task whose one round measured nine candidates promises less than one that measured a single
    transfer: in trials the next round goes to the task of one trial, even where its weight x
    latency is half the other's; in rounds (Ansor's unit, the default) both count one round and
    the costlier task takes it again."""
    def pick(unit: str) -> int:
        tasks = [TaskState(1, 1e9, "conv2d"), TaskState(1, 1e9, "dense")]
        sched = GradientScheduler(tasks, unit=unit)
        for _ in range(2):
            i = sched.next_task()
            sched.tell(i, 2e-3 if i == 0 else 1e-3, trials=9 if i == 0 else 1)
        return sched.next_task()

    assert pick("trials") == 1
    assert pick("rounds") == 0
    assert GradientScheduler([]).unit == "rounds"
    with pytest.raises(ValueError, match="unit"):
        GradientScheduler([], unit="seconds")


def test_the_driver_tells_the_scheduler_the_trials_stored(monkeypatch):
    """In trials, ``drive`` counts a task's trials as its stored records (every run's), so a task one
    batch of eight ahead of another waits while a task measured once is reached first; in rounds
    (the default) the costliest task takes the next round again."""
    from stormdrop.tuning import budget, driver

    monkeypatch.setattr(driver, "verify_bests", lambda sessions: None)
    picks = {}
    for unit in ("trials", "rounds"):
        sessions = [_Session(math.inf), _Session(math.inf), _Session(math.inf)]
        tuners = [_Tuner(s, batch=8 if i == 0 else 1) for i, s in enumerate(sessions)]
        picks[unit] = []
        driver.drive(tuners, sessions, [4, 2, 1], budget.Budget(trials=12), unit=unit,
                     on_step=lambda i, used, unit=unit: picks[unit].append(i))
    assert picks["trials"][:3] == picks["rounds"][:3] == [0, 1, 2]  # the warm-up
    assert picks["trials"][3] == 1  # 2 x 1e-3 / 1 trial ahead of 4 x 1e-3 / 8 trials
    assert picks["rounds"][3] == 0  # 4 x 1e-3 / 1 round
