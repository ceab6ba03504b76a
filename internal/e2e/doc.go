// Package e2e holds svcproxy's end-to-end tests: the real svcproxy binary in
// userspace mode with REDIRECT steering, on a node namespace between client
// and backend namespaces (internal/topology), with real backends and real
// clients (dig, dnsmasq). They need root, iptables and ipset, and skip with
// a message otherwise.
package e2e
