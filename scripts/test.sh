#!/usr/bin/env bash
# The project's test command: install the pinned wheels (scripts/setup.sh), then run every
# test. No GPU needed: GPU work is replaced by a scripted worker process, while SQLite,
# git, NVRTC and the file system are real; the Python package `export --python` writes and
# scripts/model_bench.py are tested on CPU with torch from .deps/py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
cargo test --locked "$@"
if [[ $# -eq 0 ]]; then  # a filtered cargo run (arguments given) skips the Python suites
  for suite in python/tests python/bench_tests python/kernel_tests; do
    if [[ -d "$suite" ]]; then
      PYTHONPATH="$PWD/.deps/py" python3 -m unittest discover -s "$suite" -v
    fi
  done
fi
