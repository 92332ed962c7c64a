// Package tiers holds kvtier's storage tiers. This file set implements the
// host tier's bookkeeping: a slab allocator over the shared host arena plus
// the block index (key → slot), recency order, leases and eviction.
//
// # Host tier
//
// The arena is cut into equal slabs. Every distinct block size is a class;
// a class owns whole slabs and cuts each into floor(SlabBytes/stride) slots,
// stride being the size rounded up to the alignment. Because a slab holds a
// single size, there is no external fragmentation inside a slab and the tail
// wasted per slab is less than one stride.
//
// Block lifecycle:
//
//	Reserve → (client copies bytes in) → Commit → visible to Lookup/Acquire
//	        ↘ Abort (slot freed)
//	Acquire → lease (pinned: never evicted, never moved) → Release
//	Delete/DeleteNS → gone from the index; a leased block keeps its slot
//	                  until its last lease is released.
//
// A reserved or leased block is pinned: the allocator never evicts it and
// never moves it, so a client may copy to/from Handle.Offset without any lock
// for as long as it holds the reservation or lease.
//
// # Eviction and compaction
//
// Reserve takes, in order: a free slot of the class (from the fullest slab
// that has one, so slabs stay dense and sparse slabs drain), a free slab, and
// only then evicts. Each class keeps an intrusive LRU list of its committed,
// unleased blocks; every access stamps a global tick, so comparing the list
// tails gives the global LRU order across classes. The victim class is the one
// with the oldest tail among those that can actually help: the requesting
// class itself (one eviction gives a slot), or another class D that owns a
// slab with no pinned slot. Once D is chosen, Reserve keeps evicting D's LRU
// blocks until a slab comes free, instead of hopping to whichever class is
// now oldest: hopping would scatter free slots over several classes without
// ever freeing a whole slab.
//
// A class D compacts as soon as it has at least slotsPerSlab free slots and
// an unpinned slab: it drains the unpinned slab with the fewest live slots by
// moving each block (memmove in the arena, Handle.Offset updated under the
// lock) into free slots of its other slabs, then returns the slab to the
// pool. With F ≥ slotsPerSlab free slots, the free slots outside the drained
// slab number F-(spp-live) ≥ live, so the moves always fit. This gives:
//
//   - a Reserve evicts at most one block of its own class, or at most
//     slotsPerSlab(D) blocks of one other class D (≤ SlabBytes of data);
//   - after every operation, each class with an unpinned slab has fewer than
//     slotsPerSlab free slots outside the free-slab pool (a class whose every
//     slab holds a pinned block cannot be compacted and is exempt);
//   - compaction moves at most one slab's blocks per slotsPerSlab frees, so it
//     costs amortized at most one block copy per freed block.
//
// Compaction copies under the Host lock, so its latency (up to one slab of
// memmove) is paid by whichever call triggered it.
package tiers
