package redistest

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// listensOn reports whether process pid holds a listening TCP socket on
// port: that a dial succeeds proves only that somebody listens there.
func listensOn(pid, port int) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	inodes := make(map[string]bool)
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(dir, fd.Name()))
		if inode, ok := strings.CutPrefix(link, "socket:["); err == nil && ok {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	local := fmt.Sprintf(":%04X", port)
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local_address rem_address st ... inode; st 0A is LISTEN.
			fields := strings.Fields(sc.Text())
			if len(fields) > 9 && strings.HasSuffix(fields[1], local) && fields[3] == "0A" && inodes[fields[9]] {
				f.Close()
				return true
			}
		}
		f.Close()
	}
	return false
}
