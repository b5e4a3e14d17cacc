#!/usr/bin/env bash
# The soak: one long run, sampled for growth. Does the daemon's memory, its open
# descriptors (or its worker's), or the ledger grow with the iterations?
# Every N recorded iterations scripts/soak/sample.py writes a CSV row (daemon and worker
# VmRSS and open descriptors, daemon threads, ledger db + wal bytes, run folder bytes,
# worker restarts, iterations per second); at the end it prints the growth after warm-up.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  cat <<'EOF'
usage: scripts/soak.sh [options]            CPU soak: the scripted worker, one run of N iterations
       scripts/soak.sh --gpu [options]      GPU soak on the device, in pieces (below)

  --iterations N   iterations to run (default 10000)
  --every N        sample every N recorded iterations (default 500)
  --warmup N       iterations of warm-up before growth is measured (default 1000)
  --dir DIR        the soak's folder: config, plan, ledger and run folder, soak.csv
                   (CPU default: a new folder under /tmp; it must not hold a ledger yet)
  --csv FILE       where the samples go (default DIR/soak.csv)
  --bin FILE       the optimizerd binary (default target/release/optimizerd, built with
                   cargo if missing)

CPU soak: `optimizerd start --foreground` drives the scripted worker
(scripts/soak/worker-script.json: accepts, rejections, compile errors, wrong results,
CTA mismatches, worker crashes, hangs and sticky errors) through a plan of exhaustive
passes over five templates (scripts/soak/cpu-pass.toml, repeated as often as N needs);
the run is stopped (SIGTERM: the candidate in flight is finished) once N iterations are
recorded. E.g. the committed soak, docs/soak/:
  scripts/soak.sh --iterations 10000 --dir /tmp/soak-cpu --csv docs/soak/cpu-10000.csv

GPU soak (the real worker; NVRTC and torch as for any run): a run of the default plan
(strategies/default.toml) whose open phase does not converge for want of a gain
(patience 1000000), on the default workload, in pieces across device calls:
  --gpu            use the GPU (no scripted worker)
  --for SECONDS    follow the run for at most this long in this call (default 530: the
                   device tool allows 10 minutes a command), then exit, leaving it running
  --piece DURATION end the piece after this much wall time since it started (default 25m):
                   the run is stopped (`optimizerd stop`) and resumable
  --budget DUR     the run's whole budget (default 24h)
  --stop           stop the run at the end of this call (the last call of a lease)
  --save FILE      after a stop, pack DIR into FILE (tar.gz) to carry to the next lease
  --restore FILE   unpack FILE into DIR first when DIR holds no soak yet (the same DIR
                   the soak began in: the ledger names its plan by path)
  --worker-script FILE  rehearse these calls on a CPU: the scripted worker instead of the
                   GPU (e.g. scripts/soak/worker-script.json, with --piece 1m --for 20)
Each call starts the run (first call), follows it if its daemon is alive (the machine
stayed warm), or resumes it (`optimizerd resume`: a new piece, a new daemon with its own
warm-up). The CSV grows across calls; the summary is per daemon process. On the device
(carry target/release/optimizerd; the state lives in /tmp/soak-gpu between calls while the
machine stays warm, so issue the next call at once):
  bash scripts/soak.sh --gpu --dir /tmp/soak-gpu; cp /tmp/soak-gpu/soak.csv $OUT/
  ... the same call again, every ~9 minutes, until the piece ends (25 minutes) ...
  bash scripts/soak.sh --gpu --dir /tmp/soak-gpu --stop --save $OUT/soak-gpu.tar.gz
On a fresh machine (a new lease), carry the saved state inside the checkout (e.g. as
.dev/soak-gpu.tar.gz, ignored by git) and add `--restore .dev/soak-gpu.tar.gz`.
EOF
}

