// Package openapi holds the test that holds every answer of a real node to
// docs/openapi.yaml: it starts a node on a real PostgreSQL, with payments,
// the coordination API, the admin API and sidecar routes, sends the
// requests its clients send (and the mistakes they make), and validates
// each request and answer with an OpenAPI 3.1 validator
// (github.com/pb33f/libopenapi-validator). It lives in the tests module so
// that the library's module needs no requirement on the validator.
package openapi
