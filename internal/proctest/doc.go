// Package proctest is the scaffolding the end-to-end suites share
// (internal/e2e, and test/e2e in its own module): the programs they drive,
// built (Build, GoTool), started with their output collected (Start,
// Output), stopped with a grace period after which a stuck Go process is
// made to print its goroutines (Process.Wait, Quit), and read through
// their /metrics (Scrape); and the small things both suites need
// (NeedTools, Parallel).
package proctest
