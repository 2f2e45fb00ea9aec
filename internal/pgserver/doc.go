// Package pgserver starts a throwaway PostgreSQL server as a child process,
// for tests and for a local development cluster. It needs no Docker: it runs
// the locally installed initdb and postgres binaries (on Debian:
// apt-get install postgresql, which puts them in /usr/lib/postgresql/N/bin).
//
// Start creates a cluster in a directory (a fresh temporary one by default),
// runs postgres directly as a child process listening on 127.0.0.1 and on a
// Unix socket, and waits until it accepts connections. Stop shuts it down,
// waits for every server process to exit, and removes the temporary
// directory. The default configuration favours speed over durability
// (fsync=off) and keeps PostgreSQL's default transaction isolation (read
// committed), as a production server has it: what needs SERIALIZABLE asks
// for it in its own BEGIN.
//
// # Running as root
//
// PostgreSQL refuses to run as root. When the calling process has effective
// uid 0, initdb and postgres run as the "postgres" OS user (created by the
// Debian package), and the directories Start creates are owned by that user.
// A caller-supplied Options.Dir must then be reachable by that user: every
// parent directory must be searchable by it (t.TempDir() is not, because its
// parent has mode 0700); Start reports an error naming the offending parent.
// DirFor picks a directory that user can reach for a given one: the
// directory itself, or a stable one under /var/tmp.
//
// # TLS
//
// With Options.TLS the server turns ssl on with a certificate for
// 127.0.0.1, ::1 and localhost signed by a throwaway certificate authority
// made at start; TLSURLFor gives a sslmode=verify-full URL that trusts it
// (CAFile).
//
// # Process lifetime
//
// The postmaster runs in its own process group and receives SIGQUIT
// (PostgreSQL's immediate shutdown) if the process that started it dies, so
// a crashed or killed test binary does not leave a server behind, although
// the data directory is then left in the temporary directory. The context
// given to Start bounds startup only: if it is cancelled before the server
// is ready, Start stops the server and cleans up before returning.
package pgserver
