#!/usr/bin/env bash
# Render an optimizerd report page to a PNG in headless Chromium, to look at it the way a
# browser shows it (and to commit a picture of a real run).
#
#   bash scripts/report_png.sh REPORT.html OUT.png [HEIGHT]
#
# Installs Debian's chromium with apt-get when it is missing (needs root). HEIGHT in
# pixels defaults to the page height the report estimates for itself (its
# `optimizerd-page-height` meta tag); the width is 1400.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: bash scripts/report_png.sh REPORT.html OUT.png [HEIGHT]" >&2
  echo "  e.g. optimizerd report RUN --out docs/report && bash scripts/report_png.sh docs/report/report.html docs/report/report.png" >&2
  exit 2
fi
html=$1
png=$2
if [ ! -f "$html" ]; then
  echo "no such file: $html (write it with: optimizerd report RUN --out DIR)" >&2
  exit 2
fi

browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "chromium is not installed; installing Debian's package (apt-get install chromium)" >&2
  if [ "$(id -u)" != 0 ]; then
    echo "not root: install it yourself with: sudo apt-get install -y chromium" >&2
    exit 1
  fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  browser=$(command -v chromium)
fi

height=${3:-$(grep -o 'name="optimizerd-page-height" content="[0-9]*"' "$html" | grep -o '[0-9]*' || true)}
height=${height:-4000}

profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
mkdir -p "$(dirname "$png")"
out_abs=$(cd "$(dirname "$png")" && pwd)/$(basename "$png")
url="file://$(cd "$(dirname "$html")" && pwd)/$(basename "$html")"

# The background-networking flags keep Chromium from dialling out (the page needs nothing:
# it is self-contained); a fresh profile keeps runs independent.
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --hide-scrollbars --user-data-dir="$profile" \
  --window-size=1400,"$height" --screenshot="$out_abs" "$url" 2>"$profile/chromium.log" || {
  echo "chromium failed; its output:" >&2
  tail -20 "$profile/chromium.log" >&2
  exit 1
}
[ -s "$out_abs" ] || { echo "chromium wrote no PNG; its output:" >&2; tail -20 "$profile/chromium.log" >&2; exit 1; }
echo "wrote $png (1400x$height) from $html"
