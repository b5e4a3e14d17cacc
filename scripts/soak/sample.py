#!/usr/bin/env python3
"""The soak's sampler: follows a run in the ledger and, every N recorded iterations, writes
one CSV row of what a long run could leak: the daemon's and the worker's resident memory
(VmRSS) and open descriptors (/proc/PID/fd), the daemon's threads, and the ledger's size on
disk (db + wal). `summary` reads such a CSV back and says whether it stayed flat.

Driven by scripts/soak.sh (see its --help); stdlib only, Linux only (/proc).

  sample.py follow --db DB --run RUN --pid PID --csv CSV --every N --until N [--for SECONDS]
  sample.py summary --csv CSV --warmup N [--json OUT]
"""

import argparse
import csv
import json
import os
import sqlite3
import sys
import time

FIELDS = [
    "iteration", "elapsed_s", "iters_per_s", "daemon_pid", "daemon_rss_kb", "daemon_fds",
    "daemon_ledger_fds", "daemon_threads", "worker_pid", "worker_rss_kb", "worker_fds", "worker_restarts",
    "ledger_db_bytes", "ledger_wal_bytes", "ledger_bytes", "run_dir_bytes",
]


def status_kb(pid, key):
    """A `Key:  1234 kB` line of /proc/PID/status, in kB (None when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def fds(pid, ledger=None):
    """Open descriptors of PID as (all, the ledger's): the read with the fewest of a few
    reads 5 ms apart, so that a file held open for a moment (a git object, a journal) is
    not counted; a leaked descriptor is in every read and still counts. The ledger's
    (db and wal files: two per pooled SQLite connection, up to the pool's 4, and one shm)
    come and go with the pool and are counted apart."""
    best = None
    for _ in range(5):
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            return None, None
        db = 0
        if ledger:
            for n in names:
                try:
                    if os.readlink(f"/proc/{pid}/fd/{n}").startswith(ledger):
                        db += 1
                except OSError:
                    pass
        if best is None or len(names) < best[0]:
            best = (len(names), db)
        time.sleep(0.005)
    return best


def worker_of(pid):
    """The daemon's worker: a child process whose command line has the `worker` subcommand."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            # The command name is in parentheses and may hold spaces: the state and the
            # parent pid are the first two fields after its closing parenthesis. A worker
            # that died and is not reaped yet (Z) no longer has its descriptors.
            state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
            if int(ppid) != pid or state in ("Z", "X"):
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if b"worker" in argv:
                return int(entry)
        except (FileNotFoundError, ProcessLookupError, ValueError, PermissionError):
            continue
    return None


def tree_bytes(path):
    """Bytes of the files under `path` (the run folder: run.log, worker.log, workspace/.git)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


def size(path):
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def ledger_counts(db, run):
    """(iterations recorded, worker restarts) of RUN so far; the `running` row of the
    iteration in flight is not counted. Autocommit, fetched at once and closed: the sampler
    never holds a read snapshot that would keep the daemon's checkpoints from resetting the
    WAL."""
    if not os.path.exists(db):
        return 0, 0
    con = sqlite3.connect(db, isolation_level=None, timeout=10)
    try:
        n = con.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM iterations WHERE run_id = ? AND verdict != 'running'", (run,)
        ).fetchone()[0]
        restarts = con.execute("SELECT COUNT(*) FROM events WHERE run_id = ? AND kind = 'worker_restart'", (run,)).fetchone()[0]
        return n, restarts
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return 0, 0  # the daemon has not created its tables yet
        raise
    finally:
        con.close()


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def follow(a):
    new = not os.path.exists(a.csv) or os.path.getsize(a.csv) == 0
    out = open(a.csv, "a", newline="")
    w = csv.DictWriter(out, fieldnames=FIELDS)
    if new:
        w.writeheader()
    t0 = time.monotonic()
    run_dir = os.path.join(os.path.dirname(a.db), a.run)
    mark, elapsed0 = a.every, 0.0
    last = (t0, None)
    if not new:
        # A later piece of the same soak: continue its marks and its clock.
        with open(a.csv, newline="") as f:
            rows = list(csv.DictReader(f))
        if rows:
            mark = (int(rows[-1]["iteration"]) // a.every + 1) * a.every
            elapsed0 = float(rows[-1]["elapsed_s"])
    while True:
        n, restarts = ledger_counts(a.db, a.run)
        gone = not alive(a.pid)
        timed_out = a.for_s is not None and time.monotonic() - t0 >= a.for_s
        if n >= mark or gone or timed_out or n >= a.until:
            if gone:
                return n, "daemon exited"
            now = time.monotonic()
            # The daemon holds four descriptors per worker (pipes, pidfd, worker.log): count
            # them while one runs, the same one before and after (a crashed worker is
            # restarted within moments).
            deadline = time.monotonic() + 5.0
            while True:
                wpid = worker_of(a.pid)
                dfds, ledger_fds = fds(a.pid, a.db)
                wfds = fds(wpid)[0] if wpid else None
                wrss = status_kb(wpid, "VmRSS") if wpid else None
                if (wpid is not None and worker_of(a.pid) == wpid) or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            rate = ""
            if last[1] is not None and now > last[0]:
                rate = f"{(n - last[1]) / (now - last[0]):.2f}"
            db, wal = size(a.db), size(a.db + "-wal")
            row = {
                "iteration": n,
                "elapsed_s": f"{now - t0 + elapsed0:.1f}",
                "iters_per_s": rate,
                "daemon_pid": a.pid,
                "daemon_rss_kb": status_kb(a.pid, "VmRSS"),
                "daemon_fds": dfds - ledger_fds if dfds is not None else None,
                "daemon_ledger_fds": ledger_fds,
                "daemon_threads": status_kb(a.pid, "Threads"),
                "worker_pid": wpid or "",
                "worker_rss_kb": wrss if wpid else "",
                "worker_fds": wfds if wpid else "",
                "worker_restarts": restarts,
                "ledger_db_bytes": db,
                "ledger_wal_bytes": wal,
                "ledger_bytes": db + wal,
                "run_dir_bytes": tree_bytes(run_dir),
            }
            w.writerow(row)
            out.flush()
            print(f"soak: iteration {n}: daemon {row['daemon_rss_kb']} kB, {row['daemon_fds']} fds; "
                  f"worker {row['worker_rss_kb']} kB, {row['worker_fds']} fds; ledger {db + wal} B", file=sys.stderr)
            last = (now, n)
            mark = (n // a.every + 1) * a.every
            if n >= a.until:
                return n, "target reached"
            if timed_out:
                return n, "time up"
        time.sleep(a.poll)


def segments(rows):
    """Rows grouped by daemon process (a resumed run is a new daemon with its own warm-up)."""
    out = []
    for r in rows:
        if not out or out[-1][0]["daemon_pid"] != r["daemon_pid"]:
            out.append([])
        out[-1].append(r)
    return out


def num(r, key):
    v = r.get(key, "")
    return int(v) if v not in ("", None, "None") else None


def summary(a):
    with open(a.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print("soak: no samples", file=sys.stderr)
        return 1
    result = {"samples": len(rows), "iterations": num(rows[-1], "iteration"), "segments": []}
    lines = []
    flat = True
    began = 0  # where the daemon of the segment took over: 0, or where the last one stopped
    for seg in segments(rows):
        after = [r for r in seg if num(r, "iteration") >= began + a.warmup] or seg[-1:]
        began = num(seg[-1], "iteration")
        first, last = after[0], after[-1]
        rss0, rss1 = num(first, "daemon_rss_kb"), num(last, "daemon_rss_kb")
        peak = max(num(r, "daemon_rss_kb") for r in after)
        growth = (rss1 - rss0) / rss0 * 100.0 if rss0 else 0.0
        dfds = sorted({num(r, "daemon_fds") for r in after})
        wfds = sorted({num(r, "worker_fds") for r in after if num(r, "worker_fds") is not None})
        lfds = [num(r, "daemon_ledger_fds") for r in seg if num(r, "daemon_ledger_fds") is not None]
        wrss = [num(r, "worker_rss_kb") for r in after if num(r, "worker_rss_kb") is not None]
        it0, it1 = num(first, "iteration"), num(last, "iteration")
        l0, l1 = num(first, "ledger_bytes"), num(last, "ledger_bytes")
        per_iter = (l1 - l0) / (it1 - it0) if it1 > it0 else 0.0
        wal_max = max(num(r, "ledger_wal_bytes") for r in seg)
        rates = [float(r["iters_per_s"]) for r in after if r.get("iters_per_s")]
        # The pool holds at most 4 connections: 2 descriptors each and one shared shm.
        seg_flat = growth < a.max_rss_growth and len(dfds) == 1 and len(wfds) <= 1 and max(lfds, default=0) <= 9
        flat = flat and seg_flat
        s = {
            "daemon_pid": num(seg[0], "daemon_pid"),
            "warmup_iteration": it0, "last_iteration": it1,
            "daemon_rss_kb": [rss0, rss1], "daemon_rss_peak_kb": peak, "daemon_rss_growth_pct": round(growth, 2),
            "daemon_fds": dfds, "daemon_ledger_fds_range": [min(lfds), max(lfds)] if lfds else [], "worker_fds": wfds, "worker_rss_kb_range": [min(wrss), max(wrss)] if wrss else [],
            "worker_restarts": num(last, "worker_restarts"),
            "ledger_bytes": [l0, l1], "ledger_bytes_per_iteration": round(per_iter, 1), "wal_max_bytes": wal_max,
            "iters_per_s_range": [min(rates), max(rates)] if rates else [],
            "flat": seg_flat,
        }
        result["segments"].append(s)
        lines.append(f"daemon pid {s['daemon_pid']}, iterations {num(seg[0], 'iteration')}..{it1}, "
                     f"after warm-up (from iteration {it0}):")
        lines.append(f"  daemon RSS   {rss0 / 1024:.1f} MiB -> {rss1 / 1024:.1f} MiB ({growth:+.1f}%), peak {peak / 1024:.1f} MiB")
        lines.append(f"  daemon fds   {'constant at ' + str(dfds[0]) if len(dfds) == 1 else 'VARY: ' + str(dfds)} besides the ledger's "
                     f"({min(lfds, default=0)}-{max(lfds, default=0)}: the SQLite pool, at most 9)")
        worker = "none sampled"
        if wrss:
            worker = (f"fds {'constant at ' + str(wfds[0]) if len(wfds) == 1 else 'VARY: ' + str(wfds)}; "
                      f"RSS {min(wrss) / 1024:.1f}-{max(wrss) / 1024:.1f} MiB; {s['worker_restarts']} restarts")
        lines.append(f"  worker       {worker}")
        lines.append(f"  ledger       {l0 / 2**20:.1f} MiB -> {l1 / 2**20:.1f} MiB ({per_iter / 1024:.2f} KiB per iteration), "
                     f"WAL at most {wal_max / 2**20:.1f} MiB")
        if rates:
            lines.append(f"  rate         {min(rates):.1f}-{max(rates):.1f} iterations/s between samples")
    result["flat"] = flat
    verdict = "FLAT" if flat else "NOT FLAT"
    lines.append(f"soak: {verdict} (daemon RSS growth after warm-up < {a.max_rss_growth:g}%, descriptors constant): "
                 f"{result['iterations']} iterations, {len(rows)} samples in {a.csv}")
    print("\n".join(lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("follow")
    f.add_argument("--db", required=True)
    f.add_argument("--run", required=True)
    f.add_argument("--pid", type=int, required=True)
    f.add_argument("--csv", required=True)
    f.add_argument("--every", type=int, default=500)
    f.add_argument("--until", type=int, default=10_000)
    f.add_argument("--for", dest="for_s", type=float, default=None, help="stop following after this many seconds")
    f.add_argument("--poll", type=float, default=0.05)
    s = sub.add_parser("summary")
    s.add_argument("--csv", required=True)
    s.add_argument("--warmup", type=int, default=1000)
    s.add_argument("--max-rss-growth", type=float, default=10.0)
    s.add_argument("--json")
    a = p.parse_args()
    if a.cmd == "follow":
        n, why = follow(a)
        print(f"soak: stopped following at iteration {n}: {why}", file=sys.stderr)
        print(n)
        return 0
    return summary(a)


if __name__ == "__main__":
    sys.exit(main())
