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
// that has one, so slabs stay dense and sparse slabs drain), a free slab, a
// slab freed by compaction, and only then evicts. Each class keeps an
// intrusive LRU list of its committed, unleased blocks; every access stamps a
// global tick, so comparing the list tails gives the global LRU order across
// classes. The victim class is the one with the oldest tail among those that
// can actually help: the requesting class itself (one eviction gives a
// slot), or another class D that owns a slab with no pinned slot. Once D is
// chosen, Reserve keeps evicting D's LRU blocks until a slab comes free,
// instead of hopping to whichever class is now oldest: hopping would scatter
// free slots over several classes without ever freeing a whole slab.
//
// Compaction is lazy: Delete, Release, Commit and evictions only free slots,
// and free slots stay in their slabs, to be refilled in place by the next
// Reserve of the same class. Only a Reserve that needs a slab when none is
// free compacts: it picks, among the classes D with at least slotsPerSlab(D)
// free slots and a slab with no pinned slot, the unpinned slab with the
// fewest live bytes, moves each of its blocks (memmove in the arena,
// Handle.Offset updated under the lock) into free slots of D's other slabs,
// and takes the emptied slab. With F ≥ slotsPerSlab free slots, the free
// slots outside the drained slab number F-(spp-live) ≥ live, so the moves
// always fit. Compaction is tried before every eviction, and it is also what
// turns the slots freed by evicting from another class D into a slab. This
// gives:
//
//   - a Reserve evicts or returns ErrFull only when compaction cannot give
//     it a slot: no class D other than its own (which has no free slot then)
//     has both slotsPerSlab(D) free slots and a slab with no pinned slot;
//   - a Reserve evicts at most one block of its own class, or at most
//     slotsPerSlab(D) blocks of one other class D (≤ SlabBytes of data);
//   - fragmentation bound: whenever a Reserve evicts or returns ErrFull,
//     every class D holds at most (P+1)·(slotsPerSlab(D)-1) free slots, P
//     being the number of D's slabs that hold a pinned block: fewer than
//     slotsPerSlab(D) if D owns an unpinned slab (else compaction would have
//     run), and at most slotsPerSlab(D)-1 per slab if all its P slabs are
//     pinned (a slab is never empty). So the space stranded while memory is
//     short is less than (classes + pinned slabs)·SlabBytes. Between
//     allocations a class may hold any number of free slots: they are not
//     stranded, since its own Reserves refill them and any other class's
//     Reserve reclaims them by compaction before evicting anything;
//   - a Reserve compacts at most once (at most slotsPerSlab blocks, ≤ one
//     slab of memmove) and only when it needs a slab; no other call moves a
//     block, and a tier with a single block size never compacts (its
//     Reserves reach compaction only with no free slot in the class);
//   - pinned blocks are never moved or evicted.
//
// Compaction copies under the Host lock, so its latency (up to one slab of
// memmove) is paid by the Reserve that needed the slab.
package tiers
