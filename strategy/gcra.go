package strategy

// Rater is a Store that can decide rates (GCRA) synchronously: the
// capability that a rate in a namespace with sync_rate 0 needs.
type Rater interface {
	Store
}
