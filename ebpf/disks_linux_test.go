package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeDev is one block device of a fake sysfs tree.
type fakeDev struct {
	path   string   // under devices/; a partition's parent directory is its disk
	dev    string   // the dev file's content ("MAJ:MIN"); "" for none
	part   bool     // a partition (has a partition file)
	slaves []string // paths of the devices below it
	mpath  []string // paths of the devices its multipath/ directory links to
	link   string   // path is a symlink to this path (a subsystem's controller)
}

// fakeSysfs builds the tree under a temp dir the way the kernel lays it
// out: dev/block/MAJ:MIN and slaves/NAME are relative symlinks into devices/.
func fakeSysfs(t *testing.T, devs []fakeDev) string {
	t.Helper()
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "dev", "block"), 0o755))
	for _, d := range devs {
		dir := filepath.Join(root, "devices", d.path)
		if d.link != "" {
			must(os.MkdirAll(filepath.Dir(dir), 0o755))
			rel, err := filepath.Rel(filepath.Dir(dir), filepath.Join(root, "devices", d.link))
			must(err)
			must(os.Symlink(rel, dir))
			continue
		}
		must(os.MkdirAll(dir, 0o755))
		if d.dev != "" {
			must(os.WriteFile(filepath.Join(dir, "dev"), []byte(d.dev+"\n"), 0o444))
			rel, err := filepath.Rel(filepath.Join(root, "dev", "block"), dir)
			must(err)
			must(os.Symlink(rel, filepath.Join(root, "dev", "block", d.dev)))
		}
		if d.part {
			must(os.WriteFile(filepath.Join(dir, "partition"), []byte("1\n"), 0o444))
		}
		if d.slaves != nil {
			must(os.MkdirAll(filepath.Join(dir, "slaves"), 0o755))
		}
		for _, s := range d.slaves {
			rel, err := filepath.Rel(filepath.Join(dir, "slaves"), filepath.Join(root, "devices", s))
			must(err)
			must(os.Symlink(rel, filepath.Join(dir, "slaves", filepath.Base(s))))
		}
		if d.mpath != nil {
			must(os.MkdirAll(filepath.Join(dir, "multipath"), 0o755))
		}
		for _, s := range d.mpath {
			rel, err := filepath.Rel(filepath.Join(dir, "multipath"), filepath.Join(root, "devices", s))
			must(err)
			must(os.Symlink(rel, filepath.Join(dir, "multipath", filepath.Base(s))))
		}
	}
	return root
}

func nvmeDisks(n int) (devs []fakeDev, names []string) {
	for i := range n {
		name := fmt.Sprintf("nvme%dn1", i)
		devs = append(devs, fakeDev{path: "pci/nvme" + fmt.Sprint(i) + "/" + name, dev: fmt.Sprintf("259:%d", i)})
		names = append(names, "pci/nvme"+fmt.Sprint(i)+"/"+name)
	}
	return devs, names
}

// multipathNS lays out NVMe native multipath: subsystem s's namespace n
// (head nvme<s>n<n>, device 259:head) reached through controllers ctrls,
// whose path disks nvme<s>c<c>n<n> are hidden (no dev file). links: the
// head has a multipath/ directory (6.15+); else only the subsystem's
// links to its controllers say where the paths are.
func multipathNS(s, n int, head int, ctrls []int, links bool) (devs []fakeDev, headPath string) {
	subsys := fmt.Sprintf("virtual/nvme-subsystem/nvme-subsys%d", s)
	headPath = fmt.Sprintf("%s/nvme%dn%d", subsys, s, n)
	var paths []string
	for _, c := range ctrls {
		ctrl := fmt.Sprintf("pci/0000:0%d:00.0/nvme/nvme%d", c, c)
		p := fmt.Sprintf("%s/nvme%dc%dn%d", ctrl, s, c, n)
		paths = append(paths, p)
		devs = append(devs, fakeDev{path: p},
			fakeDev{path: fmt.Sprintf("%s/nvme%d", subsys, c), link: ctrl})
	}
	h := fakeDev{path: headPath, dev: fmt.Sprintf("259:%d", head)}
	if links {
		h.mpath = paths
	}
	return append(devs, h), headPath
}

