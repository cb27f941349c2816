"""How a rollout judges a step: the candidate against the stable version's answers in the same
step, and at the last step (100%) against the stable version's step before, whatever requests
of the step before the stable version finished after the weights moved."""

from __future__ import annotations

from coreserve.server.traffic._rollout import RolloutPlan, judge
from coreserve.server.traffic._windows import Window

PLAN = RolloutPlan(candidate=2, steps=(50.0, 100.0), dwell_s=1.0, min_requests=20)
BEFORE = Window(successes=90, failures=10, latencies_s=[0.01] * 90)  # the stable version at 50%


def test_a_step_is_judged_against_the_stable_versions_answers_in_it() -> None:
    candidate = Window(successes=60, failures=40)
    assert judge(PLAN, 0, {2: candidate, 1: Window(successes=90, failures=10)}, 1, None).startswith(
        "step 0: candidate error rate 40.00% against 10.00%"
    )
    assert judge(PLAN, 0, {2: candidate, 1: Window(successes=60, failures=40)}, 1, None) == ""


def test_the_last_step_ignores_the_stable_versions_leftover_requests() -> None:
    failing = Window(successes=60, failures=40)
    # One failed request routed at 50% that ended after the step's windows opened: judged
    # against it, the candidate's 40% would pass; against the step before, it fails.
    leftover = Window(failures=1)
    assert judge(PLAN, 1, {2: failing, 1: leftover}, 1, BEFORE).startswith(
        "step 1: candidate error rate 40.00% against 10.00%"
    )
    slow = Window(successes=20, latencies_s=[0.5] * 20)
    leftover_slow = Window(successes=1, latencies_s=[1.0])  # the slowest requests are the last ones
    assert "p99 500 ms is 50x the stable version's 10 ms" in judge(
        PLAN, 1, {2: slow, 1: leftover_slow}, 1, BEFORE
    )


def test_a_plan_of_one_step_judges_the_candidates_errors_against_none() -> None:
    plan = RolloutPlan(candidate=2, steps=(100.0,), dwell_s=1.0, min_requests=20)
    leftover = Window(failures=3)
    assert judge(plan, 0, {2: Window(successes=19, failures=1), 1: leftover}, 1, None).startswith(
        "step 0: candidate error rate 5.00% against 0.00%"
    )
    assert judge(plan, 0, {2: Window(successes=20, latencies_s=[9.0] * 20), 1: leftover}, 1, None) == ""


def test_too_few_candidate_requests_hold_the_step() -> None:
    assert judge(PLAN, 0, {2: Window(failures=19), 1: Window(successes=100)}, 1, None) is None


def test_a_step_where_the_stable_version_answered_nothing_is_judged_against_the_step_before() -> None:
    plan = RolloutPlan(candidate=2, steps=(50.0, 99.9, 100.0), dwell_s=1.0, min_requests=20)
    failing = Window(successes=60, failures=40)
    assert judge(plan, 1, {2: failing}, 1, BEFORE).startswith(
        "step 1: candidate error rate 40.00% against 10.00%"
    )
