package proc

import (
	"os/exec"
	"syscall"
)

// SetDeathSignal has the kernel kill cmd's process if the caller dies
// first (even by SIGKILL), so that no server outlives a crashed test or
// harness.
func SetDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
