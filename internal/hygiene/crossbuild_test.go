package hygiene

import (
	"os"
	"os/exec"
	"testing"
)

// TestOtherSystemsBuild builds the forwarder and the daemon for systems
// other than Linux, where the userspace mode runs on the goroutine engine
// (forwarder/doc.go, "Other systems"), and vets the forwarder's tests
// there, so a Linux-only call in a shared file fails here first.
func TestOtherSystemsBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-building for windows and darwin: skipped in -short mode")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool to cross-build with: %v", err)
	}
	const mod = "github.com/svcproxy/svcproxy/"
	for _, goos := range []string{"windows", "darwin"} {
		t.Run(goos, func(t *testing.T) {
			for _, args := range [][]string{
				{"build", mod + "forwarder", mod + "cmd/svcproxy"},
				{"vet", mod + "forwarder"},
			} {
				cmd := exec.Command(goTool, args...)
				cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH=amd64", "CGO_ENABLED=0")
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Errorf("GOOS=%s go %s: %v\n%s", goos, args[0], err, out)
				}
			}
		})
	}
}
