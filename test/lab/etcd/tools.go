//go:build tools

// Package tools pins the etcd server the lab builds:
// go build -o BIN go.etcd.io/etcd/server/v3
package tools

import _ "go.etcd.io/etcd/server/v3"
