package ebpf

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// requireTools skips t unless every command is installed.
func requireTools(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			t.Skipf("%s not installed: %v", n, err)
		}
	}
}

// loopDevice attaches a loop device over a new file of size bytes and
// detaches it at the end of t; it skips t where no loop device can be set up.
func loopDevice(t *testing.T, size int64) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "backing")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, size); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Skipf("cannot set up a loop device: losetup: %v: %s", err, bytes.TrimSpace(out))
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", dev, err, bytes.TrimSpace(out))
		}
	})
	return dev
}

// blockDevice is the Device of the block special file path.
func blockDevice(t *testing.T, path string) Device {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return Device{Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev)}
}

// counts reads the request count of each op.
func counts(t *testing.T, l *IOLatency) (c [2]uint64) {
	t.Helper()
	for op := range OpNames {
		h, err := l.Read(op)
		if err != nil {
			t.Fatal(err)
		}
		c[op] = h.Count
	}
	return c
}

// TestIOLatencyWatchesEachDisk: one probe counts the requests of every disk
// of its set (the disks under a striped volume) and of no other.
func TestIOLatencyWatchesEachDisk(t *testing.T) {
	requireBPF(t)
	requireTools(t, "losetup")
	var loops [3]string
	for i := range loops {
		loops[i] = loopDevice(t, 8<<20)
	}
	var devs []Device
	for _, p := range loops[:2] {
		d := blockDevice(t, p)
		ds, err := disksOf("/sys", d.Major, d.Minor)
		if err != nil {
			t.Fatalf("disks of %s: %v", p, err)
		}
		devs = append(devs, ds...)
	}
	l, err := OpenIOLatency(Env{}, devs)
	skipUnavailable(t, err)
	defer l.Close()
	for _, p := range loops[:2] {
		before := counts(t, l)
		directIOAt(t, p, 0) // each request completes before its syscall returns
		after := counts(t, l)
		for op, name := range OpNames {
			if after[op] <= before[op] {
				t.Errorf("%s requests on watched %s: count %d before the I/O, %d after", name, p, before[op], after[op])
			}
		}
	}
	// udev may read a new loop device at any time, but writes it does not.
	before := counts(t, l)
	directIOAt(t, loops[2], 0)
	if after := counts(t, l); after[OpWrite] != before[OpWrite] {
		t.Errorf("writes on unwatched %s counted: %d before, %d after", loops[2], before[OpWrite], after[OpWrite])
	}
}

// TestIOLatencyDeviceMapper: on a filesystem over a device-mapper volume
// (bio-based: it issues no requests of its own) the probe counts the
// requests of the disk below it.
func TestIOLatencyDeviceMapper(t *testing.T) {
	requireBPF(t)
	requireTools(t, "losetup", "dmsetup", "mkfs.ext4")
	if out, err := exec.Command("dmsetup", "targets").CombinedOutput(); err != nil || !hasTarget(out, "linear") {
		t.Skipf("device-mapper linear target unavailable: dmsetup targets: %v: %s", err, bytes.TrimSpace(out))
	}
	const size = 64 << 20
	loop := loopDevice(t, size)
	loopDev := blockDevice(t, loop)

	name := fmt.Sprintf("kvtier-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	table := fmt.Sprintf("0 %d linear %s 0", size/512, loop)
	if out, err := exec.Command("dmsetup", "create", "--noudevsync", "--table", table, name).CombinedOutput(); err != nil {
		t.Skipf("cannot create a dm-linear volume: dmsetup create: %v: %s", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("dmsetup", "remove", "--noudevsync", "--retry", name).CombinedOutput(); err != nil {
			t.Errorf("dmsetup remove %s: %v: %s", name, err, bytes.TrimSpace(out))
		}
	})
	node := dmNode(t, name)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", node).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 %s: %v: %s", node, err, bytes.TrimSpace(out))
	}
	mnt := t.TempDir()
	if err := unix.Mount(node, mnt, "ext4", 0, ""); err != nil {
		t.Skipf("cannot mount ext4 from %s: %v", node, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("umount %s: %v", mnt, err)
		}
	})

	devs, err := DisksOf(mnt)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s (%s) is on %v", mnt, node, devs)
	if len(devs) != 1 || devs[0].Major != loopDev.Major || devs[0].Minor != loopDev.Minor {
		t.Errorf("DisksOf(%s) = %v, want the loop device %s (%d:%d) under the volume", mnt, devs, loop, loopDev.Major, loopDev.Minor)
	}
	l, err := OpenIOLatency(Env{}, devs)
	skipUnavailable(t, err)
	defer l.Close()
	before := counts(t, l)
	directIO(t, mnt)
	after := counts(t, l)
	for op, name := range OpNames {
		if after[op] <= before[op] {
			t.Errorf("no %s requests counted for O_DIRECT I/O on the dm volume over %s: %d before, %d after", name, loop, before[op], after[op])
		}
	}
}

// hasTarget reports whether dmsetup targets' output lists target.
func hasTarget(out []byte, target string) bool {
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == target {
			return true
		}
	}
	return false
}

// dmNode returns a block special file for the dm volume name:
// /dev/mapper/name where udev or libdm made one, else one made here.
func dmNode(t *testing.T, name string) string {
	t.Helper()
	if p := "/dev/mapper/" + name; isBlock(p) {
		return p
	}
	out, err := exec.Command("dmsetup", "info", "-c", "--noheadings", "--separator", ":", "-o", "major,minor", name).CombinedOutput()
	if err != nil {
		t.Fatalf("dmsetup info %s: %v: %s", name, err, bytes.TrimSpace(out))
	}
	var maj, min uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "%d:%d", &maj, &min); err != nil {
		t.Fatalf("dmsetup info %s: %q: %v", name, out, err)
	}
	p := filepath.Join(t.TempDir(), "dm")
	if err := unix.Mknod(p, unix.S_IFBLK|0o600, int(unix.Mkdev(maj, min))); err != nil {
		t.Skipf("no /dev/mapper/%s and cannot make a device node: %v", name, err)
	}
	return p
}

func isBlock(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode()&os.ModeDevice != 0 && st.Mode()&os.ModeCharDevice == 0
}

// TestIOLatencyWatchesDisksByName: the hidden path disks of NVMe
// multipath have no device number in sysfs, so the probe matches them by
// the name of the request's disk. Loop devices stand in for them here: one
// watched by name alone (as DisksOf describes a path disk), one by number
// beside it, one not watched.
func TestIOLatencyWatchesDisksByName(t *testing.T) {
	requireBPF(t)
	requireTools(t, "losetup")
	var loops [3]string
	for i := range loops {
		loops[i] = loopDevice(t, 8<<20)
	}
	byName := Device{Name: filepath.Base(loops[0]), PathOf: "nvme0n1"} // "loop0"
	l, err := OpenIOLatency(Env{}, []Device{byName, blockDevice(t, loops[1])})
	skipUnavailable(t, err)
	defer l.Close()
	for _, p := range loops[:2] {
		before := counts(t, l)
		directIOAt(t, p, 0)
		after := counts(t, l)
		for op, name := range OpNames {
			if after[op] <= before[op] {
				t.Errorf("%s requests on watched %s: count %d before the I/O, %d after", name, p, before[op], after[op])
			}
		}
	}
	before := counts(t, l)
	directIOAt(t, loops[2], 0)
	if after := counts(t, l); after[OpWrite] != before[OpWrite] {
		t.Errorf("writes on unwatched %s counted: %d before, %d after", loops[2], before[OpWrite], after[OpWrite])
	}
}
