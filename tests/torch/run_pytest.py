"""Runs pytest for ctest: `run_pytest.py MIN_TESTS pytest-args...`. Fails when fewer than MIN_TESTS tests
ran (pytest's "no tests collected", exit 5, included), so a test file that silently stops collecting is
noticed instead of passing."""
import sys

import pytest


class Count:
    def __init__(self):
        self.ran = 0

    def pytest_runtest_logreport(self, report):
        if report.when == "call":
            self.ran += 1


def main():
    least = int(sys.argv[1])
    count = Count()
    rc = pytest.main(["-p", "no:cacheprovider"] + sys.argv[2:], plugins=[count])
    if rc == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("run_pytest: no tests collected", file=sys.stderr)
        return 1
    if rc == 0 and count.ran < least:
        print(f"run_pytest: {count.ran} test(s) ran, at least {least} expected", file=sys.stderr)
        return 1
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())
