#!/bin/sh
# slotring-top: a terminal dashboard over `bpftool map dump pinned …`, for
# hosts with nothing but bpftool (and a POSIX shell with awk).
#
# A process that embeds slotring with probes pins its maps in its own
# instance directory /sys/fs/bpf/slotring/<pid or name>/ (map name = metric
# name): owner, throttle, slots, uring, lease, thread_acct, hist_park_cpu,
# hist_unpark_rq. bpftool prints them with field names (BTF); this script
# turns two dumps into rates. The `owner` map (pid and start time) tells a
# live instance from the stale pins of a killed one: the script watches the
# only live instance (or the one named with -I) and stops, saying so, when
# that process is gone.
#
# Usage: slotring-top.sh [-d PIN_ROOT] [-I INSTANCE] [-i SECONDS] [-n ITERATIONS]
#   -d  pin root (default /sys/fs/bpf/slotring), or one instance directory
#   -I  instance name (directory under the root; default: the only live one)
#   -i  refresh interval in seconds (default 2)
#   -n  stop after N refreshes (default: until Ctrl-C)
# Exit status: 0 done, 1 bpftool failed on a live instance, 2 bad usage or
# several live instances (choose with -I), 4 nothing to watch (no live
# instance, no bpftool) or the instance is gone.
# Needs root (or CAP_BPF and read access to the pins).
set -eu

ROOT=/sys/fs/bpf/slotring
NAME=
INTERVAL=2
COUNT=0
while getopts d:I:i:n:h opt; do
  case $opt in
    d) ROOT=$OPTARG ;;
    I) NAME=$OPTARG ;;
    i) INTERVAL=$OPTARG ;;
    n) COUNT=$OPTARG ;;
    *) sed -n '2,23p' "$0"; exit 2 ;;
  esac
done

command -v bpftool >/dev/null 2>&1 || { echo "slotring-top: bpftool not found" >&2; exit 4; }

# "pid start_time" of the instance in $1 (empty when unreadable).
owner_of() {
  bpftool map dump pinned "$1/owner" 2>/dev/null |
    awk '/"pid":/ { gsub(/[^0-9]/, "", $2); p = $2 } /"start_time":/ { gsub(/[^0-9]/, "", $2); t = $2 }
         END { if (p != "") print p, t }'
}

# Whether "pid start_time" ($1 $2) is a running process: field 22 of
# /proc/<pid>/stat (counted after the last ")" of the command name).
alive() {
  [ -n "${1:-}" ] && [ -r "/proc/$1/stat" ] || return 1
  now=$(sed 's/.*)//' "/proc/$1/stat" 2>/dev/null | awk '{ print $20 }')
  [ "$now" = "${2:-}" ]
}

if [ -e "$ROOT/slots" ]; then
  DIR=$ROOT
elif [ -n "$NAME" ]; then
  DIR=$ROOT/$NAME
else
  live=; stale=0
  for d in "$ROOT"/*/; do
    [ -d "$d" ] || continue
    d=${d%/}
    # shellcheck disable=SC2046
    if alive $(owner_of "$d"); then live="$live ${d##*/}"; else stale=$((stale + 1)); fi
  done
  set -- $live
  case $# in
    0) echo "slotring-top: no live slotring instance under $ROOT ($stale stale)" >&2; exit 4 ;;
    1) DIR=$ROOT/$1 ;;
    *) echo "slotring-top: $# live instances under $ROOT:$live; choose one with -I" >&2; exit 2 ;;
  esac
fi
OWNER=$(owner_of "$DIR")
# shellcheck disable=SC2086
alive $OWNER || { echo "slotring-top: no live slotring instance in $DIR${OWNER:+ (process ${OWNER%% *} is gone)}" >&2; exit 4; }

gone() {
  echo "slotring-top: instance ${DIR##*/} (process ${OWNER%% *}) is gone" >&2
  exit 4
}

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT INT TERM

