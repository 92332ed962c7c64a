package nvme

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// helperMain runs in a child process (see TestMain).
func helperMain(mode string) int {
	switch mode {
	case "crashwriter":
		return crashWriter(os.Getenv("KVTIER_NVME_DIR"))
	case "reopensmaller":
		return reopenSmaller(os.Getenv("KVTIER_NVME_DIR"))
	case "putnoclose":
		return putNoClose(os.Getenv("KVTIER_NVME_DIR"))
	case "openstat":
		return openStat(os.Getenv("KVTIER_NVME_DIR"))
	case "opendamaged":
		return openDamaged(os.Getenv("KVTIER_NVME_DIR"))
	case "deleteall":
		return deleteAll(os.Getenv("KVTIER_NVME_DIR"), os.Getenv("KVTIER_NVME_OP"), os.Getenv("KVTIER_NVME_FILLER"))
	}
	fmt.Fprintln(os.Stderr, "unknown helper", mode)
	return 2
}

// crashWriter writes, overwrites and deletes blocks forever; the parent
// kills it with SIGKILL. Payloads are derived from the key.
func crashWriter(dir string) int {
	start, _ := strconv.ParseUint(os.Getenv("KVTIER_NVME_START"), 10, 64)
	s, err := Open(context.Background(), Options{Dir: dir, CapacityBytes: 256 << 20, Logger: quietLogger(), GCInterval: 50 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 1
	}
	fmt.Println("ready")
	for i := start; ; i++ {
		k := testKey(7, i%5000)
		size := crashSize(k)
		if i%11 == 0 {
			_ = s.Delete(testKey(7, (i*13)%5000))
			continue
		}
		if i%5 == 0 { // a batch of three (distinct keys: 5000 is not a multiple of 1777)
			ks := []Key{k, testKey(7, (i+1777)%5000), testKey(7, (i+2*1777)%5000)}
			bs := make([][]byte, len(ks))
			for j, bk := range ks {
				bs[j] = payloadFor(bk, crashSize(bk))
			}
			if err := s.PutBatch(ks, bs); err != nil {
				fmt.Fprintln(os.Stderr, "put batch:", err)
			}
			continue
		}
		if err := s.Put(k, payloadFor(k, size)); err != nil {
			fmt.Fprintln(os.Stderr, "put:", err)
		}
	}
}

func crashSize(k Key) int { return 64<<10 + int(k.Hash.Lo%9)*(56<<10) + int(k.Hash.Lo%7) }

// reopenSmaller opens the store in dir with KVTIER_NVME_CAPACITY bytes
// (MinCapacity if unset: below what it holds, so Open evicts), reads back every key reopenKeys wrote (each
// must be exact or a miss) and closes it. It prints "ok" at the end.
func reopenSmaller(dir string) int {
	capacity := int64(MinCapacity)
	if v := os.Getenv("KVTIER_NVME_CAPACITY"); v != "" {
		capacity, _ = strconv.ParseInt(v, 10, 64)
	}
	s, err := Open(context.Background(), Options{Dir: dir, CapacityBytes: capacity, Logger: quietLogger(), GCInterval: 50 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 1
	}
	dst := make([]byte, reopenBlock)
	hits := 0
	for i := range uint64(reopenKeys) {
		k := testKey(9, i)
		n, err := s.Get(k, dst)
		switch {
		case err == nil:
			if n != reopenBlock || !bytes.Equal(dst, payloadFor(k, reopenBlock)) {
				fmt.Fprintln(os.Stderr, "WRONG BYTES for key", i)
				return 1
			}
			hits++
		case errors.Is(err, ErrNotFound):
		default:
			fmt.Fprintln(os.Stderr, "get:", err)
			return 1
		}
	}
	st := s.Stats()
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "close:", err)
	}
	fmt.Printf("ok hits=%d blocks=%d evictions=%d\n", hits, st.Blocks, st.Evictions)
	return 0
}

const (
	reopenKeys  = 12000
	reopenBlock = 4096
)

