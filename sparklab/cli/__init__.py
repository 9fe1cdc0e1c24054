"""cli: the command line, the only place that parses arguments, prints, and catches SparklabError.

`main` maps each command to one library call; `args` is the grammar; `console` and `progress` are the rich
renderables (pure: a result in, something printable out). It may import every other package; nothing imports
it. See docs/architecture.md.
"""
