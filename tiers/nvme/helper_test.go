package nvme

import (
	"context"
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
