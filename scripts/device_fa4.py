#!/usr/bin/env python3
"""FlashAttention-4 onto the GPU machine in as few device calls as its transfer limit allows.

FA4 (flash-attn-4, the Hopper peer every benchmark times beside SDPA) is not installed on the
GPU machine, which has no network: its wheels travel in the working tree, and one call carries at
most 64 MiB of it (../shared/notes/fa4-on-device.md). The largest wheel alone is 92 MB. This packs
the pinned wheels into carry folders under a size, splitting large files, and installs them there
once every piece has arrived, whatever the order of the calls:

    # the CPU machine (network): download once, pack into folders that each fit one call beside the
    # working tree and the gzipped binary (--part-mb, default from the tree's size: 5 folders at 28 MB)
    python3 scripts/device_fa4.py pack            # prints the folders, one per device call
    # the GPU machine, one call per folder (carry it), back to back; the last call completes the install
    python3 scripts/device_fa4.py install .dev/fa4/parts/part1
    ...
    python3 scripts/device_fa4.py install .dev/fa4/parts/part5   # carry it with .dev/bin and start a run
    # then, in any later command on that warm machine
    eval "$(python3 scripts/device_fa4.py env)"   # PYTHONPATH for flash_attn.cute

`install` copies the pieces it finds into /tmp/fa4 (which outlives a call while the machine is
warm), says which are still missing, and when none is, joins the split files, checks every
file's SHA-256 against the manifest the pack wrote and runs `pip install --no-index --no-deps
--target /tmp/fa4/site`. Installing again is a no-op. Standard library only.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

# The set that imported and ran on the H100 (torch 2.11, CUDA 13.0, Python 3.12) on 2026-11-24.
WHEELS = [
    "flash-attn-4==4.0.0b36",
    "nvidia-cutlass-dsl==4.8.1",
    "nvidia-cutlass-dsl-libs-base==4.8.1",
    "nvidia-cutlass-dsl-libs-core==4.8.1",
    "nvidia-cutlass-dsl-libs-cu13==4.8.1",
    "apache-tvm-ffi==0.1.15.post2",
    "quack-kernels==0.6.5",
    "torch-c-dlpack-ext==0.1.5",
]
MANIFEST = "fa4-manifest.json"
STAGE = Path(os.environ.get("OPTD_FA4_STAGE", "/tmp/fa4"))


class Fa4Error(Exception):
    pass


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_24_x86_64",
           "--platform", "any", "-d", str(dest), *WHEELS]
    if subprocess.run(cmd).returncode != 0:
        raise Fa4Error(f"pip download of the FA4 wheels into {dest} failed (needs the package index); "
                       f"or put the wheels there by hand and pass --wheels {dest}")


def pack(wheels: Path, out: Path, part_bytes: int) -> list[Path]:
    """Split every wheel into pieces of at most part_bytes and place the pieces in as few folders of
    at most part_bytes as first-fit decreasing finds; each folder gets the whole manifest."""
    files = sorted(wheels.glob("*.whl"))
    if not files:
        raise Fa4Error(f"no wheels in {wheels}: run `python3 scripts/device_fa4.py pack` with the package index "
                       "reachable, or pass --wheels DIR holding them")
    pieces = []  # (name of the piece, source file, offset, size)
    manifest = {"files": []}
    for f in files:
        size = f.stat().st_size
        names = []
        for i, off in enumerate(range(0, size, part_bytes)):
            n = min(part_bytes, size - off)
            name = f.name if size <= part_bytes else f"{f.name}.piece{i:02d}"
            pieces.append((name, f, off, n))
            names.append(name)
        manifest["files"].append({"name": f.name, "sha256": sha256(f), "size": size, "pieces": names})
    bins: list[list] = []
    for piece in sorted(pieces, key=lambda p: -p[3]):
        for b in bins:
            if sum(p[3] for p in b) + piece[3] <= part_bytes:
                b.append(piece)
                break
        else:
            bins.append([piece])
    if out.exists():
        shutil.rmtree(out)
    parts = []
    for i, b in enumerate(bins, 1):
        d = out / f"part{i}"
        d.mkdir(parents=True)
        for name, src, off, n in b:
            with open(src, "rb") as fi, open(d / name, "wb") as fo:
                fi.seek(off)
                fo.write(fi.read(n))
        (d / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        parts.append(d)
    return parts


def install(sources: list[Path], stage: Path, run_pip: bool = True) -> str:
    """Gather the pieces of `sources` into stage/pieces; install when complete. Returns a status line."""
    site = stage / "site"
    if (stage / "installed").exists():
        return f"FA4 already installed in {site}"
    pieces = stage / "pieces"
    pieces.mkdir(parents=True, exist_ok=True)
    manifest = None
    for src in sources:
        if not src.is_dir():
            raise Fa4Error(f"{src}: no such folder (carry it in this call: run's `carry` list)")
        for f in src.iterdir():
            if f.name == MANIFEST:
                manifest = json.loads(f.read_text())
                shutil.copy(f, stage / MANIFEST)
            elif f.is_file():
                shutil.copy(f, pieces / f.name)
    if manifest is None:
        if not (stage / MANIFEST).exists():
            raise Fa4Error(f"no {MANIFEST} in {', '.join(map(str, sources)) or 'the arguments'}: "
                           "pass a folder written by `device_fa4.py pack`")
        manifest = json.loads((stage / MANIFEST).read_text())
    missing = [p for e in manifest["files"] for p in e["pieces"] if not (pieces / p).exists()]
    if missing:
        return f"FA4: {len(missing)} piece(s) still to come ({', '.join(missing)}); carry the next part folder and run install again"
    whl = stage / "whl"
    whl.mkdir(exist_ok=True)
    for e in manifest["files"]:
        target = whl / e["name"]
        with open(target, "wb") as fo:
            for p in e["pieces"]:
                fo.write((pieces / p).read_bytes())
        got = sha256(target)
        if got != e["sha256"]:
            raise Fa4Error(f"{e['name']}: SHA-256 {got} is not the packed {e['sha256']} (a piece was cut short "
                           f"in transfer?): delete the stage folder {stage} and carry the parts again")
    if run_pip:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--target", str(site), *sorted(map(str, whl.glob("*.whl")))]
        if subprocess.run(cmd).returncode != 0:
            raise Fa4Error(f"pip install of {whl} into {site} failed (its output is above)")
    (stage / "installed").write_text("\n".join(e["name"] for e in manifest["files"]) + "\n")
    return f"FA4 installed in {site}; use: eval \"$(python3 scripts/device_fa4.py env)\""


def pythonpath(stage: Path) -> str:
    """`--target` skips the .pth file that puts cutlass-dsl's packages on the path: add it by hand."""
    site = stage / "site"
    return f"{site}:{site / 'nvidia_cutlass_dsl' / 'dsl_packages'}"


