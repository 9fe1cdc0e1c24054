"""One server across two hosts: how hosts name their side of the link, how a `nodes: 2` recipe renders each node
(vLLM with Ray, SGLang --nnodes), and what is refused, each error naming the file, the key and the fix."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from sparklab.errors import RecipeError
from sparklab.recipes.hosts import parse_hosts
from sparklab.recipes.multinode import head_options, render_cluster
from sparklab.recipes.render import LaunchOptions, docker_command, render
from sparklab.recipes.schema import load_recipe
from sparklab.spec import API_KEY_PLACEHOLDER

PAIR = Path(__file__).resolve().parents[2] / "recipes" / "gb10-pair.yaml"
LINK = ["local,cluster_address=192.168.100.10,interface=enp1s0f1np1,ib_hca=rocep1s0f1",
        "ssh://me@spark-2,cluster_address=192.168.100.11,interface=enP2p1s0f1np1,ib_hca=roceP2p1s0f1"]


def test_a_host_on_the_command_line_names_its_side_of_the_link() -> None:
    head, other = parse_hosts(LINK, "--host")
    assert (head.name, head.cluster_address, head.interface, head.ib_hca) == \
        ("local", "192.168.100.10", "enp1s0f1np1", "rocep1s0f1")
    assert (other.name, other.address, other.cluster_address) == ("spark-2", "spark-2", "192.168.100.11")


@pytest.mark.parametrize(("text", "says"), [
    ("ssh://me@spark-2,interface", "'interface' in 'ssh://me@spark-2,interface' is not KEY=VALUE"),
    ("ssh://me@spark-2,colour=red", "is not KEY=VALUE with a key of cluster_address"),
    ("ssh://me@spark-2,interface=eth0 rm", "interface: String should match pattern"),
])
def test_bad_link_fields_are_errors_naming_the_entry(text: str, says: str) -> None:
    with pytest.raises(RecipeError) as caught:
        parse_hosts([text], "--host")
    assert caught.value.message.startswith("--host: hosts[0]") and says in caught.value.message


def test_vllm_head_starts_ray_then_serves_and_the_worker_joins_it_each_with_its_own_interface() -> None:
    recipe = load_recipe(PAIR)
    cluster = render_cluster(recipe, "vllm", "none", LaunchOptions(), parse_hosts(LINK, "--host"))
    head, worker = cluster.nodes
    script = "ray start --head --port=6379 --node-ip-address=192.168.100.10 && exec \"$0\" \"$@\""
    assert head.entrypoint == ("bash", "-c", script, "vllm")
    assert head.argv == render(recipe, "vllm", "none").argv  # the serve command itself is the recipe's
    assert head.argv[:1] == ("serve",) and "--distributed-executor-backend" in head.argv
    assert head.argv[head.argv.index("--tensor-parallel-size") + 1] == "2"
    assert worker.entrypoint == ("ray",)
    assert worker.argv == ("start", "--address=192.168.100.10:6379", "--node-ip-address=192.168.100.11", "--block")
    # the playbook's environment, per node: each Spark names its own interface and RDMA device
    assert head.env["NCCL_SOCKET_IFNAME"] == head.env["GLOO_SOCKET_IFNAME"] == "enp1s0f1np1"
    assert worker.env["UCX_NET_DEVICES"] == worker.env["TP_SOCKET_IFNAME"] == "enP2p1s0f1np1"
    assert (head.env["NCCL_IB_HCA"], worker.env["NCCL_IB_HCA"]) == ("rocep1s0f1", "roceP2p1s0f1")
    assert head.env["VLLM_HOST_IP"] == "192.168.100.10" and worker.env["VLLM_HOST_IP"] == "192.168.100.11"
    assert head.env["MASTER_ADDR"] == worker.env["MASTER_ADDR"] == "192.168.100.10"
    assert head.network == worker.network == "host"
    assert worker.name == f"{head.name}-node1" and worker.labels["sparklab.cluster"] == head.name
    assert (head.labels["sparklab.node_rank"], worker.labels["sparklab.node_rank"]) == ("0", "1")
    # the Ray worker serves nothing: it does not get the API key
    assert head.needs_api_key and "VLLM_API_KEY" in head.secret_env
    assert not worker.needs_api_key and "VLLM_API_KEY" not in worker.secret_env


def test_sglang_ranks_get_nnodes_their_rank_and_the_heads_dist_init_addr() -> None:
    cluster = render_cluster(load_recipe(PAIR), "sglang", "dspark", LaunchOptions(), parse_hosts(LINK, "--host"))
    for rank, node in enumerate(cluster.nodes):
        assert node.entrypoint == ("python3",) and node.argv[:2] == ("-m", "sglang.launch_server")
        assert node.argv[-6:] == ("--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", "192.168.100.10:20000")
        assert node.argv[node.argv.index("--tp-size") + 1] == "2"
        assert API_KEY_PLACEHOLDER in node.argv  # SGLang's rank 1 reads the same flags
    assert cluster.nodes[1].env["NCCL_SOCKET_IFNAME"] == "enP2p1s0f1np1"


def test_the_printed_commands_paste_on_each_host_from_here() -> None:
    hosts = parse_hosts(LINK, "--host")
    cluster = render_cluster(load_recipe(PAIR), "vllm", "none", head_options(LaunchOptions(), hosts[0]), hosts)
    head = docker_command(cluster.nodes[0], docker_host=None)
    worker = docker_command(cluster.nodes[1], docker_host="ssh://me@spark-2")
    assert head.startswith("docker run ") and worker.startswith("docker -H ssh://me@spark-2 run ")
    words = shlex.split(head.replace("\\\n", " "))
    at = words.index("bash")
    assert words[at + 2:at + 6] == ["-c", "ray start --head --port=6379 --node-ip-address=192.168.100.10 && exec "
                                    '"$0" "$@"', "vllm", "serve"]


@pytest.mark.parametrize(("hosts", "says", "fix"), [
    (LINK[:1], "nodes: 2 needs 2 Docker hosts, 1 given", "--host local --host ssh://me@spark-2"),
    (["local,interface=lo,ib_hca=x", LINK[1]], "needs each host's cluster_address; host local has none",
     "cluster_address: 192.168.100.11"),
    ([LINK[0], "ssh://me@spark-2,cluster_address=10.0.0.2,interface=eth1"], "needs each host's ib_hca; host spark-2",
     "ib_hca: rocep1s0f0"),
])
def test_missing_hosts_or_link_fields_are_errors_saying_what_to_add(hosts: list[str], says: str, fix: str) -> None:
    with pytest.raises(RecipeError) as caught:
        render_cluster(load_recipe(PAIR), "vllm", "none", LaunchOptions(), parse_hosts(hosts, "--host"))
    assert "gb10-pair.yaml: engines.vllm" in caught.value.message and says in caught.value.message
    assert fix in (caught.value.hint or "")


@pytest.mark.parametrize(("change", "says"), [
    ("engines.vllm.cluster_port=null", "nodes > 1 needs cluster_port"),
    ("engines.vllm.network=bridge", "runs containers on the host network"),
    ("engines.vllm.nodes=9", "less than or equal to 8"),
])
def test_a_multinode_recipe_must_say_how_the_nodes_meet(change: str, says: str) -> None:
    with pytest.raises(RecipeError) as caught:
        load_recipe(PAIR, [change])
    assert "gb10-pair.yaml" in caught.value.message and says in caught.value.message


@pytest.mark.parametrize("backend", ["mp", "rayy"])
def test_a_vllm_server_across_hosts_must_use_ray_which_vllms_parser_does_not_check(backend: str) -> None:
    recipe = load_recipe(PAIR)
    args = list(recipe.engines["vllm"].args)
    args[args.index("--distributed-executor-backend") + 1] = backend
    engines = {**recipe.engines, "vllm": recipe.engines["vllm"].model_copy(update={"args": args})}
    with pytest.raises(RecipeError) as caught:
        render_cluster(recipe.model_copy(update={"engines": engines}), "vllm", "none", LaunchOptions(),
                       parse_hosts(LINK, "--host"))
    assert "gb10-pair.yaml: engines.vllm: a vLLM server across hosts runs its workers through Ray" \
        in caught.value.message and "--distributed-executor-backend, ray" in (caught.value.hint or "")


def test_a_one_host_recipe_is_not_spread_over_two() -> None:
    with pytest.raises(RecipeError, match="serves from one host, yet 2 hosts were given"):
        render_cluster(load_recipe(PAIR.with_name("gb10.yaml")), "vllm", "none", LaunchOptions(),
                       parse_hosts(LINK, "--host"))


def test_an_engine_without_a_multinode_mode_is_refused_across_hosts() -> None:
    with pytest.raises(RecipeError) as caught:
        load_recipe(PAIR, ["engines.vllm.kind=llamacpp"])
    assert caught.value.message == ("recipes/gb10-pair.yaml: engines.vllm: Value error, nodes: 2 needs an engine "
                                    "with a multi-node mode (vllm, sglang), not llamacpp")


def test_a_third_multinode_engine_is_one_adapter_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which engines run across hosts is their adapters' `multinode` flag: the recipe schema lists no kinds."""
    from sparklab import engines
    from sparklab.engines.base import Engine

    class Distributed(Engine):
        kind = "distributed"
        multinode = True

    monkeypatch.setitem(engines.ENGINES, "distributed", Distributed())
    assert load_recipe(PAIR, ["engines.vllm.kind=distributed"]).engines["vllm"].nodes == 2
    monkeypatch.setattr(Distributed, "multinode", False)
    with pytest.raises(RecipeError, match=r"multi-node mode \(vllm, sglang\), not distributed"):
        load_recipe(PAIR, ["engines.vllm.kind=distributed"])


