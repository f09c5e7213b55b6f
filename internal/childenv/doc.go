// Package childenv is the environment Rialto gives the programs it starts
// (nft, qemu, a memory mapping's fault handler): its own, without the
// RIALTO_* variables, which carry settings none of them needs and secrets
// (the API token, bootstrap tokens, a database URL with its password) none
// of them may see. The rialto binary also takes its secrets out of its own
// environment at start; this keeps other programs built on the same
// packages from handing them on.
package childenv
