"""runtimes: where servers run and how they start, live and end, behind one contract (`base`: the Server and
Runtime Protocols and the Lifecycle every server shares): Docker containers (`containers`, the one door to docker,
with the parts only it imports: `docker_transport`, `docker_images`, `container_server`), host processes
(`processes` with their run files and keeper), a server across hosts (`cluster`), both local kinds together
(`local`), the start of one server up to ready (`launch`, `health`), the image's own argument parser on the exact
command before any start (`imagecheck`, through each runtime's `probe`) and images and checkpoints fetched before
any clock (`pull`).

It may import `host`, `recipes`, `engines`, `spec` and below; never `bench`, `sweep`, `tune`, `report` or `cli`.
See docs/architecture.md.
"""
