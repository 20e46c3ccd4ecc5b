package accuracy

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill a node if the harness dies first
// (even by SIGKILL), so that no Caddy outlives a run.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
