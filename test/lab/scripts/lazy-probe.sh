#!/bin/sh
# Lazy pages on a lab node, without Kubernetes (make lazy-probe): can the
# lab's CRIU and kernel move a process whose pages follow it after it runs?
# A perl process holding MIB MiB of patterned memory, counting, in a PID
# namespace of its own (as a container is, so its restored copy does not
# clash with the frozen source on this one host), is dumped with
# --lazy-pages (its pages stay in the frozen source, served by CRIU's page
# server) and restored with --lazy-pages (the lazy-pages daemon faults them
# in through userfaultfd and pushes the rest); the copy must show the same
# checksum of its memory and go on counting.
#
# Runs inside a lab node's mount and network namespaces, as root.
set -eu
MIB=${1:-64}
D=/tmp/lazy-probe
rm -rf $D; mkdir -p $D/img
pids_of() { for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = "$1" ] && echo ${p#/proc/}; done; true; }
ms() { echo $(( ($2 - $1) / 1000000 )); }

criu --version | head -1
criu check --feature uffd-noncoop

cat > $D/app.pl <<PL
\$| = 1;
my \$buf = join('', map { chr((\$_ * 7) % 251) x 1024 } 0 .. ($MIB*1024 - 1));
open(my \$o, '>>', '$D/out') or die; select(\$o); \$| = 1;
print "start sum=", unpack('%32C*', \$buf), "\n";
my \$i = 0;
while (1) { \$i++; print "tick \$i sum=", unpack('%32C*', \$buf), "\n" if \$i % 10 == 0; select(undef,undef,undef,0.1); }
PL
setsid unshare --pid --fork setsid perl $D/app.pl </dev/null >/dev/null 2>&1 &
for _ in $(seq 1 600); do grep -q start $D/out 2>/dev/null && break; sleep 0.1; done
SRC=$(pids_of perl)
cleanup() { kill -9 $(pids_of perl) 2>/dev/null || true; kill $(pids_of unshare) 2>/dev/null || true; }
trap cleanup EXIT
echo "source: pid $SRC, $(grep VmRSS /proc/$SRC/status | tr -s ' \t' ' ')"
BEFORE=$(sed -n 's/start sum=//p' $D/out)

T0=$(date +%s%N)
criu dump -t $SRC -D $D/img --shell-job --lazy-pages --address 127.0.0.1 --port 27027 -o dump.log -v4 &
DUMP=$!
for _ in $(seq 1 300); do grep -q "Starting lazy pages server" $D/img/dump.log 2>/dev/null && break; sleep 0.01; done
T1=$(date +%s%N)
echo "frozen and dumped without its pages: $(ms $T0 $T1) ms (images $(du -sk $D/img | cut -f1) KiB)"
criu lazy-pages --page-server --address 127.0.0.1 --port 27027 -D $D/img -o lazy.log -v4 &
LAZY=$!
for _ in $(seq 1 300); do [ -S $D/img/lazy-pages.socket ] && break; sleep 0.01; done
T2=$(date +%s%N)
criu restore -D $D/img --shell-job --lazy-pages -d -o restore.log -v4
T3=$(date +%s%N)
echo "restored, running before its pages: $(ms $T2 $T3) ms"
wait $LAZY
wait $DUMP
T4=$(date +%s%N)
echo "last page arrived: $(ms $T2 $T4) ms after the restore began"
COPY=$(pids_of perl)
n=$(grep -c tick $D/out)
for _ in $(seq 1 100); do [ "$(grep -c tick $D/out)" -gt $((n + 1)) ] && break; sleep 0.1; done
AFTER=$(tail -1 $D/out | sed 's/.*sum=//')
echo "copy: pid $COPY, $(grep VmRSS /proc/$COPY/status | tr -s ' \t' ' '), $(tail -1 $D/out)"
[ "$AFTER" = "$BEFORE" ] || { echo "memory differs: $BEFORE before, $AFTER after"; exit 1; }
echo "memory checksum $AFTER before and after: lazy pages work here"
