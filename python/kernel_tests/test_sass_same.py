"""scripts/sass_same.py: two template points compiled and disassembled on the CPU, compared as
text. Checked with baseline.cu against copies of the templates folder: a comment added changes
no instruction (same, exit 0); a knob value that changes the launch's warps does (different,
exit 1, the first differing lines printed); a point that does not compile is an error (exit 2).
Needs .deps/ (NVRTC, nvdisasm); no GPU.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from test_sass_overlap import nvrtc_or_fail  # noqa: E402


class SassSameTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        nvrtc_or_fail()  # under CI=true a missing NVRTC fails here, loudly
        cls.dir = tempfile.TemporaryDirectory()
        cls.copy = Path(cls.dir.name) / "templates"
        shutil.copytree(ROOT / "kernel-templates", cls.copy)
        tpl = cls.copy / "baseline.cu"
        text = tpl.read_text()
        assert "WARPS_PER_CTA = [4]\n" in text, "baseline.cu's spec moved"
        # Another value of its one knob, and a comment in the code: neither is in the original.
        text = text.replace("WARPS_PER_CTA = [4]\n", "WARPS_PER_CTA = [4, 8]\n")
        tpl.write_text(text + "\n// a comment changes no instruction\n")

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def run_same(self, a_knobs: str, b_knobs: str, b_dir: Path | None = None) -> subprocess.CompletedProcess:
        env = dict(os.environ, PYTHONPATH=str(ROOT / ".deps/py"))
        return subprocess.run(
            [sys.executable, str(ROOT / "scripts/sass_same.py"), "--template", "baseline.cu",
             "--a", str(ROOT / "kernel-templates"), a_knobs, "--b", str(b_dir or self.copy), b_knobs, "--d", "64", "--d", "128"],
            capture_output=True, text=True, env=env, timeout=600)

    def test_a_comment_changes_nothing(self):
        r = self.run_same("WARPS_PER_CTA=4", "WARPS_PER_CTA=4")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"D 64: same \(\d+ lines of SASS\)\nD 128: same")

    def test_another_knob_value_is_different_code(self):
        r = self.run_same("WARPS_PER_CTA=4", "WARPS_PER_CTA=8")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("D 64: DIFFERENT", r.stdout)
        self.assertIn("first differences:", r.stdout)

    def test_a_knob_the_template_lacks_is_an_error_naming_it(self):
        r = self.run_same("WARPS_PER_CTA=4", "NO_SUCH_KNOB=1")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("no knob 'NO_SUCH_KNOB'", r.stderr)

    def test_the_cta_count_moves_code_but_not_the_hot_loops(self):
        # The daemon's one build (-DOPTD_COUNT_CTAS=1: the count compiled in, a null counter
        # when timing) against the export build: the tail differs, the key loop does not.
        env = dict(os.environ, PYTHONPATH=str(ROOT / ".deps/py"))
        def run(*extra):
            return subprocess.run(
                [sys.executable, str(ROOT / "scripts/sass_same.py"), "--template", "decode.cu", "--d", "128",
                 "--a", str(ROOT / "kernel-templates"), "", "--b", str(ROOT / "kernel-templates"), "",
                 "--b-define", "OPTD_COUNT_CTAS=1", *extra],
                capture_output=True, text=True, env=env, timeout=600)
        whole = run()
        self.assertEqual(whole.returncode, 1, whole.stdout + whole.stderr)
        self.assertIn("D 128: DIFFERENT", whole.stdout)
        loops = run("--hot-loops")
        self.assertEqual(loops.returncode, 0, loops.stdout + loops.stderr)
        self.assertRegex(loops.stdout, r"D 128: same \([1-9]\d* lines of hot loops\)")


if __name__ == "__main__":
    unittest.main()
