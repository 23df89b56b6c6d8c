//! What a user reads and applies says what the code does.
//!
//! - The CRDs (`bootplate crds` and `deploy/crds`) are created on the real kube-apiserver and
//!   the test fails on any `Warning` header it answers with (`kubectl apply` prints those, for
//!   example `unrecognized format "uint64"`); `kubectl apply --warnings-as-errors -k deploy/crds`
//!   must pass too.
//! - Every command line of a ```sh block in README.md, docs/*.md and docs/templates/*.md is in
//!   [`COMMANDS`]: run (commands that need no cluster, from the repository root, with the
//!   `bootplate` binary built for the tests) or checked at `--help` level (the program, its
//!   subcommand and every flag the line uses exist), and every block passes `bash -n`. A new
//!   line not in the table fails, and so does a table entry that no document holds any more.
//!
//! Needs kubectl, go, curl (tests/scripts/install-tools.sh) and clusterctl
//! (tests/scripts/build-tools.sh); a missing one fails the test.

mod commands;

mod crds;
