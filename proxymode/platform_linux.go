package proxymode

// LinuxOnly checks that this system can run what, a Linux-only feature (a
// kernel mode, steering).
func LinuxOnly(what string) error { return nil }
