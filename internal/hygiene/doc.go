// Package hygiene holds repository-wide checks, run as tests: the import
// boundaries between svcproxy's packages, a doc comment on every one and a
// tidy go.mod.
package hygiene
