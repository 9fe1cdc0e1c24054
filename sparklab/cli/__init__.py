"""cli: the command line, the only place that parses arguments, prints, and catches SparklabError.

`main` holds the command table, the parser assembled from it and the error boundary. One file per command
group (`up`: render and up, with `cluster` for a server across hosts; `bench`; `sweep`: sweep and tune;
`report`; `pull`; `hosts`: ps, down, logs and gc; `recipes`) holds each command's typed arguments, whose
`add_cli_args` writes its flags and `from_cli_args` reads them back, and the function that makes its library
call. Only this package imports argparse: library code takes typed requests, never a Namespace. `args` holds
the argument types and flags several commands share, `terminal` the two consoles, `console` and `progress` the
rich renderables (pure: a result in, something printable out). It may import every other package; nothing
imports it. See docs/architecture.md.
"""
