#!/usr/bin/env bash
# make test's stages, each timed: a line per stage as it ends ("stage NAME:
# N s, built|cached|ran"), and all of them again at the end, so a slow run
# says where its time went.
#
# The lab's builds (Kubernetes, the rootfs with CRIU, CRI-O, both
# containerds) start first, in the background, and run beside lint, unit and
# integration tests and the release check: their downloads and Debian's
# debootstrap wait on the network and the disk, not the CPU. The lab stages
# wait for them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bin
summary=()

# stage NAME CMD...: runs CMD, records its time.
stage() {
  local name=$1 t0 rc=0
  shift
  t0=$(date +%s)
  "$@" || rc=$?
  record "$name" "$(($(date +%s) - t0))" "$([ "$rc" -eq 0 ] && echo ran || echo "FAILED (exit $rc)")"
  return "$rc"
}

record() {
  local line
  line=$(printf 'stage %-18s %5d s  %s' "$1:" "$2" "$3")
  echo "$line" >&2
  summary+=("$line")
}

print_summary() {
  echo "--- stages ---" >&2
  printf '%s\n' "${summary[@]}" >&2
}
trap print_summary EXIT

# The builds of every lane, in the order the lanes run; each lane's build
# logs "building X" only for what its cache lacks.
build_lab() {
  for rt in crio containerd containerd-2.4; do
    LAB_RUNTIME=$rt go run ./test/lab build || return
  done
  date +%s >bin/lab-build.end
}
t0=$(date +%s)
rm -f bin/lab-build.end
build_lab >bin/lab-build.log 2>&1 &
build_pid=$!

stage integration make integration
stage release-check make release-check

waited=$(date +%s)
rc=0
wait "$build_pid" || rc=$?
how=cached
grep -q '^lab: building' bin/lab-build.log && how=built
ended=$(cat bin/lab-build.end 2>/dev/null || date +%s)
record lab-build "$((ended - t0))" "$how, beside the stages above; the lab stages waited $(($(date +%s) - waited)) s for it; log in bin/lab-build.log"
if [ "$rc" -ne 0 ]; then
  tail -n 40 bin/lab-build.log >&2
  exit "$rc"
fi
grep '^lab: built' bin/lab-build.log >&2 || true

stage e2e make e2e
stage eval-quick make eval-quick
stage e2e-containerd make e2e-containerd
stage e2e-containerd24 make e2e-containerd24
