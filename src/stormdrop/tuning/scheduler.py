"""Task scheduler: which task of a model gets the next batch (Ansor's gradient scheduler).

Objective: sum_i w_i * g_i, g_i the best latency of task i. After a warm-up
round-robin pass, the task with the most negative estimated gradient

    grad_i = w_i * (alpha * backward_i + (1 - alpha) * forward_i)
    backward_i = (g_i(t) - g_i(t - window)) / window
    forward_i  = min(g_i - g_i / t_i, beta * flops_i / best_similar_throughput) - g_i

gets the next batch (t_i: rounds given to task i; similar tasks share the op
class and log_1.618 of their FLOPs). Ansor's rounds all measure the same number of candidates;
here they do not (a first round of one transfer, a raindrop round of eight), so t_i may count
the trials a task measured instead (``unit="trials"``): a small trial cap then gives first
raindrop rounds to more tasks instead of second rounds to the heaviest. It lowered the tasks'
summed weight x latency as tuned but not the models' latency: not the default (RESULTS.md,
"Small inputs and budgets", the scheduler's unit). A task whose warm-up round found no valid
schedule gets one more round; tasks that are finished or still have none after
it (dead) are skipped. The scheduler proposes a
task index and is told the task's best latency after each round.

The warm-up (``WARM_UPS``) goes in the model's order, or with ``warm_up="heaviest"`` heaviest
(weight x FLOPs) first: the heaviest tasks then sample their design space before lighter siblings
tuned as briefly can hand them a schedule, and the lighter ones start from theirs.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

# warm-ups, the default first: "in order" (the model's, as Ansor's round robin), "heaviest" first
WARM_UPS = ("in order", "heaviest")
# what a task's diminishing returns count, the default first: its rounds (Ansor's), or its measured trials
UNITS = ("rounds", "trials")


@dataclass
class TaskState:
    weight: float
    flops: float
    op_class: str
    history: list[float] = field(default_factory=list)  # best latency after each round (inf: none yet)
    finished: bool = False
    trials: int = 0  # candidates measured so far, as told

    @property
    def rounds(self) -> int:
        return len(self.history)

    @property
    def best(self) -> float:
        return self.history[-1] if self.history else math.inf

    @property
    def similarity_key(self) -> tuple[str, int]:
        return self.op_class, int(math.log(max(self.flops, 1.0), 1.618))


class GradientScheduler:
    """Ansor's gradient-based task scheduler (alpha 0.2, beta 2, backward window 3), its warm-up
    ``warm_up`` (``WARM_UPS``), its diminishing returns counted in ``unit`` (``UNITS``)."""

    def __init__(self, tasks: list[TaskState], *, alpha: float = 0.2, beta: float = 2.0, window: int = 3,
                 eps: float = 0.0, seed: int = 0, warm_up: str = WARM_UPS[0], unit: str = UNITS[0]) -> None:
        if warm_up not in WARM_UPS:
            raise ValueError(f"warm-up {warm_up!r}: one of {', '.join(WARM_UPS)}")
        if unit not in UNITS:
            raise ValueError(f"unit {unit!r}: one of {', '.join(UNITS)}")
        self.tasks, self.warm_up, self.unit = tasks, warm_up, unit
        self.alpha, self.beta, self.window, self.eps = alpha, beta, window, eps
        self.rng = random.Random(seed)

    def live(self) -> list[int]:
        return [i for i, t in enumerate(self.tasks) if not t.finished]

    def waiting(self) -> list[int]:
        """The tasks yet to have a round, in warm-up order (``warm_up``)."""
        waiting = [i for i in self.live() if self.tasks[i].rounds == 0]
        if self.warm_up == "in order":
            return waiting
        return sorted(waiting, key=lambda i: -self.tasks[i].weight * self.tasks[i].flops)

    def next_task(self) -> int | None:
        """The index of the task to tune next, or None when every task is finished."""
        live = self.live()
        if not live:
            return None
        waiting = self.waiting()
        if waiting:  # warm-up: one round each
            return waiting[0]
        for i in live:  # a second round for a task whose first found no valid schedule
            if self.tasks[i].rounds == 1 and not math.isfinite(self.tasks[i].best):
                return i
        alive = [i for i in live if math.isfinite(self.tasks[i].best)]
        if not alive:  # nothing valid anywhere yet: keep going round robin
            return min(live, key=lambda i: self.tasks[i].rounds)
        if self.eps and self.rng.random() < self.eps:
            return self.rng.choice(alive)
        return min(alive, key=self.gradient)

    def gradient(self, i: int) -> float:
        t = self.tasks[i]
        g, rounds = t.best, t.rounds
        if rounds > self.window and math.isfinite(t.history[-1 - self.window]):
            backward = (g - t.history[-1 - self.window]) / self.window
        else:
            backward = 0.0
        best_tput = max((s.flops / s.best for s in self.tasks
                         if s.similarity_key == t.similarity_key and math.isfinite(s.best) and s.best > 0),
                        default=0.0)
        spent = t.trials if self.unit == "trials" and t.trials > 0 else rounds
        g_next = g - g / max(spent, 1)
        if best_tput > 0:
            g_next = min(g_next, self.beta * t.flops / best_tput)
        forward = g_next - g
        return t.weight * (self.alpha * backward + (1 - self.alpha) * forward)

    def tell(self, i: int, best_latency: float, finished: bool = False, trials: int | None = None) -> None:
        """Task ``i`` had a round; its best latency is now ``best_latency`` (inf if none), and it has
        measured ``trials`` candidates in all (None: one more round's worth is not known; counted as one)."""
        t = self.tasks[i]
        t.history.append(min(best_latency, t.best))
        t.trials = trials if trials is not None else t.trials + 1
        t.finished = t.finished or finished
