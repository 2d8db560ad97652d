"""How many compute threads: physical cores under the affinity mask, capped by a cgroup quota."""
import pytest

from bertforge.engine.threads import (cgroup_cpu_quota, physical_cores, requested_threads, usable_threads,
                                      use_threads)


def fake_sysfs(root, cores_of_cpus):
    """/sys/devices/system/cpu with cpuN/topology/{core_id, physical_package_id}."""
    for cpu, core in enumerate(cores_of_cpus):
        topology = root / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "core_id").write_text(f"{core}\n")
        (topology / "physical_package_id").write_text("0\n")
    return root


def test_hyperthreads_count_once(tmp_path):
    sysfs = fake_sysfs(tmp_path / "cpu", [0, 1, 0, 1])  # 4 logical CPUs on 2 cores
    assert physical_cores({0, 1, 2, 3}, sysfs) == 2
    assert physical_cores({0, 2}, sysfs) == 1  # the affinity mask holds two siblings of one core


def test_a_cgroup_quota_caps_the_threads(tmp_path):
    sysfs = fake_sysfs(tmp_path / "cpu", [0, 1, 2, 3])
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "cpu.max").write_text("150000 100000\n")  # docker --cpus 1.5
    assert cgroup_cpu_quota(cgroup) == 1.5
    assert usable_threads({0, 1, 2, 3}, sysfs, cgroup) == 2
    (cgroup / "cpu.max").write_text("max 100000\n")
    assert usable_threads({0, 1, 2, 3}, sysfs, cgroup) == 4
    assert usable_threads({3}, sysfs, cgroup) == 1


def test_the_quota_of_the_processs_own_cgroup_and_its_parents_counts(tmp_path):
    """A process in a cgroup of its own on a host (systemd's CPUQuota=, a scheduler's job), not only a container's
    root: the smallest quota from its cgroup up."""
    membership = tmp_path / "self-cgroup"
    membership.write_text("2:cpuacct:/\n1:cpu,cpuacct:/jobs/a\n0::/jobs/a\nnot a cgroup line\n")
    v1 = tmp_path / "cgroup" / "cpu,cpuacct" / "jobs"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("250000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(tmp_path / "cgroup", membership) == 2.5  # the parent's, in v1's files
    v2 = tmp_path / "cgroup" / "jobs" / "a"
    v2.mkdir(parents=True)
    (v2 / "cpu.max").write_text("100000 100000\n")
    assert cgroup_cpu_quota(tmp_path / "cgroup", membership) == 1.0  # its own, smaller
    assert cgroup_cpu_quota(tmp_path / "cgroup", tmp_path / "no-such-file") is None  # only the root is looked at


def test_without_topology_files_the_logical_cpus_count(tmp_path):
    assert physical_cores({0, 1, 5}, tmp_path) == 3
    assert usable_threads(set(), tmp_path, tmp_path) == 1


def test_omp_num_threads_is_the_users_choice():
    assert requested_threads({"OMP_NUM_THREADS": "3"}) == 3
    assert requested_threads({"OMP_NUM_THREADS": "0"}) is None and requested_threads({}) is None
    assert requested_threads({"OMP_NUM_THREADS": "many"}) is None


@pytest.mark.parametrize("command", ["embed", "index build", "info"])
def test_long_commands_run_on_the_threads_asked_for(command, minilm_dir, tmp_path):
    import torch

    from bertforge.cli.parser import main

    texts = tmp_path / "texts.txt"
    texts.write_text("a ship of the navy\nthe bank raised rates\n", encoding="utf-8")
    arguments = {"embed": ["embed", str(texts), str(tmp_path / "vectors.npy")],
                 "index build": ["index", "build", str(texts), "--output", str(tmp_path / "index")],
                 "info": ["info"]}[command]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert main(arguments + ["--model", str(minilm_dir), "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_every_command_but_serve_takes_threads_and_serve_has_its_own():
    from bertforge.cli.parser import build_parser

    def leaves(parser, path=()):
        for name, child in parser.commands.items():
            yield from leaves(child, (*path, name)) if child.commands else [((*path, name), child)]

    commands = dict(leaves(build_parser()))
    assert len(commands) > 20
    assert [name for name, parser in commands.items() if not parser.takes_threads] == [("serve",)]
    assert all(any(action.dest == "threads" for action in parser._actions) for parser in commands.values())


def test_without_threads_torch_runs_on_the_usable_cores_not_the_machines_logical_cpus(monkeypatch):
    import torch

    monkeypatch.setattr("bertforge.engine.threads.usable_threads", lambda: 1)
    torch.set_num_threads(3)  # torch's own default: every logical CPU
    environ = {}
    use_threads(None, environ)
    assert torch.get_num_threads() == 1 and environ == {}
    torch.set_num_threads(3)
    use_threads(None, {"OMP_NUM_THREADS": "3"})  # the user's count stays
    assert torch.get_num_threads() == 3
    use_threads(2, environ)
    assert torch.get_num_threads() == 2 and environ == {"RAYON_NUM_THREADS": "2"}  # the tokenizers' pool too


def test_a_command_that_has_not_loaded_torch_gives_it_the_count_as_it_starts():
    import subprocess
    import sys

    code = ("import os\nfrom bertforge.engine.threads import use_threads\nos.environ.pop('OMP_NUM_THREADS', None)\n"
            "use_threads(1)\nimport torch\nprint(torch.get_num_threads())")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert ran.stdout.strip() == "1", ran.stderr