// deleteAll opens the store in dir and deletes every block reopenKeys
// wrote: one by one (op "delete"), as their namespace ("deletens"), or by
// reading them when they are all damaged ("getcorrupt"); "compact" only
// runs maintenance passes over a store half of whose blocks are deleted. A
// block whose Delete failed must read back exact; one whose Delete
// succeeded must be a miss at once. Then filler (what fills the
// filesystem) is removed: a maintenance pass must write the tombstones the
// full filesystem had no room for, and after a reopen every deleted block
// must still be a miss. It prints "ok" at the end.
func deleteAll(dir, op, filler string) int {
	open := func() (*Store, error) {
		return Open(context.Background(), Options{Dir: dir, CapacityBytes: 100 << 20, Logger: quietLogger(), GCInterval: 50 * time.Millisecond})
	}
	s, err := open()
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 1
	}
	gone := make([]bool, reopenKeys)
	deleted, failed := 0, 0
	switch op {
	case "delete":
		for i := range uint64(reopenKeys) {
			if err := s.Delete(testKey(9, i)); err != nil {
				if !errors.Is(err, ErrNoSpace) {
					fmt.Fprintln(os.Stderr, "delete:", err)
					return 1
				}
				failed++
				continue
			}
			gone[i] = true
			deleted++
		}
	case "deletens":
		n, err := s.DeleteNS(9)
		if err != nil && !errors.Is(err, ErrNoSpace) {
			fmt.Fprintln(os.Stderr, "delete ns:", err)
			return 1
		}
		deleted = n
		for i := range uint64(reopenKeys) {
			gone[i] = !s.Contains(testKey(9, i))
		}
		if err != nil {
			failed = 1
		}
	case "getcorrupt":
		dst := make([]byte, reopenBlock)
		for i := range uint64(reopenKeys) {
			if _, err := s.Get(testKey(9, i), dst); err == nil {
				fmt.Fprintln(os.Stderr, "a damaged block passed verification:", i)
				return 1
			}
			gone[i] = true
		}
		deleted = int(s.Stats().ChecksumMisses)
	case "compact":
		// Let the maintenance loop run a few passes: each compacts the
		// segments at least half dead.
		for range 5 {
			s.mu.Lock()
			ch := s.passDone
			s.mu.Unlock()
			s.wake()
			<-ch
		}
		for i := range uint64(reopenKeys) {
			gone[i] = i%2 == 0
		}
		deleted = int(s.Stats().Relocated)
	default:
		fmt.Fprintln(os.Stderr, "unknown op", op)
		return 2
	}
	check := func(when string) bool {
		dst := make([]byte, reopenBlock)
		for i := range uint64(reopenKeys) {
			k := testKey(9, i)
			n, err := s.Get(k, dst)
			switch {
			case err == nil && gone[i]:
				fmt.Fprintln(os.Stderr, when+": deleted block back:", i)
				return false
			case err == nil && (n != reopenBlock || !bytes.Equal(dst, payloadFor(k, reopenBlock))):
				fmt.Fprintln(os.Stderr, when+": WRONG BYTES for key", i)
				return false
			case err != nil && !errors.Is(err, ErrNotFound):
				fmt.Fprintln(os.Stderr, when+": get:", err)
				return false
			}
		}
		return true
	}
	if !check("after the deletes") {
		return 1
	}
	s.mu.Lock()
	late := len(s.lateDel)
	s.mu.Unlock()
	if err := os.Remove(filler); err != nil {
		fmt.Fprintln(os.Stderr, "remove filler:", err)
		return 1
	}
	for range 2 { // a pass that began before the removal may have found no room
		s.mu.Lock()
		ch := s.passDone
		s.mu.Unlock()
		s.wake()
		<-ch
	}
	s.mu.Lock()
	left := len(s.lateDel)
	s.mu.Unlock()
	if left != 0 {
		fmt.Fprintf(os.Stderr, "%d of %d late tombstones still pending with room on the filesystem\n", left, late)
		return 1
	}
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "close:", err)
	}
	if s, err = open(); err != nil {
		fmt.Fprintln(os.Stderr, "reopen:", err)
		return 1
	}
	if !check("after a reopen") {
		return 1
	}
	s.Close()
	fmt.Printf("ok deleted=%d refused=%d late=%d\n", deleted, failed, late)
	return 0
}

// replayKeys empty blocks are what putNoClose writes: about 10 MiB of
// badger's write-ahead log, all in one memtable, and no segment bytes.
const replayKeys = 120000

// putNoClose writes replayKeys empty blocks to the store in dir and exits
// without closing it (as a kill -9 would): the index records are only in
// badger's write-ahead log.
func putNoClose(dir string) int {
	s, err := Open(context.Background(), Options{Dir: dir, CapacityBytes: 100 << 20, Logger: quietLogger(), GCInterval: time.Hour})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 1
	}
	var ks []Key
	var bs [][]byte
	for i := range uint64(replayKeys) {
		ks, bs = append(ks, testKey(11, i)), append(bs, nil)
		if len(ks) == 1000 {
			if err := s.PutBatch(ks, bs); err != nil {
				fmt.Fprintln(os.Stderr, "put batch:", err)
				return 1
			}
			ks, bs = ks[:0], bs[:0]
		}
	}
	fmt.Printf("ok wrote=%d\n", replayKeys)
	return 0
}

// openStat opens the store in dir and prints "ok blocks=N" (its blocks
// after the reindex, each of putNoClose's keys checked), or "ok refused"
// when Open refuses for want of space.
func openStat(dir string) int {
	s, err := Open(context.Background(), Options{Dir: dir, CapacityBytes: 100 << 20, Logger: quietLogger(), GCInterval: time.Hour})
	if errors.Is(err, ErrNoSpace) {
		fmt.Println("ok refused")
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 1
	}
	defer s.Close()
	dst := make([]byte, 1)
	for i := range uint64(replayKeys) {
		if n, err := s.Get(testKey(11, i), dst); err != nil || n != 0 {
			fmt.Fprintln(os.Stderr, "get", i, n, err)
			return 1
		}
	}
	fmt.Printf("ok blocks=%d\n", s.Stats().Blocks)
	return 0
}