gpu=0 iterations=10000 every=500 warmup=1000 dir="" csv="" bin="" for_s=530 piece=25m budget=24h stop=0 save="" restore="" script=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --gpu) gpu=1 ;;
    --iterations) iterations="$2"; shift ;;
    --every) every="$2"; shift ;;
    --warmup) warmup="$2"; shift ;;
    --dir) dir="$2"; shift ;;
    --csv) csv="$2"; shift ;;
    --bin) bin="$2"; shift ;;
    --for) for_s="$2"; shift ;;
    --piece) piece="$2"; shift ;;
    --budget) budget="$2"; shift ;;
    --stop) stop=1 ;;
    --save) save="$2"; shift ;;
    --restore) restore="$2"; shift ;;
    --worker-script) script="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "soak: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
command -v python3 >/dev/null || { echo "soak: python3 is needed (the sampler reads the ledger with its sqlite3)" >&2; exit 1; }

if [[ -z "$bin" ]]; then
  bin="${CARGO_TARGET_DIR:-$root/target}/release/optimizerd"
  if [[ ! -x "$bin" ]]; then
    [[ $gpu == 1 ]] && { echo "soak: $bin is missing: build it elsewhere and carry it" >&2; exit 1; }
    echo "soak: building $bin" >&2
    (cd "$root" && cargo build --release --locked)
  fi
fi
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
sampler="$root/scripts/soak/sample.py"
# A worker that aborts (the script's crashes) must not leave core files in the soak's folder.
ulimit -c 0

# Duration ("25m", "90s", "1h") in seconds.
seconds() {
  local d="$1" n
  n="${d%[smh]}"
  case "$d" in *h) echo $((n * 3600)) ;; *m) echo $((n * 60)) ;; *s) echo "$n" ;; *) echo "$d" ;; esac
}

if [[ $gpu == 0 ]]; then
  [[ -n "$dir" ]] || dir="$(mktemp -d /tmp/optimizerd-soak.XXXXXX)"
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  [[ -e "$dir/runs/optimizer.db" ]] && { echo "soak: $dir already holds a ledger; give an empty folder" >&2; exit 2; }
  csv="${csv:-$dir/soak.csv}"
  rm -f "$csv"
  sed "s|@TEMPLATES@|$root/kernel-templates|" "$root/scripts/soak/cpu-agent.toml" > "$dir/agent.toml"
  cp "$root/scripts/soak/worker-script.json" "$dir/worker-script.json"
  # Enough passes for N iterations and one more (a pass is 716 candidates; gated and
  # failed ones are iterations too).
  passes=$(( iterations / 700 + 2 ))
  {
    cat "$root/scripts/soak/cpu-plan-head.toml"
    for ((k = 1; k <= passes; k++)); do echo; sed "s|@K@|$k|" "$root/scripts/soak/cpu-pass.toml"; done
  } > "$dir/plan.toml"
  cd "$dir"
  echo "soak: CPU, $iterations iterations sampled every $every in $dir ($bin)" >&2
  "$bin" start --foreground --fresh --budget 720h --run-id soak --seed 1 --config "$dir/agent.toml" \
    --worker-script "$dir/worker-script.json" 2> "$dir/daemon.err" &
  pid=$!
  # Whatever ends this script ends the daemon it started (only that process, by its pid).
  trap 'kill -TERM $pid 2>/dev/null || true' EXIT
  t0=$(date +%s)
  python3 "$sampler" follow --db "$dir/runs/optimizer.db" --run soak --pid "$pid" --csv "$csv" \
    --every "$every" --until "$iterations" > /dev/null
  kill -TERM "$pid" 2>/dev/null || true
  rc=0
  wait "$pid" || rc=$?
  trap - EXIT
  echo "soak: daemon exited with status $rc after $(( $(date +%s) - t0 )) s (log: $dir/daemon.err)" >&2
  tail -n 3 "$dir/daemon.err" | sed 's/^/  /' >&2 || true
  python3 "$sampler" summary --csv "$csv" --warmup "$warmup" --json "$dir/soak-summary.json"
  exit 0
