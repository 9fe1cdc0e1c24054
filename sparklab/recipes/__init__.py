"""recipes: recipe and sweep files → rendered launches and plans (pure).

`schema` loads and validates recipe files strictly; `render` turns one (recipe, engine, method) into a `spec.
LaunchSpec` through sandboxed Jinja; `multinode` renders a server across hosts; `hosts` parses the Docker hosts a
sweep names; `plan` expands a sweep file into server configs x loads. It may import `engines` (the adapters
render their own flags), `bench.workloads` (a plan checks its workloads load), `spec`, `records`, `inputs` and
`errors`; no I/O beyond reading the files it is given. See docs/architecture.md.
"""
