//go:build !linux

package proc

import "os/exec"

// SetDeathSignal does nothing where the kernel has no parent-death
// signal: callers stop their servers themselves.
func SetDeathSignal(*exec.Cmd) {}
