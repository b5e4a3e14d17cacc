#!/usr/bin/env bash
# Installs what optimizerd needs besides Rust into .deps/ (ignored by git):
# NVRTC and the CUDA headers from NVIDIA's pip wheels, pinned to CUDA 13.0.x so
# that the PTX/cubin they produce loads on a 580-series driver.
# Idempotent: re-running with the same pins does nothing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.deps/cuda"
pins=(nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88)
stamp="$dest/.pins"
want="${pins[*]}"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
python3 -m pip --version >/dev/null 2>&1 || { echo "setup: python3 with pip is needed to fetch NVRTC wheels" >&2; exit 1; }
rm -rf "$dest"
mkdir -p "$dest"
echo "setup: installing ${pins[*]} into $dest" >&2
python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dest" "${pins[@]}"
echo "$want" > "$stamp"
