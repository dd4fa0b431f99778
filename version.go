package resilience

// Version is the module's release, in semantic-version form with its leading
// "v", as it is tagged in the repository: the version to pin with
// `go get github.com/grpc-resilience/resilience@` followed by it. It is the
// newest release of CHANGELOG.md; a build from a commit after that release
// still reports it.
const Version = "v0.5.0"