def test_the_multinode_flag_says_what_node_command_does() -> None:
    from sparklab.engines import ENGINES

    for adapter in ENGINES.values():
        try:
            adapter.node_command(["serve"], ["--distributed-executor-backend", "ray"], 1, 2, "10.0.0.1", 6379,
                                 "10.0.0.2")
        except NotImplementedError:
            assert not adapter.multinode, adapter.kind
        else:
            assert adapter.multinode, adapter.kind


@pytest.mark.parametrize("command", ["up", "render"])
def test_a_pair_recipe_without_hosts_says_it_needs_them_before_any_other_check(
        command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23: `up gb10-pair --dry-run` without hosts reported this machine's port and memory instead."""
    import socket

    from sparklab.cli.main import main

    with socket.socket() as taken:  # this machine's port taken, its cache missing, its memory short: all beside
        taken.bind(("127.0.0.1", 0))  # the point, since the server would run on two other hosts
        taken.listen()
        port = taken.getsockname()[1]
        extra = ["--dry-run"] if command == "up" else ["--host-checks"]
        code = main([command, "gb10-pair", *extra, "--port", str(port), "--hf-cache", str(tmp_path / "missing"),
                     "--set", "gpu_memory_utilization=0.99"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "gb10-pair.yaml: engines.vllm: nodes: 2 needs 2 Docker hosts, 0 given" in err
    assert "--host local --host ssh://me@spark-2" in err
    assert "preflight" not in err and "port" not in err.split("needs 2")[0] and "MemFree" not in err


def test_a_sweep_of_a_pair_recipe_without_hosts_says_so_before_planning_a_download(tmp_path: Path) -> None:
    import yaml

    from sparklab.sweep import runner

    path = tmp_path / "pair.yaml"
    path.write_text(yaml.safe_dump({"name": "pair", "recipe": str(PAIR), "methods": ["none"], "concurrency": [1]}))
    with pytest.raises(RecipeError, match="nodes: 2 needs 2 Docker hosts, 0 given"):
        runner.dry_run(runner.Request(path, tmp_path / "runs"))
    with pytest.raises(RecipeError, match="nodes: 2 needs 2 Docker hosts, 0 given"):
        runner.sweep(runner.Request(path, tmp_path / "runs", download=True), say=lambda m: None)
    assert not (tmp_path / "runs").exists()  # no run directory, no store, no download