# Flatten one map dump into lines "map entry field value" (arrays: field[i]).
# Throttle entries are named by their "name" field; unnamed entries dropped.
# Fails (status 1) when the map cannot be dumped.
flatten() {
  bpftool map dump pinned "$DIR/$1" > "$TMP/raw" 2> "$TMP/err" || return 1
  awk -v map="$1" '
    function emit(f, v) { if (entry != "") print map, entry, f, v }
    /"key":/ { gsub(/[^0-9]/, "", $2); key = $2; entry = (map == "throttle") ? "" : key; next }
    /"name":/ { v = $2; gsub(/[",]/, "", v); entry = (v == "") ? "" : v; next }
    /^ *"[a-z_]+": \[/ {
      f = $1; gsub(/[":]/, "", f); arr = f; idx = 0
      line = $0; sub(/^[^[]*\[/, "", line)
    }
    arr != "" {
      if (line == "") line = $0
      n = split(line, parts, /[^0-9]+/)
      for (i = 1; i <= n; i++) if (parts[i] != "") { emit(arr "[" idx "]", parts[i]); idx++ }
      if (line ~ /\]/) arr = ""
      line = ""
      next
    }
    /^ *"[a-z_]+": [0-9]+/ { f = $1; gsub(/[":]/, "", f); v = $2; gsub(/,/, "", v); emit(f, v) }
  ' "$TMP/raw"
}

# Whether the watched instance is still there: its process runs and the
# pins are still its own (not removed, not replaced by another process).
present() {
  # shellcheck disable=SC2086
  alive $OWNER && [ "$(owner_of "$DIR")" = "$OWNER" ]
}

# Dump every map into $1. Exits saying so when the instance is gone; a dump
# that fails while it is there is an error (bpftool's message, exit 1).
snapshot() {
  out=$1
  : > "$out"
  present || gone
  for m in throttle slots uring lease thread_acct; do
    if ! flatten "$m" >> "$out"; then
      present || gone
      echo "slotring-top: bpftool could not dump $DIR/$m: $(cat "$TMP/err")" >&2
      exit 1
    fi
  done
  present || gone
}

report() {
  awk -v dt="$INTERVAL" -v dir="$DIR" '
    FNR == NR { prev[$1 " " $2 " " $3] = $4; next }
    { cur[$1 " " $2 " " $3] = $4; if ($1 == "throttle") names[$2] = 1 }
    function c(k) { return cur[k] + 0 }
    function r(k) { return (cur[k] - prev[k]) / dt }
    END {
      mib = 1048576
      printf "slotring (bpftool) %s, rates over %ss\n\n", dir, dt
      printf "%-14s %12s %12s %14s %10s\n", "THROTTLER", "MiB/s", "configured", "page cache/s", "waiting"
      for (n in names) {
        conf = c("throttle " n " max_speed")
        printf "%-14s %12.1f %12s %14.1f %10.2f\n", n, r("throttle " n " amount") / mib,
          (conf == 0 ? "unlimited" : sprintf("%.1f", conf / mib)),
          r("throttle " n " page_cache_amount") / mib, r("throttle " n " wait_us") / 1e6
      }
      s = "slots 0 "
      printf "\nSLOTS  budget %s  in use %d  parked %d  borrowed %d  waiters %d  allocations %d\n",
        (c(s "max_concurrency") > 1e18 ? "unlimited" : c(s "max_concurrency")), c(s "cur_concurrency"),
        c(s "parked"), c(s "borrowed"), c(s "waiters"), c(s "allocations")
      printf "       acquired/s %.1f  delayed/s %.1f  queries delayed %d  parks/s %.1f  borrows/s %.1f\n",
        r(s "slots_acquired"), r(s "slots_delayed"), c(s "queries_delayed"), r(s "parks"), r(s "unpark_borrows")
      u = "uring 0 "
      printf "\nIO     reads/s %.0f  MiB/s %.1f  page-cache hits/s %.0f  NOWAIT misses/s %.1f  waits/s %.1f\n",
        r(u "reads"), r(u "read_bytes") / mib, r(u "page_cache_hits"), r(u "nowait_misses"), r(u "waits_submitted")
      # Lease state 2 = parked. Parked time counts closed parked intervals.
      parked = 0; oncpu = 0; runq = 0; threads = 0; episodes = 0; hot = 0
      for (k in cur) {
        split(k, p, " ")
        # A slot taken over by a new thread restarts its totals: count
        # only slots whose thread stayed.
        same = (cur[p[1] " " p[2] " tid"] == prev[p[1] " " p[2] " tid"])
        if (p[1] == "lease" && p[3] == "state_ns[2]") { if (same) parked += cur[k] - prev[k]; if (cur["lease " p[2] " tid"] > 0) threads++ }
        if (p[1] == "thread_acct" && p[3] == "on_cpu_ns[2]" && same) oncpu += cur[k] - prev[k]
        if (p[1] == "thread_acct" && p[3] == "runq_ns[2]" && same) runq += cur[k] - prev[k]
        if (p[1] == "thread_acct" && p[3] == "episodes" && same) episodes += cur[k] - prev[k]
        if (p[1] == "thread_acct" && p[3] == "hot_episodes" && same) hot += cur[k] - prev[k]
      }
      printf "\nKERNEL threads %d  parked %.2f thread-s/s  on-CPU while parked %.3f ms/s (%.4f%%)  run queue while parked %.3f ms/s\n",
        threads, parked / 1e9 / dt, oncpu / 1e6 / dt, (parked > 0 ? 100 * oncpu / parked : 0), runq / 1e6 / dt
      # Hot: parked episodes over the per-episode bounds (the verdict).
      printf "       parked episodes/s %.1f  hot/s %.1f (%.2f%%)\n",
        episodes / dt, hot / dt, (episodes > 0 ? 100 * hot / episodes : 0)
    }' "$1" "$2"
}

snapshot "$TMP/prev"
i=0
while :; do
  sleep "$INTERVAL"
  snapshot "$TMP/cur"
  [ -t 1 ] && printf '\033[2J\033[H'
  report "$TMP/prev" "$TMP/cur"
  mv "$TMP/cur" "$TMP/prev"
  i=$((i + 1))
  if [ "$COUNT" -gt 0 ] && [ "$i" -ge "$COUNT" ]; then break; fi
done