# What one device call carries (64 MiB), and the room kept beside every part: the binary that travels
# with the last one (.dev/bin/optimizerd.gz, 9.5 MB on 2026-12-01) and a margin for the tree growing
# between pack and call.
CARRY_BYTES = 64 * 1024 * 1024
SPARE_BYTES = 14_000_000


def tree_bytes(root: Path) -> int:
    """Bytes of what the device tool carries from `root` besides the carry paths: the tracked and
    the untracked-not-ignored files (0 outside a git checkout)."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root,
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 0
    total = 0
    for name in out.split(b"\0"):
        f = root / os.fsdecode(name)
        if name and f.is_file():
            total += f.stat().st_size
    return total


def default_part_mb(tree: int) -> float:
    """The largest part that travels beside a tree of `tree` bytes, in MB, at most 42; <= 0: none does."""
    return min(42.0, (CARRY_BYTES - tree - SPARE_BYTES) // 1_000_000)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="CPU machine: download (if needed) and pack the wheels into carry folders")
    p.add_argument("--wheels", type=Path, default=Path(".dev/fa4/wheels"), help="where the wheels are (downloaded there if empty)")
    p.add_argument("--out", type=Path, default=Path(".dev/fa4/parts"), help="the carry folders' parent (replaced)")
    p.add_argument("--part-mb", type=float, default=None,
                   help="largest folder, MB (default: what fits beside the working tree in one call, at most 42; "
                        "a call carries 64 MiB = 67.1 MB with the tree: 19 MB on 2026-11-29, 28 MB on 2026-12-01, "
                        "when 42 MB folders no longer fit beside it)")
    i = sub.add_parser("install", help="GPU machine: gather the carried part folders, install once complete")
    i.add_argument("parts", type=Path, nargs="*", help="part folders carried in this call")
    i.add_argument("--no-pip", action="store_true", help="join and check only (tests)")
    sub.add_parser("env", help="print the export line for PYTHONPATH")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "pack":
            if not any(args.wheels.glob("*.whl")):
                download(args.wheels)
            part_mb = args.part_mb if args.part_mb is not None else default_part_mb(tree_bytes(Path.cwd()))
            if part_mb <= 0:
                raise Fa4Error(f"the working tree is {tree_bytes(Path.cwd()) / 1e6:.0f} MB: no room beside it in a "
                               f"call's {CARRY_BYTES / 1e6:.1f} MB; move large untracked files out of it or into .gitignore")
            parts = pack(args.wheels, args.out, int(part_mb * 1e6))
            for d in parts:
                mb = sum(f.stat().st_size for f in d.iterdir()) / 1e6
                print(f"{d}  {mb:.1f} MB: one device call carrying it runs `python3 scripts/device_fa4.py install {d}`")
        elif args.cmd == "install":
            print(install(args.parts, STAGE, run_pip=not args.no_pip))
        else:
            print(f"export PYTHONPATH={pythonpath(STAGE)}${{PYTHONPATH:+:$PYTHONPATH}}")
    except Fa4Error as e:
        print(f"device_fa4: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
