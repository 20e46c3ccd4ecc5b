//go:build unix && !linux

package pgtest

import (
	"os/exec"
	"syscall"
)

// setProcAttr runs cmd as cred (nil: as ourselves), in a process group of
// its own. Outside Linux there is no death signal: a crashed test may
// leave a server behind.
func setProcAttr(cmd *exec.Cmd, cred *syscall.Credential) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
}

// children cannot list the server's children outside Linux: Kill kills
// the server's process group only, and its children exit once they notice
// that the server died.
func children(int) []int { return nil }

// alive is never asked about a process outside Linux.
func alive(int) bool { return false }
