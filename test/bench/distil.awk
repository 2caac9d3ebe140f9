# Distils `go test -bench -v` output into the generated docs/bench files:
# each benchmark's name once, its log lines with the figures of every run
# (as # lines), then one metric per line (Go prints them all on one line,
# too wide to read). ns/op is dropped: one iteration is many migrations.
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name)
	if (name != last) { print ""; print name; last = name }
	for (i = 5; i < NF; i += 2) printf "  %12s  %s\n", $i, $(i + 1)
	next
}
/_test\.go:[0-9]+: / {
	line = $0; sub(/^[ \t]*[a-z_]+_test\.go:[0-9]+: /, "", line)
	print "  # " line
}
