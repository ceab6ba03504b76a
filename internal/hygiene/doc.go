// Package hygiene holds repository-wide checks, run as tests: the import
// boundaries between svcproxy's packages and a doc comment on every one.
package hygiene
