package kube

// ShortAnswer shortens a component's error text for a one-line message,
// keeping its end, where CRI-O and the kubelet put the cause.
func ShortAnswer(s string) string {
	const head, tail = 120, 400
	if len(s) > head+tail {
		return s[:head] + " … " + s[len(s)-tail:]
	}
	return s
}
