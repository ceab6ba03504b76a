package topology

import (
	"errors"
	"fmt"
)

// ErrUnsupported is wrapped by the errors of New when this process cannot
// build a topology here: not root, no `ip` command, or the kernel refuses
// network namespaces or veth pairs. It also matches [errors.ErrUnsupported].
var ErrUnsupported = fmt.Errorf("network namespaces unavailable: %w", errors.ErrUnsupported)
