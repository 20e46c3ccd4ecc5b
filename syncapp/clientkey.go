package syncapp

import "crypto/sha256"

// MaxKeyLen is the longest client key a namespace holds as it is. Zones
// are bounded in keys, so the bytes of each key must be bounded too.
const MaxKeyLen = 256

// boundLen is the length of every bounded key: its first bytes and a
// SHA-256.
const boundLen = MaxKeyLen + 16

// BoundKey returns the key under which a namespace counts a client key:
// keys of up to MaxKeyLen bytes unchanged, and longer ones as their first
// bytes followed by the SHA-256 of the whole key. A bounded key is longer
// than MaxKeyLen, so it never equals a short key, and two long keys share
// one only if SHA-256 collides. The rate_limit handler bounds every key
// it counts, and the admin API every key it is given.
func BoundKey(key string) string {
	if len(key) <= MaxKeyLen {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return key[:boundLen-sha256.Size] + string(sum[:])
}

// namedKeys returns the keys of a namespace that a key given to the admin
// API may name: the bounded form of a client key longer than MaxKeyLen,
// and, for a key of a bounded key's length, the key itself, as listings
// show it.
func namedKeys(key string) []string {
	bound := BoundKey(key)
	switch {
	case bound == key:
		return []string{key}
	case len(key) == boundLen:
		return []string{bound, key}
	}
	return []string{bound}
}
