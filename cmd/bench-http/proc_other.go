//go:build !linux

package main

import "os/exec"

// setDeathSignal does nothing here: only Linux has a parent-death signal,
// so a server outlives this command only if it is killed outright.
func setDeathSignal(*exec.Cmd) {}
