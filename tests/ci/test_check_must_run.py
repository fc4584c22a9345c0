"""scripts/check_must_run.py against made-up ctest logs: passes only when every pattern matched
tests that all passed."""
import pathlib
import subprocess
import sys
import tempfile
import unittest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "check_must_run.py"


def run(log, patterns):
    with tempfile.TemporaryDirectory() as d:
        log_path = pathlib.Path(d) / "ctest.log"
        list_path = pathlib.Path(d) / "must_run.txt"
        log_path.write_text(log)
        list_path.write_text("# comment\n\n" + "\n".join(patterns) + "\n")
        p = subprocess.run([sys.executable, str(SCRIPT), str(log_path), str(list_path)],
                           capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr


LOG = """\
  1/4 Test  #1: RealModel.Greedy ..................   Passed    1.23 sec
  2/4 Test  #2: RealModel.Chat ....................   Passed    0.50 sec
  3/4 Test  #3: UiBrowser.RouteSliderFallback .....***Skipped   0.02 sec
  4/4 Test  #4: Deploy.HaproxyTwoReplicas .........***Failed    3.00 sec
  5/5 Test  #5: Hostile.Suite .....................***Not Run   0.00 sec
"""


class CheckMustRun(unittest.TestCase):
    def test_all_passed(self):
        rc, out = run(LOG, [r"^RealModel\."])
        self.assertEqual(rc, 0, out)
        self.assertIn("all 2 matched tests passed", out)

    def test_skipped_fails_naming_the_test(self):
        rc, out = run(LOG, [r"^RealModel\.", r"^UiBrowser\."])
        self.assertEqual(rc, 1)
        self.assertIn("UiBrowser.RouteSliderFallback: Skipped", out)

    def test_failed_and_not_run_fail(self):
        rc, out = run(LOG, [r"^Deploy\.", r"^Hostile\."])
        self.assertEqual(rc, 1)
        self.assertIn("Deploy.HaproxyTwoReplicas: Failed", out)
        self.assertIn("Hostile.Suite: Not Run", out)

    def test_missing_fails_naming_the_pattern(self):
        rc, out = run(LOG, [r"^NoSuchTest\."])
        self.assertEqual(rc, 1)
        self.assertIn(r"^NoSuchTest\.: no test of that name ran", out)


if __name__ == "__main__":
    unittest.main()
