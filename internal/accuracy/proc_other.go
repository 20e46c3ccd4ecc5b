//go:build !linux

package accuracy

import "os/exec"

// setDeathSignal does nothing where the kernel has no parent-death
// signal: the harness stops its nodes itself.
func setDeathSignal(*exec.Cmd) {}
