"""A ucudnn.Handle double for the CPU tests of the planner and the torch integration: real
Assignments over a fake benchmarker, and programs that run on flat NumPy arrays."""
from __future__ import annotations

from ucudnn.plan.assignment import Assignments

from executors import array_program
from fakes import FakeAllocator, FakeBenchmarker, favourite, favourite_ms, heuristic


class NumpyHandle:
    """ucudnn.Handle's interface over real Assignments, a fake benchmarker and the fake backends."""

    def __init__(self, settings, cache):
        self.settings = settings
        self.assignments = Assignments(settings, cache, FakeBenchmarker, FakeAllocator(),
                                       pointer=lambda address: address)
        self.stream = None
        self.steps = []  # every step its programs ran

    def favourite(self, problem):
        return favourite(problem)

    def favourite_ms(self, problem):
        return favourite_ms(problem)

    def heuristic(self, problem, limit):
        """The fakes' candidates in their order of speed at the whole batch: the first within `limit`."""
        return heuristic(problem, limit)

    def query(self, problem):
        self.assignments.record(problem)

    def assignment(self, problem):
        return self.assignments.get(problem)

    def program(self, problem, configuration, alpha=1.0, beta=0.0):
        return array_program(problem, configuration, alpha, beta, self.steps)

    def finalize(self, total=None):
        self.assignments.finalize(total)

    def shrink(self, problem, available=None, failed=None, why="no GPU memory for"):
        return self.assignments.shrink(problem, available, failed, why)

    def within(self, problem, limit):
        return self.assignments.within(problem, limit)

    @property
    def shrinks(self):
        return self.assignments.shrinks

    @property
    def wd_limit(self):
        return self.assignments.wd_limit

    def reset(self):
        self.assignments.reset()

    @property
    def wd_result(self):
        return self.assignments.wd_result

    def __len__(self):
        return len(self.assignments)
