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

// TestDisksOf: a volume resolves to the whole disks that serve its block
// requests, down device-mapper and md stacks, partitions to their disk.
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
