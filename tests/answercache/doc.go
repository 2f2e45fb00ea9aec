// Package answercache holds the tests of the engine's answer cache against
// commits whose answer is lost: a proxy (package commitcut, on toxiproxy)
// loses or garbles the answer to a commit the store made, and the engine
// must not keep in memory an answer it never saw acknowledged. They live
// in the tests module so that the library's module needs no requirement on
// toxiproxy.
package answercache
