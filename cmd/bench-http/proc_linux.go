package main

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill a server if this command dies first
// (even by SIGKILL), so that no Caddy or redis-server outlives a run.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
