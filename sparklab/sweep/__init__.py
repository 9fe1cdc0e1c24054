"""sweep: a sweep file run to the end (`runner`): servers spread over its hosts by one loop (`fleet`; this machine
alone is a fleet of one), every pending server's command through its image's own parser before the first start
(`parsecheck`), one server's start, cells and faults (`serverrun`), every outcome in one SQLite store
(`store`, seen by each host through `hoststore`; `rundir`), what a resumed run must still match (`provenance`)
and when a load has been measured enough (`repeats`).

It may import `runtimes`, `host`, `recipes`, `bench`, `engines` and below; never `tune`, `report` or `cli`. See
docs/architecture.md.
"""
