#!/usr/bin/env bash
# make test's stages, each timed: a line per stage as it ends ("stage NAME:
# N s, ran|built|cached"), and all of them again at the end, so a slow run
# says where its time went.
#
# Nothing waits for what it does not need. The lab's builds start first, in
# the background, lane by lane (CRI-O's, then containerd 2.3.7's, then
# 2.4's), and each lab stage waits only for its own lane: on a fresh machine
# the containerd builds run beside the CRI-O e2e instead of before it. Lint,
# unit and integration tests run in the foreground beside the builds; the
# release check (a cross-build of six platforms, mostly cached on a warm
# machine) runs in the background after them, beside whatever comes next,
# and is waited for at the end. All of it compiles with -trimpath (the
# Makefile exports GOFLAGS), so vet, the lab, the images and the release
# share one build of the dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bin
summary=()
t0=$(date +%s)

# cpu_ticks: the machine's busy and total CPU ticks so far (/proc/stat).
cpu_ticks() {
  awk '/^cpu /{total=0; for (i=2; i<=NF; i++) total+=$i; print total-$5-$6, total}' /proc/stat
}

# stage NAME CMD...: runs CMD, records its time and how busy the machine's
# CPUs were meanwhile (a stage far below 100% waits on something else and
# could share the machine; one near it cannot go faster beside others).
stage() {
  local name=$1 started rc=0 busy0 total0 busy1 total1
  shift
  started=$(date +%s)
  read -r busy0 total0 < <(cpu_ticks)
  "$@" || rc=$?
  read -r busy1 total1 < <(cpu_ticks)
  record "$name" "$(($(date +%s) - started))" "$([ "$rc" -eq 0 ] && echo ran || echo "FAILED (exit $rc)"), CPUs $(((busy1 - busy0) * 100 / (total1 - total0 + 1)))% busy"
  return "$rc"
}

record() {
  local line
  line=$(printf 'stage %-18s %5d s  %s' "$1:" "$2" "$3")
  echo "$line" >&2
  summary+=("$line")
}

# kill_tree PID: PID and everything it started (a failed stage leaves the
# background builds and the release check running otherwise).
kill_tree() {
  local child
  for child in $(pgrep -P "$1"); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}

finish() {
  local pid
  for pid in ${build_pid:-} ${release_pid:-}; do
    kill -0 "$pid" 2>/dev/null && kill_tree "$pid"
  done
  echo "--- stages (wall clock $(($(date +%s) - t0)) s) ---" >&2
  printf '%s\n' "${summary[@]}" >&2
}
trap finish EXIT

# The lanes' builds, in the order the lanes run. Each lane's build writes its
# exit code to bin/lab-build.LANE.rc when it ends; a lane's build logs
# "building X" only for what the cache lacks.
lanes=(crio containerd containerd-2.4)
# The first lane's build is needed when the unit tests end; the others only
# after its e2e, so they yield the CPUs (nice) to whatever runs meanwhile.
build_lanes() {
  local rt rc niceness=0
  for rt in "${lanes[@]}"; do
    rc=0
    LAB_RUNTIME=$rt nice -n "$niceness" go run ./test/lab build >"bin/lab-build.$rt.log" 2>&1 || rc=$?
    niceness=19
    echo "$rc $(date +%s)" >"bin/lab-build.$rt.rc"
    [ "$rc" -eq 0 ] || return "$rc"
  done
}
rm -f bin/lab-build.*.rc
build_lanes &
build_pid=$!

# wait_lane LANE: blocks until LANE's build ended (or the builds stopped
# early), records it, and fails with the build's log if it failed.
wait_lane() {
  local rt=$1 rcfile=bin/lab-build.$1.rc waited how rc ended
  waited=$(date +%s)
  while [ ! -s "$rcfile" ] && kill -0 "$build_pid" 2>/dev/null; do sleep 1; done
  read -r rc ended <"$rcfile" 2>/dev/null || { rc=1 ended=$(date +%s); }
  how=cached
  grep -q '^lab: building' "bin/lab-build.$rt.log" && how=built
  record "lab-build-$rt" "$((ended - t0))" "$how from the start, beside the stages; waited $(($(date +%s) - waited)) s for it; log in bin/lab-build.$rt.log"
  grep '^lab: built' "bin/lab-build.$rt.log" >&2 || true
  if [ "$rc" -ne 0 ]; then
    tail -n 40 "bin/lab-build.$rt.log" >&2
    return 1
  fi
}

# The release check in the background, its output in its own log (printed
# if it fails).
# It yields the CPUs (nice) to the e2e stages beside it, which wait on the
# lab more than they compute: on a fresh machine its cold builds (goreleaser,
# krew, six platforms) otherwise slowed the CRI-O e2e by a quarter.
release_check() {
  local started=$(date +%s) rc=0
  nice -n 19 make release-check >bin/release-check.log 2>&1 || rc=$?
  echo "$rc $(($(date +%s) - started))" >bin/release-check.rc
}
wait_release_check() {
  local waited=$(date +%s) rc secs
  wait "$release_pid" || true
  read -r rc secs <bin/release-check.rc 2>/dev/null || { rc=1 secs=0; }
  record release-check "$secs" "$([ "$rc" -eq 0 ] && echo ran || echo "FAILED (exit $rc)") in the background; waited $(($(date +%s) - waited)) s for it; log in bin/release-check.log"
  if [ "$rc" -ne 0 ]; then
    tail -n 60 bin/release-check.log >&2
    return 1
  fi
}

stage integration make integration
rm -f bin/release-check.rc
release_check &
release_pid=$!

wait_lane crio
stage e2e make e2e
stage eval-quick make eval-quick
wait_lane containerd
stage e2e-containerd make e2e-containerd
wait_lane containerd-2.4
stage e2e-containerd24 make e2e-containerd24
wait_release_check
