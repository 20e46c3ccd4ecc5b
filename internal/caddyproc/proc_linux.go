package caddyproc

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill a node if the caller dies first
// (even by SIGKILL), so that no Caddy outlives its test.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
