package nvme

import (
	"encoding/binary"
	"flag"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/kvtier/kvtier/shm"
	"go.uber.org/goleak"
)

const helperEnv = "KVTIER_NVME_HELPER"

func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain(os.Getenv(helperEnv)))
	}
	goleak.VerifyTestMain(m)
}

// testKey returns the i-th key of namespace ns.
func testKey(ns uint32, i uint64) Key {
	return Key{NS: ns, Hash: shm.Hash{Hi: i*0x9E3779B97F4A7C15 + 1, Lo: i}}
}

// fillFor writes the payload that belongs to k (deterministic) into b.
func fillFor(k Key, b []byte) {
	r := rand.NewPCG(k.Hash.Hi^uint64(k.NS)<<32, k.Hash.Lo)
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	for x := r.Uint64(); i < len(b); i++ {
		b[i] = byte(x)
		x >>= 8
	}
}

func payloadFor(k Key, size int) []byte {
	b := make([]byte, size)
	fillFor(k, b)
	return b
}
