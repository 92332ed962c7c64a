package client

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"

	"github.com/kvtier/kvtier/shm"
)

// Hash identifies a block within a namespace.
type Hash = shm.Hash

// HashBlock chains one block of token ids onto parent:
// h = XXH3-128(parent || tokens as little-endian uint32). Equal hashes thus
// mean equal prefixes, which is what makes Lookup a prefix match.
func HashBlock(parent Hash, tokens []uint32) Hash {
	buf := make([]byte, 16+4*len(tokens))
	binary.LittleEndian.PutUint64(buf[0:], parent.Hi)
	binary.LittleEndian.PutUint64(buf[8:], parent.Lo)
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(buf[16+4*i:], t)
	}
	u := xxh3.Hash128(buf)
	return Hash{Hi: u.Hi, Lo: u.Lo}
}

// ChainHashes returns the hashes of the full blocks of tokens, chained from
// parent (the zero Hash for a sequence's start). A trailing partial block
// has no hash: it cannot be shared until it is full.
func ChainHashes(parent Hash, tokens []uint32, tokensPerBlock int) []Hash {
	if tokensPerBlock <= 0 {
		return nil
	}
	out := make([]Hash, 0, len(tokens)/tokensPerBlock)
	for i := 0; i+tokensPerBlock <= len(tokens); i += tokensPerBlock {
		parent = HashBlock(parent, tokens[i:i+tokensPerBlock])
		out = append(out, parent)
	}
	return out
}
