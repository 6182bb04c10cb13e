"""Run rdma-core's Python test suite (Debian's python3-pyverbs ships it) on one device and
write one line per test: outcome, test id and the reason the suite gave (skips, failures).

Usage: python3 pyverbs_driver.py SUITE_DIR DEVICE OUT_FILE
SUITE_DIR holds the suite's `tests/` package, uncompressed. The suite is loaded the way its
own run_tests.py loads it; only the result is recorded differently (run_tests.py prints
unittest's human-readable report).
"""

import os
import sys
import unittest
from importlib.machinery import SourceFileLoader

suite_dir, device, out_file = sys.argv[1:4]
sys.path.insert(0, os.path.join(suite_dir, "tests"))
sys.path.insert(0, suite_dir)
sys.argv = ["run_tests.py", "--dev", device]

from args_parser import parser  # noqa: E402  (the suite's own, after the path is set)

tests = SourceFileLoader("tests", os.path.join(suite_dir, "tests", "__init__.py")).load_module()
parser.parse_args()


def one_line(text):
    """The last line of a traceback or the reason, without tabs or newlines."""
    lines = [l.strip() for l in str(text).strip().splitlines() if l.strip()]
    return (lines[-1] if lines else "").replace("\t", " ")


class Recorder(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.rows = []

    def row(self, outcome, test, reason=""):
        self.rows.append((outcome, test.id(), one_line(reason)))
        print(f"{outcome:5} {test.id()} {one_line(reason)}", file=sys.stderr, flush=True)

    def addSuccess(self, test):
        self.row("pass", test)

    def addFailure(self, test, err):
        self.row("fail", test, self._exc_info_to_string(err, test))

    def addError(self, test, err):
        self.row("fail", test, self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        self.row("skip", test, reason)

    def addExpectedFailure(self, test, err):
        self.row("pass", test, "expected failure")

    def addUnexpectedSuccess(self, test):
        self.row("fail", test, "unexpected success")


# Run last: it forks children that use the parent's context, and when one fails the test
# returns without waiting for the others, which may then still hold the device's address
# (a softrdma device is one process's UDP socket) while the next test opens it.
LAST = {"tests.test_device.DMTest.test_multi_process_alloc_dm"}


def flatten(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from flatten(t)
        else:
            yield t


cases = list(flatten(unittest.TestLoader().loadTestsFromModule(tests)))
ordered = [t for t in cases if t.id() not in LAST] + [t for t in cases if t.id() in LAST]
result = Recorder()
unittest.TestSuite(ordered).run(result)
with open(out_file, "w") as f:
    for outcome, test_id, reason in result.rows:
        f.write(f"{outcome}\t{test_id}\t{reason}\n")
