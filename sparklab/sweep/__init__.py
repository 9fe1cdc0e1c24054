"""sweep: a sweep file run to the end: servers one after another (or spread over Docker hosts by `fleet`), their
cells, every outcome in one SQLite store (`store`, `rundir`), what a resumed run must still match (`provenance`)
and when a load has been measured enough (`repeats`).

It may import `runtimes`, `host`, `recipes`, `bench`, `engines` and below; never `tune`, `report` or `cli`. See
docs/architecture.md.
"""
