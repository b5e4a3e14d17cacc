"""CPU tests of scripts/device_fa4.py: wheels packed into carry folders under a size limit, the
install gathering them across calls in any order, refusing a corrupted piece, and a real
`pip install --target` of small wheels built here (no FA4 download: the packer's input is a
folder of wheels, whatever they hold).

    python3 -m unittest discover -s python/bench_tests -v
"""
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("device_fa4", ROOT / "scripts" / "device_fa4.py")
fa4 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fa4)


def make_wheel(folder: Path, name: str, payload: bytes) -> Path:
    """A minimal installable wheel holding module `name` with `payload` as data."""
    dist = f"{name}-1.0"
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(f"{name}/__init__.py", "VALUE = 42\n")
        z.writestr(f"{name}/blob.bin", payload)
        z.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        z.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}.dist-info/RECORD", "")
    return path


class PackInstallTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp())
        self.wheels = self.tmp / "wheels"
        self.wheels.mkdir()
        rnd = os.urandom
        # one wheel larger than a part (split), two that share a part, one on its own
        self.big = make_wheel(self.wheels, "bigpkg", rnd(250_000))
        make_wheel(self.wheels, "smalla", rnd(30_000))
        make_wheel(self.wheels, "smallb", rnd(40_000))
        make_wheel(self.wheels, "midpkg", rnd(80_000))

    def tearDown(self):
        subprocess.run(["rm", "-rf", str(self.tmp)])

    def test_the_default_part_fits_beside_the_tree_and_the_binary(self):
        for tree_mb in (0, 19, 28, 40, 53):
            part = fa4.default_part_mb(tree_mb * 1_000_000)
            self.assertLessEqual(part, 42.0)
            if part > 0:
                self.assertLessEqual(tree_mb * 1_000_000 + part * 1_000_000 + 9_500_000, fa4.CARRY_BYTES, tree_mb)
        self.assertEqual(fa4.default_part_mb(19_000_000), 34.0)
        self.assertLessEqual(fa4.default_part_mb(60_000_000), 0, "no room: pack refuses rather than make parts that cannot travel")

    def test_the_tree_counts_tracked_and_untracked_files_but_not_ignored_ones(self):
        repo = self.tmp / "repo"
        repo.mkdir()
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        (repo / ".gitignore").write_text("/big\n")
        (repo / "tracked").write_bytes(b"x" * 1000)
        subprocess.run(["git", "-C", str(repo), "add", "tracked", ".gitignore"], check=True)
        (repo / "untracked").write_bytes(b"y" * 500)
        (repo / "big").write_bytes(b"z" * 100_000)
        self.assertEqual(fa4.tree_bytes(repo), 1000 + 500 + len("/big\n"))
        self.assertEqual(fa4.tree_bytes(self.tmp / "not-a-repo-at-all"), 0)

    def test_parts_stay_under_the_limit_and_hold_every_byte(self):
        limit = 100_000
        parts = fa4.pack(self.wheels, self.tmp / "parts", limit)
        self.assertGreaterEqual(len(parts), 3)
        for d in parts:
            size = sum(f.stat().st_size for f in d.iterdir() if f.name != fa4.MANIFEST)
            self.assertLessEqual(size, limit, d)
            self.assertTrue((d / fa4.MANIFEST).exists())
        pieces = sorted(f for d in parts for f in d.iterdir() if f.name.startswith("bigpkg"))
        self.assertGreaterEqual(len(pieces), 3)
        self.assertEqual(b"".join(p.read_bytes() for p in pieces), self.big.read_bytes())

    def test_install_waits_for_every_piece_in_any_order_then_installs(self):
        parts = fa4.pack(self.wheels, self.tmp / "parts", 100_000)
        stage = self.tmp / "stage"
        for d in reversed(parts[1:]):
            line = fa4.install([d], stage, run_pip=False)
            self.assertIn("still to come", line)
            self.assertFalse((stage / "installed").exists())
        line = fa4.install([parts[0]], stage)
        self.assertIn("installed", line)
        site = stage / "site"
        out = subprocess.run([sys.executable, "-c", "import bigpkg, smalla, smallb, midpkg; print(bigpkg.VALUE)"],
                             env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True)
        self.assertEqual(out.stdout.strip(), "42", out.stderr)
        self.assertEqual((site / "bigpkg" / "blob.bin").stat().st_size, 250_000)
        self.assertIn("already installed", fa4.install([], stage))

    def test_a_corrupted_piece_is_refused_with_the_fix(self):
        parts = fa4.pack(self.wheels, self.tmp / "parts", 100_000)
        victim = next(f for d in parts for f in d.iterdir() if f.name.startswith("bigpkg"))
        data = bytearray(victim.read_bytes())
        data[100] ^= 0xFF
        victim.write_bytes(bytes(data))
        with self.assertRaises(fa4.Fa4Error) as cm:
            fa4.install(parts, self.tmp / "stage", run_pip=False)
        self.assertIn("SHA-256", str(cm.exception))
        self.assertIn("carry the parts again", str(cm.exception))

    def test_a_folder_that_is_not_a_part_is_refused(self):
        empty = self.tmp / "empty"
        empty.mkdir()
        with self.assertRaises(fa4.Fa4Error) as cm:
            fa4.install([empty], self.tmp / "stage", run_pip=False)
        self.assertIn("device_fa4.py pack", str(cm.exception))
        with self.assertRaises(fa4.Fa4Error) as cm:
            fa4.install([self.tmp / "absent"], self.tmp / "stage", run_pip=False)
        self.assertIn("carry", str(cm.exception))

    def test_env_names_the_cutlass_dsl_packages(self):
        line = fa4.pythonpath(Path("/tmp/x"))
        self.assertEqual(line, "/tmp/x/site:/tmp/x/site/nvidia_cutlass_dsl/dsl_packages")


if __name__ == "__main__":
    unittest.main()
