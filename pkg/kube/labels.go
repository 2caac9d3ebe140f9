package kube

// ManagedByLabel, with the value ManagedBy, marks every object kubectl
// migrate makes: namespaces, Secrets, records, leases, pods, the
// RuntimeClass and its admission policy.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedBy      = "kubectl-migrate"
)
