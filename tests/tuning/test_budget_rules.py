"""The budget rules that share a model's trial cap among its tasks (``tuning.budget``; no TVM)."""

from __future__ import annotations


def test_short_budget_shrinks_the_first_batch_so_every_task_is_reached():
    from stormdrop.tuning.budget import first_batch_size

    assert first_batch_size(320, 19, 16) is None  # 19 x 16 = 304 fit: full batches
    assert first_batch_size(256, 19, 16) == 6  # half of 256 / 19: the other half for raindrops
    assert first_batch_size(256, 19, 16) * 19 <= 256 / 2
    assert first_batch_size(10, 40, 16) == 1  # one candidate a task, never none
    assert first_batch_size(128, 71, 16) == 1  # googlenet at 96x96: the rest for its costliest tasks
    assert first_batch_size(100, 0, 16) is None
    assert first_batch_size(None, 19, 16) is None  # no global cap (a time budget decides)


def test_a_global_trial_cap_leaves_every_task_a_raindrop_share():
    """Each task's storm is half its per-task cap, or, where the global cap cannot give every task
    that cap, half of its share of the global cap: the other half is the raindrop's."""
    from stormdrop.tuning.budget import first_batch_size, storm_share

    assert storm_share(None, 8, 128, None) == 64  # no global cap: half the per-task cap
    assert storm_share(4096, 8, 128, None) == 64  # a cap that gives every task its 128
    for trials, tasks in ((128, 8), (128, 11), (200, 19), (512, 11), (1000, 19)):
        first = first_batch_size(trials, tasks, 16)
        storm = storm_share(trials, tasks, 128, first)
        assert storm * tasks <= trials / 2 + tasks * 2, (trials, tasks, storm)  # the rest: raindrops
        assert storm >= (first or 1)  # the first batch is all storm
        assert 128 - storm >= 64  # every task's raindrop may take what its storm left
    assert storm_share(128, 8, 128, first_batch_size(128, 8, 16)) == 8  # was 64: 8 x 16 first storms took all 128


def test_a_model_trial_cap_is_raised_to_give_every_task_without_a_schedule_one_trial():
    from stormdrop.tuning.budget import cap_reaching_every_task

    assert cap_reaching_every_task(128, 0, 189) == 189  # a 189-task network under --trials 128
    assert cap_reaching_every_task(128, 0, 100) == 128  # enough: the cap stays
    assert cap_reaching_every_task(10, 8, 5) == 13  # a resumed run: 8 spent, 5 tasks still without one
    assert cap_reaching_every_task(10, 8, 0) == 10 and cap_reaching_every_task(None, 0, 5) is None


def test_a_global_trial_cap_of_a_few_trials_a_task_shrinks_the_raindrop_batch():
    """Under a cap of a few trials a task, full raindrop batches went to the costliest few tasks:
    a batch is a task's share of the cap, rounded up to an even count, between 2 and the batch."""
    from stormdrop.tuning.budget import raindrop_batch

    assert raindrop_batch(128, 36, 8) == 4  # mnasnet1_0: 3.6 trials a task
    assert raindrop_batch(128, 71, 8) == 2  # googlenet: under 2 a task
    assert raindrop_batch(128, 19, 8) == 8  # resnet18: 6.7 a task, rounded up to 8
    assert raindrop_batch(1000, 19, 8) == 8 and raindrop_batch(None, 19, 8) == 8  # no smaller than it was
    assert raindrop_batch(128, 0, 8) == 8
