"""Builds the C++ launcher (csrc/launcher.cpp) against the installed torch, once per
(source, torch, namespace), and loads it with torch.ops.load_library.

A plain compiler call rather than torch.utils.cpp_extension.load: that one needs ninja
and, for CUDA, a toolkit found through CUDA_HOME, while this file needs only a C++17
compiler, torch's headers and the CUDA runtime headers — which torch's own pip wheels
install (nvidia/cu13/include), so a machine with torch and a compiler can build it.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(_HERE, "csrc", "launcher.cpp")


class BuildError(Exception):
    pass


def cache_dir() -> str:
    root = os.environ.get("OPTIMIZERD_KERNELS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "optimizerd_kernels")
    return root


NEEDED_HEADERS = ("cuda.h", "cuda_runtime_api.h", os.path.join("crt", "host_config.h"))


def cuda_include_dirs():
    """Folders that hold the CUDA headers torch's c10/cuda headers include (cuda.h,
    cuda_runtime_api.h and crt/): from CUDA_HOME / CUDA_PATH, the nvidia pip packages
    next to torch (nvidia/*/include: torch's wheels bring the runtime's, nvidia-cuda-crt
    the crt/ ones), /usr/local/cuda. The first folder holding each header wins."""
    candidates = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "include"))
    import torch

    site_roots = {os.path.dirname(os.path.dirname(torch.__file__))}
    for key in ("purelib", "platlib"):
        site_roots.add(sysconfig.get_paths()[key])
    for root in sorted(site_roots):
        nvidia = os.path.join(root, "nvidia")
        if os.path.isdir(nvidia):
            for sub in sorted(os.listdir(nvidia)):
                candidates.append(os.path.join(nvidia, sub, "include"))
    candidates.append("/usr/local/cuda/include")
    found = {}
    for header in NEEDED_HEADERS:
        for c in candidates:
            if os.path.isfile(os.path.join(c, header)):
                found[header] = c
                break
    missing = [h for h in NEEDED_HEADERS if h not in found]
    if missing:
        raise BuildError(f"CUDA headers {', '.join(missing)} not found in CUDA_HOME, CUDA_PATH, the nvidia pip packages "
                         "next to torch, or /usr/local/cuda: install a CUDA toolkit (or `pip install nvidia-cuda-runtime "
                         "nvidia-cuda-crt` matching torch's CUDA), or set CUDA_HOME")
    return list(dict.fromkeys(found.values()))


def compile_command(namespace: str, output: str):
    import torch
    from torch.utils import cpp_extension

    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise BuildError("no C++ compiler (set CXX, or install g++)")
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    includes = cpp_extension.include_paths() + cuda_include_dirs()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            f"-DOPTD_NS={namespace}", *[f"-I{i}" for i in includes], SOURCE, "-o", output, f"-L{torch_lib}",
            "-lc10", "-lc10_cuda", "-ltorch_cpu", "-ltorch", f"-Wl,-rpath,{torch_lib}", "-ldl"]


def library_path(namespace: str) -> str:
    """Where the built launcher for this source, torch and namespace lives."""
    import torch

    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read() + f"{torch.__version__}|{namespace}|{sys.version_info[:2]}".encode()).hexdigest()
    return os.path.join(cache_dir(), f"{namespace}-{digest[:16]}.so")


def build(namespace: str) -> str:
    """Path of the launcher library, compiling it first if this source/torch has none yet.
    Concurrent first imports each compile into a temporary file and the last rename wins."""
    path = library_path(namespace)
    if os.path.isfile(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    cmd = compile_command(namespace, tmp)
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        os.unlink(tmp)
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise BuildError(f"compiling {SOURCE} failed ({cmd[0]} exited {result.returncode}):\n{tail}")
    os.replace(tmp, path)
    return path


def load(namespace: str) -> str:
    import torch

    path = build(namespace)
    torch.ops.load_library(path)
    return path
