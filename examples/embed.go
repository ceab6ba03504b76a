// Package examples holds the example services file, embedded in svcproxy as
// its default when no --services flag is given.
package examples

import _ "embed"

// Services is services.yaml: two demo Services on loopback.
//
//go:embed services.yaml
var Services []byte
