package migrations

// Load exposes load to the external tests.
var Load = load
