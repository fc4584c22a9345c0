"""scripts/check_layers.py: the real tree follows src/layers.txt, and a planted include that goes
up, sideways or past the public API fails the check, naming the file and the include; so does a
public header that declares an outside library's namespace."""
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_layers.py"


def check(root):
    p = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True,
                       text=True)
    return p.returncode, p.stdout + p.stderr


class RealTree(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = pathlib.Path(self.dir.name)
        shutil.copytree(ROOT / "src", self.root / "src")
        shutil.copytree(ROOT / "include", self.root / "include")

    def tearDown(self):
        self.dir.cleanup()

    def plant(self, rel, include):
        path = self.root / rel
        path.write_text(path.read_text() + f'\n#include "{include}"\n')

    def plant_public(self, text):
        path = self.root / "include" / "tandem" / "eval_report.h"
        path.write_text(path.read_text() + "\n" + text)

    def test_the_tree_follows_the_table(self):
        rc, out = check(ROOT)
        self.assertEqual(rc, 0, out)

    def test_an_upward_include_fails(self):
        self.plant("src/model/forward.cpp", "server/api.h")
        rc, out = check(self.root)
        self.assertEqual(rc, 1, out)
        self.assertIn('src/model/forward.cpp: includes "server/api.h"', out)

    def test_a_sideways_include_fails(self):
        self.plant("src/server/metrics.cpp", "client/cloud_link.h")
        rc, out = check(self.root)
        self.assertEqual(rc, 1, out)
        self.assertIn('src/server/metrics.cpp: includes "client/cloud_link.h"', out)

    def test_a_public_header_of_a_higher_layer_fails(self):
        self.plant("src/kernels/kernels.cpp", "tandem/client.h")
        rc, out = check(self.root)
        self.assertEqual(rc, 1, out)
        self.assertIn('includes "tandem/client.h"', out)

    def test_the_cli_may_not_reach_a_new_internal_header(self):
        self.plant("src/cli/main.cpp", "runtime/generate.h")
        rc, out = check(self.root)
        self.assertEqual(rc, 1, out)
        self.assertIn('src/cli/main.cpp: includes "runtime/generate.h"', out)

    def test_a_public_header_includes_no_outside_library(self):
        self.plant_public("#include <nlohmann/json_fwd.hpp>\n")
        rc, out = check(self.root)
        self.assertEqual(rc, 1, out)
        self.assertIn('include/tandem/eval_report.h: includes "nlohmann/json_fwd.hpp"', out)

    def test_a_public_header_declares_no_outside_namespace(self):
        # A forward declaration needs no include, yet names the library to every caller.
        self.plant_public("namespace boost::asio {\nclass io_context;\n}  // namespace boost\n")
        rc, out = check(self.root)
        self.assertEqual(rc, 1, out)
        self.assertIn("include/tandem/eval_report.h: declares namespace boost::asio", out)

    def test_a_public_header_aliases_no_outside_namespace(self):
        self.plant_public("namespace tandem {\nnamespace js = nlohmann;\n}\n")
        rc, out = check(self.root)
        self.assertEqual(rc, 1, out)
        self.assertIn("declares namespace js = nlohmann", out)

    def test_namespaces_inside_tandem_and_in_comments_pass(self):
        self.plant_public("// namespace boost { class io_context; }\n"
                          "namespace tandem {\nnamespace detail {\nstruct X;\n}\n}  // namespace tandem\n"
                          "namespace std {\ntemplate <class T> struct hash;\n}\n")
        rc, out = check(self.root)
        self.assertEqual(rc, 0, out)

    def test_highway_only_in_the_kernels(self):
        self.plant("src/router/mlp.cpp", "hwy/highway.h")
        rc, out = check(self.root)
        self.assertEqual(rc, 1, out)

    def test_a_known_break_that_is_gone_must_leave_the_table(self):
        # A `known` line for an include the tree does not have (as when a break is fixed and its
        # line stays behind).
        table = self.root / "src" / "layers.txt"
        table.write_text(table.read_text() + "known src/model/forward.h server/api.h\n")
        rc, out = check(self.root)
        self.assertEqual(rc, 1, out)
        self.assertIn('src/model/forward.h: the known break "server/api.h" is gone', out)


if __name__ == "__main__":
    unittest.main()
