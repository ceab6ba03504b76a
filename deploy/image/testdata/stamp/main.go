// Command stamp prints what buildBinary linked into it, standing in for
// cmd/svcproxy in deploy/image's tests (it builds in a second).
package main

import "fmt"

var linkedRevision string

func main() { fmt.Println(linkedRevision) }
