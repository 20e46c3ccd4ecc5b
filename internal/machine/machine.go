// Package machine describes the machine a harness ran on, for the pages
// the harnesses write into (docs/accuracy.md, docs/faults.md).
package machine

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
)

// Describe returns the CPU model, the cores, the OS and architecture, and
// the load average.
func Describe() string {
	model := "CPU model unknown"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(data)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	load := ""
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(data)); len(f) >= 3 {
			load = ", load average " + strings.Join(f[:3], " ")
		}
	}
	return fmt.Sprintf("%s, %d cores, %s/%s%s", model, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, load)
}

// Version returns the first line of a command's version output, or "".
func Version(name string, args ...string) string {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(line)
}
