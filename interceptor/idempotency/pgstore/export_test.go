package pgstore

// LargeObjectsLayout reports whether the handler's large objects pass the
// gate (see largeObjectsOf).
var LargeObjectsLayout = largeObjectsLayout
