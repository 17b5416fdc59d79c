package store

// MapPlaced is a Backend whose files have data only once the metadata
// engine holds a stripe map for them (pNFS's striped backend: a file's
// objects are where its map says). For a file without one, Remove has
// nothing to remove, so a caller that knows there is no map (the
// metadata server freeing a small file kept inline) may skip it.
type MapPlaced interface {
	// PlacedByMap reports whether the property holds for this backend
	// (a wrapper forwards its inner backend's answer).
	PlacedByMap() bool
}
