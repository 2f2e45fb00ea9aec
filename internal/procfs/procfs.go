// Package procfs answers two questions about local processes from Linux's
// /proc, for the code that starts child processes (pgserver, cluster) and
// for the tests that check nothing was left behind.
package procfs

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// stat returns the fields of /proc/<pid>/stat after the command name (which
// may itself contain spaces and parentheses): state, ppid, ...
func stat(pid string) ([]string, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return nil, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, false
	}
	return strings.Fields(string(b[i+1:])), true
}

// Children lists the processes whose parent is ppid (nil if /proc cannot be
// read).
func Children(ppid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := strconv.Itoa(ppid)
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f, ok := stat(e.Name()); ok && len(f) >= 2 && f[1] == want {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Alive reports whether pid exists and is not a zombie (a process whose
// parent died is reaped by init, which may be slow or, in a container,
// absent).
func Alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	f, ok := stat(strconv.Itoa(pid))
	return ok && (len(f) == 0 || f[0] != "Z")
}