fi

# GPU soak, one call.
dir="${dir:-/tmp/soak-gpu}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
if [[ -n "$restore" && ! -e "$dir/run_id" ]]; then
  tar -xzf "$restore" -C "$dir"
  # The ledger names the run's plan by its path: the soak must come back where it began.
  origin="$(cat "$dir/origin" 2>/dev/null || echo "an unknown folder")"
  if [[ "$origin" != "$dir" ]]; then
    echo "soak: $restore was made in $origin: restore it with --dir $origin" >&2
    exit 2
  fi
fi
[[ -e "$dir/origin" ]] || echo "$dir" > "$dir/origin"
csv="${csv:-$dir/soak.csv}"
# Written on every call: the repository may sit elsewhere on a new machine.
cat > "$dir/agent.toml" <<EOF
# The GPU soak's configuration (scripts/soak.sh): the embedded defaults (the default
# workload, SDPA baseline) with the soak's plan and folder.
[run]
runs_dir = "runs"
plan = "plan.toml"
templates_dir = "$root/kernel-templates"
EOF
if [[ ! -e "$dir/plan.toml" ]]; then
  # The default plan with an open phase that never converges for want of a gain: it ends
  # only when every point of every template was measured for every shape class (hours).
  { cat "$root/strategies/default.toml"; printf '\n[open_phase]\npatience = 1000000\n'; } > "$dir/plan.toml"
fi
cfg=(--config "$dir/agent.toml")
daemon=("${cfg[@]}")
[[ -n "$script" ]] && daemon+=(--worker-script "$script")
cd "$dir"
holder_pid() {
  # The daemon holding the GPU lock ("<run id> <pid>"), if that process is alive.
  local run p
  read -r run p < "$dir/runs/gpu.lock" 2>/dev/null || return 1
  # Alive, not a zombie (a detached daemon's parent may never reap it).
  [[ -n "${p:-}" && -r "/proc/$p/stat" ]] || return 1
  [[ "$(sed 's/.*) //' "/proc/$p/stat" | cut -d' ' -f1)" != Z ]] && echo "$p"
}
if [[ ! -e "$dir/run_id" ]]; then
  run="soak-gpu-$(date -u +%Y%m%d-%H%M%S)"
  echo "$run" > "$dir/run_id"
  date +%s > "$dir/piece_started"
  "$bin" start --budget "$budget" --fresh --run-id "$run" "${daemon[@]}"
elif pid=$(holder_pid); then
  run=$(cat "$dir/run_id")
  echo "soak: following run $run (daemon $pid)" >&2
else
  run=$(cat "$dir/run_id")
  date +%s > "$dir/piece_started"
  "$bin" resume "$run" "${daemon[@]}"
fi
pid=$(holder_pid) || { echo "soak: the daemon of run $run is not running; see $dir/runs/$run/daemon.out" >&2; exit 1; }
left=$(( $(seconds "$piece") - ($(date +%s) - $(cat "$dir/piece_started")) ))
(( left < 1 )) && left=1
follow=$(( left < for_s ? left : for_s ))
n=$(python3 "$sampler" follow --db "$dir/runs/optimizer.db" --run "$run" --pid "$pid" --csv "$csv" \
  --every "$every" --until "$iterations" --for "$follow")
if [[ $stop == 1 || $follow -ge $left || $n -ge $iterations ]]; then
  if holder_pid > /dev/null; then
    echo "soak: end of the piece: stopping run $run" >&2
    "$bin" stop "$run" "${cfg[@]}" || true
  fi
  if [[ -n "$save" ]]; then
    tar -czf "$save" -C "$dir" --exclude ./agent.toml .
    echo "soak: state saved to $save ($(du -h "$save" | cut -f1))" >&2
  fi
fi
"$bin" status "$run" "${cfg[@]}" | head -n 6 || true
python3 "$sampler" summary --csv "$csv" --warmup "$warmup" --json "$dir/soak-summary.json"
