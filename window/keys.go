package window

import (
	"math/bits"
	"unsafe"
)

// keyArena holds the bytes of a shard's keys in slabs that hold no
// pointers, one per size class, so that the garbage collector never looks
// at a zone's keys, and a new key is not an allocation of its own. (With a
// Go string per key, a collection while a zone held 1,000,000 keys took
// 33 ms, against 5 ms: BenchmarkGCFullZone.) Keys longer than the largest
// class, which a handler never makes (it bounds its keys), are Go strings.
type keyArena struct {
	slabs [keyClasses]keySlab
	long  []string
	// longFree are the free places of long.
	longFree []uint32
}

// keyClasses is how many size classes of slabs there are: 8 bytes, then
// doubling up to 512.
const (
	keyClasses  = 7
	minKeyShift = 3
)

// keySlab is one size class: slots of the class's size back to back in
// buf.
type keySlab struct {
	buf  []byte
	free []uint32 // slots given back, for reuse
}

// classOf returns the size class of a key of n bytes, or keyClasses when
// it is longer than the largest.
func classOf(n int) int {
	if n <= 1<<minKeyShift {
		return 0
	}
	return min(bits.Len(uint(n-1))-minKeyShift, keyClasses)
}

// put copies key into the arena and returns where it is. The empty key
// takes no room.
func (a *keyArena) put(key string) uint32 {
	n := len(key)
	if n == 0 {
		return 0
	}
	c := classOf(n)
	if c == keyClasses {
		if i, ok := pop(&a.longFree); ok {
			a.long[i] = cloneString(key)
			return i
		}
		a.long = append(a.long, cloneString(key))
		return uint32(len(a.long) - 1)
	}
	s := &a.slabs[c]
	size := 1 << (c + minKeyShift)
	slot, ok := pop(&s.free)
	if !ok {
		slot = uint32(len(s.buf) / size)
		s.buf = append(s.buf, make([]byte, size)...)
	}
	copy(s.buf[int(slot)*size:], key)
	return slot
}

// view returns the key of n bytes at slot as a string that shares the
// arena's bytes: it is valid only while the caller holds the shard's lock
// and the key stays, since the slot is reused once the key is released.
// Whatever outlives that must be a copy, as Take and remove make.
func (a *keyArena) view(slot uint32, n uint32) string {
	if n == 0 {
		return ""
	}
	c := classOf(int(n))
	if c == keyClasses {
		return a.long[slot]
	}
	off := int(slot) << (c + minKeyShift)
	return unsafe.String(&a.slabs[c].buf[off], int(n))
}

// release gives the slot of a key of n bytes back.
func (a *keyArena) release(slot uint32, n uint32) {
	if n == 0 {
		return
	}
	c := classOf(int(n))
	if c == keyClasses {
		a.long[slot] = ""
		a.longFree = append(a.longFree, slot)
		return
	}
	a.slabs[c].free = append(a.slabs[c].free, slot)
}
