//go:build !linux

package caddyproc

import "os/exec"

// setDeathSignal does nothing where the kernel has no parent-death
// signal: callers stop their nodes themselves.
func setDeathSignal(*exec.Cmd) {}
