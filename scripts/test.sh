#!/usr/bin/env bash
# The project's test command: install pinned NVRTC wheels (scripts/setup.sh), then
# run every test. No GPU needed: GPU work is replaced by a scripted worker process,
# while SQLite, git, NVRTC and the file system are real.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
cargo test --locked "$@"