// TestDisksOf: a volume resolves to the whole disks that serve its block
// requests, down device-mapper and md stacks, partitions to their disk,
// NVMe multipath heads to their path disks.
func TestDisksOf(t *testing.T) {
	two, twoNames := nvmeDisks(2)
	sixteen, sixteenNames := nvmeDisks(MaxDisks)
	seventeen, seventeenNames := nvmeDisks(MaxDisks + 1)
	vda := []fakeDev{
		{path: "virtio0/block/vda", dev: "254:0"},
		{path: "virtio0/block/vda/vda1", dev: "254:1", part: true},
	}
	nvme0p := []fakeDev{
		{path: "pci/nvme0/nvme0n1", dev: "259:0"},
		{path: "pci/nvme0/nvme0n1/nvme0n1p1", dev: "259:1", part: true},
		{path: "pci/nvme0/nvme0n1/nvme0n1p2", dev: "259:2", part: true},
	}
	mp2, mp2Head := multipathNS(0, 1, 0, []int{0, 1}, true)
	mp2Old, _ := multipathNS(0, 1, 0, []int{0, 1}, false)
	mp2Part := append(slices.Clone(mp2), fakeDev{path: mp2Head + "/nvme0n1p1", dev: "259:5", part: true})
	mpLVM := func() []fakeDev {
		a, aHead := multipathNS(0, 1, 0, []int{0, 1}, true)
		b, bHead := multipathNS(1, 1, 1, []int{2, 3}, false)
		return append(append(a, b...),
			fakeDev{path: "virtual/block/md0", dev: "9:0", slaves: []string{aHead, bHead}},
			fakeDev{path: "virtual/block/dm-0", dev: "253:0", slaves: []string{"virtual/block/md0"}})
	}()
	mp17, _ := multipathNS(0, 1, 0, func() (c []int) {
		for i := range MaxDisks + 1 {
			c = append(c, i)
		}
		return c
	}(), true)
	for _, tc := range []struct {
		name    string
		devs    []fakeDev
		query   string // MAJ:MIN of the filesystem's device
		want    []string
		wantErr string // substring; "" for success
		unavail bool   // the error is ErrUnavailable
	}{
		{name: "plain disk", devs: vda, query: "254:0", want: []string{"vda (254:0)"}},
		{name: "partition", devs: vda, query: "254:1", want: []string{"vda (254:0)"}},
		{
			name:  "dm-linear over one partition",
			devs:  append(slices.Clone(nvme0p), fakeDev{path: "virtual/block/dm-0", dev: "253:0", slaves: []string{"pci/nvme0/nvme0n1/nvme0n1p2"}}),
			query: "253:0", want: []string{"nvme0n1 (259:0)"},
		},
		{
			name: "LVM over md RAID0 over two NVMe disks",
			devs: append(slices.Clone(two),
				fakeDev{path: "virtual/block/md0", dev: "9:0", slaves: twoNames},
				fakeDev{path: "virtual/block/dm-0", dev: "253:0", slaves: []string{"virtual/block/md0"}}),
			query: "253:0", want: []string{"nvme0n1 (259:0)", "nvme1n1 (259:1)"},
		},
		{
			name: "partition of an md array",
			devs: append(slices.Clone(two),
				fakeDev{path: "virtual/block/md0", dev: "9:0", slaves: twoNames},
				fakeDev{path: "virtual/block/md0/md0p1", dev: "259:9", part: true}),
			query: "259:9", want: []string{"nvme0n1 (259:0)", "nvme1n1 (259:1)"},
		},
		{
			name: "two partitions of one disk, twice over",
			devs: append(slices.Clone(nvme0p),
				fakeDev{path: "virtual/block/dm-1", dev: "253:1", slaves: []string{"pci/nvme0/nvme0n1/nvme0n1p1", "pci/nvme0/nvme0n1/nvme0n1p2"}},
				fakeDev{path: "virtual/block/dm-2", dev: "253:2", slaves: []string{"pci/nvme0/nvme0n1/nvme0n1p2"}},
				fakeDev{path: "virtual/block/dm-0", dev: "253:0", slaves: []string{"virtual/block/dm-1", "virtual/block/dm-2"}}),
			query: "253:0", want: []string{"nvme0n1 (259:0)"},
		},
		{
			name:  "md over MaxDisks disks",
			devs:  append(slices.Clone(sixteen), fakeDev{path: "virtual/block/md0", dev: "9:0", slaves: sixteenNames}),
			query: "9:0", want: func() (w []string) {
				for i := range MaxDisks {
					w = append(w, fmt.Sprintf("nvme%dn1 (259:%d)", i, i))
				}
				slices.Sort(w) // sysfs order: by name
				return w
			}(),
		},
		{
			name:    "too many disks",
			devs:    append(slices.Clone(seventeen), fakeDev{path: "virtual/block/md0", dev: "9:0", slaves: seventeenNames}),
			query:   "9:0",
			wantErr: fmt.Sprintf("more than %d disks", MaxDisks), unavail: true,
		},
		{
			name: "cycle",
			devs: []fakeDev{
				{path: "virtual/block/dm-0", dev: "253:0", slaves: []string{"virtual/block/dm-1"}},
				{path: "virtual/block/dm-1", dev: "253:1", slaves: []string{"virtual/block/dm-0"}},
			},
			query: "253:0", wantErr: "cycle", unavail: true,
		},
		{
			name: "missing dev file",
			devs: []fakeDev{
				{path: "pci/nvme0/nvme0n1"},
				{path: "virtual/block/dm-0", dev: "253:0", slaves: []string{"pci/nvme0/nvme0n1"}},
			},
			query: "253:0", wantErr: "read device number",
		},
		{name: "not a block device", devs: vda, query: "0:42", wantErr: "not a block device", unavail: true},
		{
			name: "NVMe multipath head", devs: mp2, query: "259:0",
			want: []string{"nvme0c0n1 (path of nvme0n1)", "nvme0c1n1 (path of nvme0n1)"},
		},
		{
			name: "NVMe multipath head, no multipath links (before 6.15)", devs: mp2Old, query: "259:0",
			want: []string{"nvme0c0n1 (path of nvme0n1)", "nvme0c1n1 (path of nvme0n1)"},
		},
		{
			name: "partition of an NVMe multipath head", devs: mp2Part, query: "259:5",
			want: []string{"nvme0c0n1 (path of nvme0n1)", "nvme0c1n1 (path of nvme0n1)"},
		},
		{
			name: "LVM over md over two NVMe multipath heads", devs: mpLVM, query: "253:0",
			want: []string{
				"nvme0c0n1 (path of nvme0n1)", "nvme0c1n1 (path of nvme0n1)",
				"nvme1c2n1 (path of nvme1n1)", "nvme1c3n1 (path of nvme1n1)",
			},
		},
		{
			name: "NVMe multipath head without a path yet", query: "259:0",
			devs: []fakeDev{{path: "virtual/nvme-subsystem/nvme-subsys0/nvme0n1", dev: "259:0", mpath: []string{}}},
			want: []string{"nvme0n1 (259:0)"},
		},
		{
			name: "NVMe multipath head over too many paths", devs: mp17, query: "259:0",
			wantErr: fmt.Sprintf("more than %d disks", MaxDisks), unavail: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeSysfs(t, tc.devs)
			var maj, min uint32
			if _, err := fmt.Sscanf(tc.query, "%d:%d", &maj, &min); err != nil {
				t.Fatal(err)
			}
			got, err := disksOf(root, maj, min)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("disksOf(%s) = %v, %v; want an error containing %q", tc.query, got, err, tc.wantErr)
				}
				if tc.unavail != errors.Is(err, ErrUnavailable) {
					t.Fatalf("disksOf(%s): %v; ErrUnavailable %v, want %v", tc.query, err, !tc.unavail, tc.unavail)
				}
				return
			}
			if err != nil {
				t.Fatalf("disksOf(%s): %v", tc.query, err)
			}
			var names []string
			for _, d := range got {
				names = append(names, d.String())
			}
			if !slices.Equal(names, tc.want) {
				t.Fatalf("disksOf(%s) = %v, want %v", tc.query, names, tc.want)
			}
		})
	}
}
