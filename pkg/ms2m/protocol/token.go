package protocol

// The control token (contract 4). The endpoints of an application steer
// its consumption, and the pod network reaches them from every namespace:
// each call must carry the token of the namespace's ControlSecret, which
// the application's pod mounts and the migration manager reads through the
// API server. Only who may read that Secret (the namespace's own editors
// and the migration role) can steer the consumer.
//
// The token also proves where a restored copy runs. The copy keeps, in its
// memory, the token it read at start; after a restore it reads the file of
// the pod it now runs in. A pod of another namespace cannot mount the
// Secret, so whatever it mounts there (or its hostname and namespace file,
// which it controls) cannot pass for the copy's home.
const (
	// ControlSecret is the Secret, in the application's namespace, whose
	// TokenKey holds the token.
	ControlSecret = "ms2m-control"
	// TokenKey is the key of the token in ControlSecret.
	TokenKey = "token"
	// DefaultTokenFile is where the pod mounts the token: ControlSecret as
	// a volume at /var/run/secrets/ms2m ($MS2M_TOKEN_FILE overrides it).
	DefaultTokenFile = "/var/run/secrets/ms2m/" + TokenKey
	// TokenHeader carries the token on every request to an /ms2m/ path
	// (the API server's proxy keeps its callers' Authorization to itself).
	TokenHeader = "Ms2m-Token"
)
