# Distils `go test -bench -v` output into the generated docs/bench files:
# each benchmark's name, then one metric per line (Go prints them all on one
# line, too wide to read), and the benchmark's own log lines with the
# figures of every run. ns/op is dropped: one iteration is many migrations.
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name)
	print ""; print name
	for (i = 5; i < NF; i += 2) printf "  %12s  %s\n", $i, $(i + 1)
	next
}
/_test\.go:[0-9]+: / {
	line = $0; sub(/^[ \t]*[a-z_]+_test\.go:[0-9]+: /, "", line)
	print "  # " line
}
