#!/usr/bin/env bash
# Installs what optimizerd needs besides Rust into .deps/ (ignored by git):
#  - .deps/cuda: NVRTC and the CUDA headers from NVIDIA's pip wheels, pinned to CUDA
#    13.0.x so that the PTX/cubin they produce loads on a 580-series driver;
#  - .deps/nvdisasm: NVIDIA's disassembler (scripts/sass_loop_stats.py);
#  - .deps/py: torch and transformers, the versions the GPU machine has, for the tests of
#    the Python package `optimizerd export --python` writes (python/tests) and of
#    scripts/model_bench.py (python/bench_tests). torch's Linux wheels bring the CUDA
#    runtime libraries they link against; nothing here needs a GPU.
# Idempotent: re-running with the same pins does nothing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 -m pip --version >/dev/null 2>&1 || { echo "setup: python3 with pip is needed to fetch the pinned wheels" >&2; exit 1; }

# need_free DIR GB: fail before a long download, not halfway through it, when DIR's file
# system has less than GB gigabytes free (torch's wheels unpack to about 5 GB).
need_free() {
  local dir="$1" gb="$2" avail_kb
  avail_kb=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
  if (( avail_kb < gb * 1024 * 1024 )); then
    echo "setup: $dir needs about $gb GB free to install into, but its file system has $((avail_kb / 1024)) MB;" \
      "free space there (old clones, cargo's target/ folders) and run this again" >&2
    exit 1
  fi
}

# install GB DEST PIP_ARGS...: (re)install into DEST, which needs about GB gigabytes free,
# unless its stamp already says these pins.
install() {
  local need_gb="$1" dest="$2"; shift 2
  local stamp="$dest/.pins" want="$*"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  rm -rf "$dest"
  mkdir -p "$dest"
  need_free "$dest" "$need_gb"
  echo "setup: installing $want into $dest" >&2
  # No pip cache: it would hold a second, compressed copy of every wheel (GBs for torch).
  python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir --target "$dest" "$@"
  echo "$want" > "$stamp"
}

install 1 "$root/.deps/cuda" --no-deps nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88
# nvdisasm, for scripts/sass_loop_stats.py and its test (python/kernel_tests): the SASS of
# a kernel's hot loop. No 13.0 build is on PyPI; 13.5 reads NVRTC 13.0's sm_90a cubins.
install 1 "$root/.deps/nvdisasm" --no-deps nvidia-cuda-nvdisasm==13.5.37
install 6 "$root/.deps/py" torch==2.11.0 transformers==5.17.0

# PostgreSQL, for the tests of a fleet's shared database (tests/fleet.rs start their own
# server in a temporary folder): Debian's package. Under CI=true a missing server is an
# error, never a skipped test.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "setup: installing PostgreSQL (Debian's postgresql package) for tests/fleet.rs" >&2
  sudo=""
  [[ $(id -u) == 0 ]] || sudo="sudo -n"
  if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >/dev/null; }; then
    echo "setup: cannot install PostgreSQL; install Debian's postgresql package (apt-get install postgresql) and run this again" >&2
    exit 1
  fi
fi
