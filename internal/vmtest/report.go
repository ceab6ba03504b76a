package vmtest

import (
	"testing"
	"time"
)

// Report is a host test's verdict on a guest run: Boot's console and error,
// the run having started at start. Every VMTEST FAIL fails tb, as do a boot
// error, a guest that did not finish and one that passed nothing; the
// console is logged whenever anything is wrong.
func Report(tb testing.TB, console string, err error, start time.Time) Results {
	tb.Helper()
	res := ParseResults(console)
	tb.Logf("VM ran %v: %d passed, %d failed", time.Since(start).Round(100*time.Millisecond), len(res.Pass), len(res.Fail))
	if err != nil || !res.Done || len(res.Fail) > 0 || len(res.Pass) == 0 {
		tb.Logf("console:\n%s", console)
	}
	if err != nil {
		tb.Fatalf("VM: %v", err)
	}
	for _, f := range res.Fail {
		tb.Errorf("in the VM: %s", f)
	}
	if !res.Done {
		tb.Errorf("the guest did not finish")
	}
	if len(res.Pass) == 0 {
		tb.Errorf("the guest reported no passed checks")
	}
	return res
}
