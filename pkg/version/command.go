package version

import "strings"

// DefaultCommand is how the plugin is run as the binary kubectl-migrate.
const DefaultCommand = "kubectl migrate"

var command = DefaultCommand

// Command is how the user runs the plugin, so that every hint and help text
// names a command that works when copied: "kubectl migrate" for the binary
// kubectl-migrate, "kubectl live-migrate" when krew installed it (krew links
// a plugin by its index name, kubectl-live_migrate).
func Command() string { return command }

// SetCommandFrom sets Command from the executable's path (os.Args[0]).
func SetCommandFrom(executable string) { command = CommandFor(executable) }

// CommandFor maps an executable to the command kubectl runs it as:
// kubectl-foo_bar is "kubectl foo-bar", kubectl-foo-bar "kubectl foo bar".
// A name that is no kubectl plugin's (a test binary, go run) gets
// DefaultCommand.
func CommandFor(executable string) string {
	// Either separator: the plugin also runs on Windows.
	name := executable[strings.LastIndexAny(executable, `/\`)+1:]
	name = strings.TrimSuffix(name, ".exe")
	words, ok := strings.CutPrefix(name, "kubectl-")
	if !ok || words == "" {
		return DefaultCommand
	}
	parts := strings.Split(words, "-")
	for i, p := range parts {
		parts[i] = strings.ReplaceAll(p, "_", "-")
	}
	return "kubectl " + strings.Join(parts, " ")
}
