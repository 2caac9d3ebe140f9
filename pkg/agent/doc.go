// Package agent is the node-side half of a migration. The kubelet writes a
// checkpoint archive that only root on the source node can read, and the
// runtimes answer only on their node's socket, so the plugin starts a
// short-lived agent pod on each node it needs (Launcher) and talks to it
// through the API server's pod proxy. The agent (Serve) takes calls only
// with its migration's token and ends after an idle time; it:
//
//   - packs a checkpoint archive as an OCI checkpoint image and pushes it to
//     a registry, or streams it to the target node's agent (Direct), which
//     serves it to its own runtime on localhost, only with a read credential
//     the restored pod's pull secret carries (PullPassword), refusing what
//     would fill the node;
//   - asks its node's runtime what it is and how it is configured, and
//     pulls the images a restore builds on;
//   - stops and removes a pod's sandboxes through the runtime, the way to
//     end a pod whose node's kubelet no longer answers, and removes the
//     archives it is given;
//   - snapshots a migrated pod's emptyDir volumes into an archive packed
//     like a checkpoint, and (fill-volumes, in the target pod's init
//     container) copies them into the target's volumes;
//   - for the restore through the kubectl-migrate runtime, stages a
//     received checkpoint on its node instead of serving it as an image;
//     node-setup (NodeSetup) installs that runtime, which is this very
//     binary run as kubectl-migrate-runtime (pkg/ociruntime).
//
// The canary of kubectl migrate check is here too: a tiny process with a
// state and a TCP connection, checkpointed and restored to prove a pair of
// nodes.
package agent
