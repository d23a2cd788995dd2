"""run_pytest.py's rules on a suite's count, fed pytest's reports as pytest hands them to its plugin: the
minimum counts tests that passed; a skip lowers it only when this machine gives its reason; a skip for any
other reason fails the suite; a suite that ran nothing passes only where its reasons are named."""
import types

import run_pytest

SUITE = "diloco_conformance"
LEAST = run_pytest.SUITES[SUITE][0]


def _report(outcome, reason=None, when="call", suite=SUITE):
    return types.SimpleNamespace(nodeid=f"test_{suite}.py::test_{outcome}", when=when,
                                 passed=outcome == "passed", skipped=outcome == "skipped",
                                 longrepr=("test.py", 1, f"Skipped: {reason}") if reason else None)


def _count(reports, machine=()):
    count = run_pytest.Count(machine)
    for r in reports:
        count.pytest_runtest_logreport(r)
    return count


def test_the_minimum_counts_tests_that_passed_not_those_that_skipped():
    assert _count([_report("passed")] * LEAST).too_few([SUITE]) == []
    assert _count([_report("passed")] * (LEAST - 1)).too_few([SUITE]) != []
    # The rule before: a skip counted as a test that ran, so a suite that stopped running tests still passed.
    skipped = [_report("skipped", "torchft needs torch 2 (this is torch 1.13)", when="setup")] * 2
    assert _count([_report("passed")] * (LEAST - 2) + skipped).too_few([SUITE]) != []


def test_a_skip_lowers_the_minimum_only_for_a_reason_this_machine_gives():
    skipped = [_report("skipped", "no CUDA device (the device round needs one)", when="setup")] * 3
    reports = [_report("passed")] * (LEAST - 3) + skipped
    assert _count(reports, machine=("no CUDA device",)).too_few([SUITE]) == []
    # An allowed reason that this machine does not give (it has a GPU): the suite is short.
    short = _count(reports, machine=("torch has no NCCL",)).too_few([SUITE])
    assert len(short) == 1 and short[0].startswith(f"{SUITE}: {LEAST - 3} passed of at least {LEAST} "), short


def test_a_skip_for_another_reason_and_a_suite_wholly_skipped_are_caught():
    count = _count([_report("passed")] * LEAST + [_report("skipped", "could not import 'torchft'")])
    assert count.bad_skips == [f"test_{SUITE}.py::test_skipped: could not import 'torchft'"]
    wholly = _count([_report("skipped", "torchft needs torch 2 (this is torch 1.13)", when="setup")] * LEAST,
                    machine=("torchft needs torch 2",))
    assert wholly.too_few([SUITE]) == []
    assert wholly.wholly_skipped([SUITE], ()) == [f"{SUITE}: torchft needs torch 2 (this is torch 1.13)"]
    assert wholly.wholly_skipped([SUITE], ("torchft needs torch 2",)) == []
