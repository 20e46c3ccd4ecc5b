//go:build !linux

package redistest

// listensOn cannot tell who listens outside Linux; a successful dial has
// to do.
func listensOn(pid, port int) bool { return true }
